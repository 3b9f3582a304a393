"""The Armada API server: gRPC API (submit, queues, events), REST gateway and /health."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.config import SCHEDULER, SERVER, SERVER_PORTS, postgres_env, redis_env, server_config
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import SCHEDULER_CLIENT, ServiceSpec, config_args
from components.k8s import selector_labels
from components.network import pods

SCHEDULER_CALLERS = (pods(selector_labels(SCHEDULER)),)
"""The scheduler calls the server's gRPC API (its `armadaApi`)."""


def server_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.server
    return ServiceSpec(
        name=SERVER,
        image=args.image,
        args=config_args(),
        config=server_config(args.config, args.endpoints),
        ports=SERVER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=[*postgres_env(args.endpoints), *redis_env("eventsApiRedis", args.endpoints)],
        health=True,
        credentials=args.credentials,
        trust=args.endpoints.scheduler_ca,  # the scheduler serves TLS with armada.workers
        pod_labels=SCHEDULER_CLIENT,  # reports scheduling to the scheduler
        # The user-facing API (armadactl, browsers, queue management), reached through a
        # port-forward (no rule needed) or the Ingress / LoadBalancer sources of
        # `platform.armada.userAccess`, plus the scheduler on the gRPC API.
        callers={"grpc": (*args.config.user_access.peers(), *SCHEDULER_CALLERS), "http": args.config.user_access.peers()},
    )


class Server(ArmadaService):
    """Outputs: `service_name`. Start it after the lookout migration (G3) via `start_after`."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Server", name, opts)
        self._deploy(name, server_spec(args), args.endpoints, start_after=args.start_after)
        self.register_outputs({"service_name": self.service_name})
