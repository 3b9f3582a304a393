"""How a test stack builds its entity images, when nobody chose it: an Armada stack whose registry is
not managed (or that has workers, or no build queues) builds locally with a Docker engine, by
default. That is said (a notice naming the key that decided it), not left to a missing Docker engine
at deploy time; `platform.builds.mode: local` written in the file says it was meant."""
from __future__ import annotations

from cloudstation_tools.check.findings import NOTICE, Finding, keyed, show
from cloudstation_tools.check.stacks import Stack
from infra.config import PROJECT, Environment


def local_by_default(stack: Stack) -> list[Finding]:
    platform = stack.config.platform
    mode, key, why = platform.build_mode_why
    if stack.config.environment is not Environment.TEST or mode != "local" or key in ("builds.mode", "armada.enabled"):
        return []
    value = platform
    for part in key.split("."):
        value = getattr(value, {"queueApi": "queue_api", "projectQueue": "project_queue"}.get(part, part))
    return [keyed(NOTICE, stack.file, stack.lines, f"{PROJECT}:platform.{key}", show(value),
                  f"entity images are built on the machine running `pulumi up`, with its Docker engine ({why}); "
                  "write platform.builds.mode: local to say that is meant, or see docs/builds.md for in-cluster builds",
                  "builds")]
