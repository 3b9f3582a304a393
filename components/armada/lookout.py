"""Lookout: the web UI and its REST API over the lookout database; migrates it and prunes it."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import LOOKOUT, LOOKOUT_PORTS, lookout_config, postgres_env
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import ServiceSpec, TaskSpec, config_args


def lookout_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.lookout
    return ServiceSpec(
        name=LOOKOUT,
        image=args.image,
        args=config_args(),
        config=lookout_config(args.config, args.endpoints),
        ports=LOOKOUT_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=postgres_env(args.endpoints),
        health=True,
        callers={"http": args.config.user_access.peers()},  # the UI and its REST API, for users' browsers
    )


def migration_task(args: ArmadaArgs) -> TaskSpec:
    # The server needs these tables too (queues, deduplication, retry policies; G3).
    return TaskSpec(
        name=f"{LOOKOUT}-migration", args=config_args("--migrateDatabase"), resources=args.config.job_resources
    )


def pruner_task(args: ArmadaArgs) -> Optional[tuple[TaskSpec, str]]:
    pruning = args.config.lookout.pruning
    if not pruning.enabled:
        return None
    # Retention and batch size come from the config's `prunerConfig` (override with `extra`).
    task = TaskSpec(
        name=f"{LOOKOUT}-pruner",
        args=config_args("--pruneDatabase"),
        resources=args.config.job_resources,
        backoff_limit=1,
        deadline_seconds=2 * 3600,
    )
    return task, pruning.schedule


class Lookout(ArmadaService):
    """Outputs: `service_name`; attribute `migration` (the lookout-database migration Job, which
    the server, the lookout ingester and Lookout itself wait for)."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Lookout", name, opts)
        self._deploy(
            name,
            lookout_spec(args),
            args.endpoints,
            migration=migration_task(args),
            pruner=pruner_task(args),
            start_after=args.start_after,
        )
        self.register_outputs({"service_name": self.service_name})
