"""The event ingester: Pulsar job-set events into Redis, where the server's events API reads them."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import EVENT_INGESTER, EVENT_INGESTER_PORTS, event_ingester_config, redis_env
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import ServiceSpec, config_args


def event_ingester_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.event_ingester
    return ServiceSpec(
        name=EVENT_INGESTER,
        image=args.image,
        args=config_args(),
        config=event_ingester_config(args.config, args.endpoints),
        ports=EVENT_INGESTER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=redis_env("redis", args.endpoints),
        metrics_probe=True,  # no health endpoint (NOTES §1): probed on /metrics (workload.container)
        service=False,  # metrics only, scraped by pod
    )


class EventIngester(ArmadaService):
    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:EventIngester", name, opts)
        self._deploy(name, event_ingester_spec(args), args.endpoints, start_after=args.start_after)
        self.register_outputs({})
