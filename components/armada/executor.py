"""An Armada executor: leases jobs from the scheduler and runs them as pods in its cluster.

It runs in the stack's cluster (the Kubernetes provider of the stack); each entry of
`executors` is one executor with its own cluster id and pool."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi

from components.armada.cluster import EXECUTOR_CLUSTER_ROLE, EXECUTOR_JOBS_ROLE
from components.armada.config import EXECUTOR_PORTS, executor_config, executor_name
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.settings import ExecutorSettings
from components.armada.workload import SCHEDULER_CLIENT, ServiceSpec, config_args


@dataclass(frozen=True)
class ExecutorArgs(ArmadaArgs):
    executor: Optional[ExecutorSettings] = None
    """Required: which executor of `config.executors` this is."""


def executor_spec(args: ExecutorArgs) -> ServiceSpec:
    settings = args.executor
    return ServiceSpec(
        name=executor_name(settings),
        image=args.image,
        args=config_args(),
        config=executor_config(args.config, settings, args.endpoints),
        ports=EXECUTOR_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        health=True,
        credentials=args.credentials,
        api_access=True,  # it creates and watches job pods
        termination_grace_seconds=5,  # as upstream Helm
        # Its cluster id is its identity at the scheduler (v0.22.7 internal/scheduler/api.go,
        # LeaseJobRuns: StoreExecutor and FetchJobRunLeases by ExecutorId); two pods with one id
        # would both be leased the same new runs and both try to start them.
        single_writer=True,
        pod_labels=SCHEDULER_CLIENT,  # leases jobs from the scheduler
    )


class Executor(ArmadaService):
    """Outputs: `service_name`. A ClusterRoleBinding grants the executor's cluster-wide reads,
    RoleBindings in the job namespaces its writes (components/armada/cluster.py)."""

    def __init__(self, name: str, args: ExecutorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Executor", name, opts)
        spec = executor_spec(args)
        self._bind_cluster_role(name, EXECUTOR_CLUSTER_ROLE, spec, args.endpoints.namespace)
        self._bind_in_job_namespaces(name, EXECUTOR_JOBS_ROLE, spec, args)
        self._deploy(name, spec, args.endpoints, start_after=args.start_after)
        self.register_outputs({"service_name": self.service_name})
