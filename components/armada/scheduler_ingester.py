"""The scheduler ingester: Pulsar events and control-plane messages into the scheduler database."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import (
    SCHEDULER_INGESTER,
    SCHEDULER_INGESTER_PORTS,
    postgres_env,
    scheduler_ingester_config,
)
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import ServiceSpec, config_args


def scheduler_ingester_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.scheduler_ingester
    return ServiceSpec(
        name=SCHEDULER_INGESTER,
        image=args.image,
        args=config_args(),
        config=scheduler_ingester_config(args.config, args.endpoints),
        ports=SCHEDULER_INGESTER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=postgres_env(args.endpoints),
        # No health endpoint (NOTES §1): probed on /metrics (workload.container), and no Service
        # (metrics are scraped by pod).
        metrics_probe=True,
        service=False,
    )


class SchedulerIngester(ArmadaService):
    """Start it after the scheduler migration via `start_after`."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:SchedulerIngester", name, opts)
        self._deploy(name, scheduler_ingester_spec(args), args.endpoints, start_after=args.start_after)
        self.register_outputs({})
