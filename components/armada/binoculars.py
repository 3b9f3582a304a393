"""Binoculars (optional): job logs and node cordoning for Lookout."""
from __future__ import annotations

from typing import Optional

import pulumi

from components.armada.cluster import BINOCULARS_JOBS_ROLE
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
        credentials=args.credentials,
        api_access=True,  # reads job pods' logs (it may not cordon nodes)
        callers={"grpc": args.config.user_access.peers(), "http": args.config.user_access.peers()},  # users' browsers (from Lookout)
    )


class Binoculars(ArmadaService):
    """Outputs: `service_name`."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Binoculars", name, opts)
        spec = binoculars_spec(args)
        # Job logs in the job namespaces, nothing cluster-wide (components/armada/cluster.py).
        self._bind_in_job_namespaces(name, BINOCULARS_JOBS_ROLE, spec, args)
        self._deploy(name, spec, args.endpoints, start_after=args.start_after)
        self.register_outputs({"service_name": self.service_name})
