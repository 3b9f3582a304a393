"""An Armada worker stack (`platform.armada.mode: executor-only`) checked against its main stack's
file, when `remoteScheduler.mainStack` names one beside it: what the two stacks must agree on for
the worker's executor to get jobs at all. Each mismatch fails silently at run time otherwise: a
user the scheduler does not know is refused every lease, a pool it does not schedule never gets a
job (G5, armada#4185), a host the certificate does not name fails every TLS handshake, and a job pod
naming a PriorityClass the worker cluster lacks is refused by its API server."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from infra.cluster_sharing import _raw

if TYPE_CHECKING:
    from infra.config import StackConfig

PROJECT = "cloudstation"
ARMADA = f"{PROJECT}:platform.armada"
MAIN_KEY = f"{ARMADA}.remoteScheduler.mainStack"


def mismatches(worker: "StackConfig", main: "StackConfig", main_file: str) -> list[str]:
    """What the worker stack's config says differently from its main stack's (`main_file` names it)."""
    armada, main_armada = worker.platform.armada, main.platform.armada
    if not main_armada.enabled or main_armada.mode != "full" or not main_armada.workers:
        return [f"{MAIN_KEY}: {main_file} runs no scheduler for workers (it needs platform.armada.enabled, mode "
                "full, workers and executorApi); name the main stack"]
    [executor] = armada.executors
    declared = {w.name: w for w in main_armada.workers}
    entry = declared.get(executor.name)
    if entry is None:
        return [f"{ARMADA}.executors[0].name: {executor.name!r} — {main_file} declares no such worker in "
                f"platform.armada.workers (declared: {', '.join(declared)}), so its scheduler has no user "
                f"cloudstation-executor-{executor.name}; add it there or use a declared name"]
    found = []
    if executor.pool != entry.pool:
        found.append(f"{ARMADA}.executors[0].pool: {executor.pool!r} — {main_file} declares pool {entry.pool!r} for "
                     f"worker {entry.name!r}; its scheduler schedules only its declared pools (G5)")
    own_id = executor.cluster_id or executor.name
    if own_id != entry.id:
        found.append(f"{ARMADA}.executors[0].clusterId: {own_id!r} — {main_file} declares cluster id {entry.id!r} for "
                     f"worker {entry.name!r}; use the same id")
    api, remote = main_armada.executor_api, armada.remote_scheduler
    if remote.host != api.host:
        found.append(f"{ARMADA}.remoteScheduler.address: {remote.address!r} — {main_file} exposes its scheduler as "
                     f"executorApi.host {api.host!r}, the name its certificate is for; TLS to another name fails")
    if api.service_type == "LoadBalancer" and remote.port != api.port:
        found.append(f"{ARMADA}.remoteScheduler.address: {remote.address!r} — {main_file}'s LoadBalancer listens on "
                     f"port {api.port} (executorApi.port)")
    ours = {name: c.priority for name, c in armada.priority_classes.items()}
    theirs = {name: c.priority for name, c in main_armada.priority_classes.items()}
    if ours != theirs:
        found.append(f"{ARMADA}.priorityClasses: {json.dumps(ours, sort_keys=True)} — differs from {main_file}'s "
                     f"{json.dumps(theirs, sort_keys=True)}: job pods name the main scheduler's classes, which this "
                     "cluster must have with the same values")
    return found


def problems(config: "StackConfig", root: Path) -> list[str]:
    """The worker stack `config` against `Pulumi.<mainStack>.yaml` in `root` (none to check otherwise)."""
    from infra.config import ConfigError, load

    armada = config.platform.armada
    remote = armada.remote_scheduler
    if not armada.enabled or armada.mode != "executor-only" or remote is None or remote.main_stack is None:
        return []
    path = root / f"Pulumi.{remote.main_stack}.yaml"
    if not path.is_file():
        return [f"{MAIN_KEY}: {remote.main_stack!r} — no stack file {path.name} in {root}; name the main stack "
                "(the one with platform.armada.workers), or remove mainStack when its file is elsewhere"]
    values = {f"{PROJECT}:{k}": json.dumps(v) for k, v in _raw(path).items()}
    try:
        main = load(values, source=path.name, require_images=False)
    except ConfigError as error:
        return [f"{MAIN_KEY}: {remote.main_stack!r} — {path.name} has problems of its own; fix them first:",
                *[f"  {p}" for p in error.problems]]
    return mismatches(config, main, path.name)
