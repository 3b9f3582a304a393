"""The areas of the platform, deployed in this order by `infra.program.main`: the platform
namespace and registry first, then Armada (its builds namespace needs the registry's credentials),
then the entity images and environments (their builds need Armada's queues and executors); each
hands the next what it needs through `StackContext.shared` (infra/builds.py)."""
from infra import armada, cloudstation

AREAS = [cloudstation.deploy_platform, armada.deploy, cloudstation.deploy]
