"""Binoculars (optional): job logs and node cordoning for Lookout."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.cluster import BINOCULARS_CLUSTER_ROLE
from components.armada.config import BINOCULARS, BINOCULARS_PORTS, binoculars_config
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import ServiceSpec, config_args


def binoculars_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.binoculars
    return ServiceSpec(
        name=BINOCULARS,
        image=args.image,
        args=config_args(),
        config=binoculars_config(args.config, args.endpoints),
        ports=BINOCULARS_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        health=True,
        api_access=True,  # reads pod logs, cordons nodes
        callers={"grpc": None, "http": None},  # called by users' browsers (from Lookout)
    )


class Binoculars(ArmadaService):
    """Outputs: `service_name`."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Binoculars", name, opts)
        spec = binoculars_spec(args)
        self._bind_cluster_role(name, BINOCULARS_CLUSTER_ROLE, spec, args.endpoints.namespace)
        self._deploy(name, spec, args.endpoints, start_after=args.start_after)
        self.register_outputs({"service_name": self.service_name})
