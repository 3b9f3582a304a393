"""The areas of the platform, deployed in this order by `infra.program.main`."""
from infra import armada, cloudstation

AREAS = [cloudstation.deploy, armada.deploy]
