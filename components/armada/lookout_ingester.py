"""The lookout ingester: Pulsar job-set events into the lookout database."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import LOOKOUT_INGESTER, LOOKOUT_INGESTER_PORTS, lookout_ingester_config, postgres_env
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import ServiceSpec, config_args


def lookout_ingester_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.lookout_ingester
    return ServiceSpec(
        name=LOOKOUT_INGESTER,
        image=args.image,
        args=config_args(),
        config=lookout_ingester_config(args.config, args.endpoints),
        ports=LOOKOUT_INGESTER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=postgres_env(args.endpoints),
        metrics_probe=True,  # no health endpoint (NOTES §1): probed on /metrics (workload.container)
        service=False,  # metrics only, scraped by pod
    )


class LookoutIngester(ArmadaService):
    """Start it after the lookout migration via `start_after`."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:LookoutIngester", name, opts)
        self._deploy(name, lookout_ingester_spec(args), args.endpoints, start_after=args.start_after)
        self.register_outputs({})
