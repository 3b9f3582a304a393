"""The Armada scheduler: migrates its database first, then schedules; prunes on a schedule."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import SCHEDULER, SCHEDULER_PORTS, postgres_env, scheduler_config
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import SCHEDULER_CLIENTS, ServiceSpec, TaskSpec, config_args
from components.network import any_source


def scheduler_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.scheduler
    return ServiceSpec(
        name=SCHEDULER,
        image=args.image,
        args=config_args("run"),
        config=scheduler_config(args.config, args.endpoints),
        ports=SCHEDULER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=postgres_env(args.endpoints),
        health=True,
        credentials=args.credentials,
        # leader.mode standalone: every scheduler process considers itself the leader
        # (v0.22.7 internal/leaderelection/leader.go, StandaloneLeaderController), so two during
        # a rollout would both schedule and lease the same jobs.
        single_writer=True,
        callers={"grpc": SCHEDULER_CLIENTS if settings.restrict_grpc else tuple(any_source())},
    )


def migration_task(args: ArmadaArgs) -> TaskSpec:
    return TaskSpec(
        name=f"{SCHEDULER}-migration",
        args=config_args("migrateDatabase") + ["--timeout", "5m"],
        resources=args.config.job_resources,
    )


def pruner_task(args: ArmadaArgs) -> Optional[tuple[TaskSpec, str]]:
    pruning = args.config.scheduler.pruning
    if not pruning.enabled:
        return None
    task = TaskSpec(
        name=f"{SCHEDULER}-pruner",
        # Upstream Helm's pruner arguments (NOTES §4), expiry configurable.
        args=config_args("pruneDatabase")
        + ["--timeout", "5m", "--batchsize", "10000", "--expireAfter", args.config.scheduler.expire_after],
        resources=args.config.job_resources,
        backoff_limit=1,
    )
    return task, pruning.schedule


class Scheduler(ArmadaService):
    """Outputs: `service_name`; attribute `migration` (the scheduler-database migration Job)."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Scheduler", name, opts)
        self._deploy(
            name,
            scheduler_spec(args),
            args.endpoints,
            migration=migration_task(args),
            pruner=pruner_task(args),
            start_after=args.start_after,
        )
        self.register_outputs({"service_name": self.service_name})
