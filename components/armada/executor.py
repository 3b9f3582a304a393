"""An Armada executor: leases jobs from the scheduler and runs them as pods in its cluster.

It runs in the stack's cluster (the Kubernetes provider of the stack); each entry of
`executors` is one executor with its own cluster id and pool. In an executor-only stack (a
worker cluster, `armada.mode: executor-only`) its scheduler is another stack's, reached over TLS
with the password of the secret config key `armadaExecutorPassword`."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import pulumi
import pulumi_kubernetes as k8s

from components.armada.auth import AUTH_FILE, COMPONENT, ServiceCredentials, checksum, executor_auth_file, executor_user, render
from components.armada.cluster import EXECUTOR_CLUSTER_ROLE, EXECUTOR_JOBS_ROLE
from components.armada.config import CA_FILE, EXECUTOR_PORTS, TrustedCa, executor_config, executor_name
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.settings import ExecutorSettings
from components.armada.workload import SCHEDULER_CLIENT, ServiceSpec, config_args
from components.k8s import metadata


@dataclass(frozen=True)
class ExecutorArgs(ArmadaArgs):
    executor: Optional[ExecutorSettings] = None
    """Required: which executor of `config.executors` this is."""
    remote_password: Any = None
    """An executor-only stack's: its password at the main scheduler (a secret Output); the
    component keeps it in its own credentials Secret. None: `credentials` are this stack's."""
    remote_ca_certificate: Optional[str] = None
    """An executor-only stack's PEM CA bundle of the main scheduler (`remoteScheduler.caCertificate`):
    kept in a ConfigMap and the only CA the executor trusts."""


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
        # The CA of a TLS scheduler (another cluster's, or this one's serving workers).
        trust=args.endpoints.scheduler_ca,
        api_access=True,  # it creates and watches job pods
        termination_grace_seconds=5,  # as upstream Helm
        # Its cluster id is its identity at the scheduler (v0.22.7 internal/scheduler/api.go,
        # LeaseJobRuns: StoreExecutor and FetchJobRunLeases by ExecutorId); two pods with one id
        # would both be leased the same new runs and both try to start them.
        single_writer=True,
        pod_labels=SCHEDULER_CLIENT,  # leases jobs from the scheduler
    )


def remote_auth_file(settings: ExecutorSettings, password: str) -> dict:
    """The credentials file of an executor-only stack's executor: the user the main stack's
    `armada.workers` entry generated (same name), with the password given to this stack."""
    return executor_auth_file(settings, {executor_user(settings): password})


class Executor(ArmadaService):
    """Outputs: `service_name`. A ClusterRoleBinding grants the executor's cluster-wide reads,
    RoleBindings in the job namespaces its writes (components/armada/cluster.py)."""

    def __init__(self, name: str, args: ExecutorArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Executor", name, opts)
        if args.remote_ca_certificate is not None:
            ca = k8s.core.v1.ConfigMap(
                f"{name}-scheduler-ca",
                metadata=metadata(f"{executor_name(args.executor)}-scheduler-ca", args.endpoints.namespace, COMPONENT),
                data={CA_FILE: args.remote_ca_certificate},
                opts=self.child_opts(),
            )
            args = replace(args, endpoints=replace(args.endpoints, scheduler_ca=TrustedCa(config_map=ca.metadata.name, only=True)))
        if args.remote_password is not None:
            text = pulumi.Output.secret(
                pulumi.Output.from_input(args.remote_password).apply(lambda p: render(remote_auth_file(args.executor, p)))
            )
            secret = k8s.core.v1.Secret(
                f"{name}-auth",
                metadata=metadata(f"{executor_name(args.executor)}-auth", args.endpoints.namespace, COMPONENT),
                type="Opaque",
                string_data={AUTH_FILE: text},
                opts=self.child_opts(),
            )
            args = replace(args, credentials=ServiceCredentials(secret.metadata.name, pulumi.Output.unsecret(text.apply(checksum))))
        spec = executor_spec(args)
        self._bind_cluster_role(name, EXECUTOR_CLUSTER_ROLE, spec, args.endpoints.namespace)
        self._bind_in_job_namespaces(name, EXECUTOR_JOBS_ROLE, spec, args)
        self._deploy(name, spec, args.endpoints, start_after=args.start_after)
        self.register_outputs({"service_name": self.service_name})
