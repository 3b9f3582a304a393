"""The base of every Armada service component: ServiceAccount, config ConfigMap, optional
migration Job (finished before the Deployment starts), Deployment, optional Service and
optional pruning CronJob. Each service file (server.py, scheduler.py, ...) subclasses it with
its own type token and builds its `ServiceSpec` with pure functions."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.armada.auth import ServiceCredentials
from components.armada.cluster import binding_name, cluster_role_binding, role_binding
from components.armada.config import CONFIG_FILE, Endpoints
from components.armada.settings import ArmadaConfig
from components.armada.workload import (
    COMPONENT, ServiceSpec, TaskSpec, cron_job, deployment, job, pod_disruption_budget, service, service_network_policy,
    tasks_network_policy,
)
from components.k8s import metadata
from components.component import Component


def render_config(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=True, default_flow_style=False)


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ArmadaArgs:
    """What every service component gets: the Armada settings and where things are."""

    config: ArmadaConfig
    endpoints: Endpoints
    image: str
    """The service's pinned image (infra/versions.py)."""
    start_after: Sequence[pulumi.Resource] = ()
    """Resources that must be ready first (e.g. the lookout migration before the server, G3)."""
    credentials: Optional[ServiceCredentials] = None
    """The service's credentials file (components/armada/auth.py), for those that have one."""


class ArmadaService(Component):
    """Base of the service components; subclasses call `_deploy` then `register_outputs`.

    Attributes: `service_name` (its Service's name, or None), `migration` (its migration Job, or
    None), `deployment`."""

    def __init__(self, type_: str, name: str, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(type_, name, None, opts)
        self.service_name: Optional[pulumi.Output[str]] = None
        self.migration: Optional[k8s.batch.v1.Job] = None
        self.job_bindings: dict[str, pulumi.Resource] = {}
        """Job namespace -> the RoleBinding that lets this service work there (`_bind_in_job_namespaces`)."""

    def _bind_cluster_role(self, name: str, role: str, spec: ServiceSpec, namespace: str) -> None:
        """Grants the shared ClusterRole `role` to the service's ServiceAccount in `namespace`."""
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            **cluster_role_binding(binding_name(namespace, spec.name), role, spec.name, namespace),
            opts=self.child_opts(),
        )

    def _bind_in_job_namespaces(
        self, name: str, role: str, spec: ServiceSpec, args: ArmadaArgs
    ) -> None:
        """Grants the ClusterRole `role` to the service's ServiceAccount in each job namespace
        only; after `args.start_after`, which holds the job namespaces."""
        namespace = args.endpoints.namespace
        for job_namespace in args.config.job_namespaces:
            self.job_bindings[job_namespace] = k8s.rbac.v1.RoleBinding(
                f"{name}-{job_namespace}-binding",
                **role_binding(binding_name(namespace, spec.name), job_namespace, role, spec.name, namespace),
                opts=self.child_opts(depends_on=list(args.start_after)),
            )

    def _deploy(
        self,
        name: str,
        spec: ServiceSpec,
        endpoints: Endpoints,
        migration: Optional[TaskSpec] = None,
        pruner: Optional[tuple[TaskSpec, str]] = None,
        start_after: Sequence[pulumi.Resource] = (),
        pods_need: Sequence[pulumi.Resource] = (),
    ) -> None:
        """`pods_need`: what the service's pods (not its Jobs) need before they start, e.g. the
        scheduler's Lease Role."""
        child = self.child_opts()
        self.spec = spec
        namespace = endpoints.namespace
        account = k8s.core.v1.ServiceAccount(
            f"{name}-sa",
            metadata=metadata(spec.name, namespace, COMPONENT),
            automount_service_account_token=spec.api_access,
            opts=child,
        )
        config_text = pulumi.Output.from_input(spec.config).apply(render_config)
        config_map = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=metadata(spec.name, namespace, COMPONENT),
            data={CONFIG_FILE: config_text},
            opts=child,
        )
        config_map_name = config_map.metadata.name
        # Reading the names from the objects makes Pulumi create them before the pods.
        account_name = account.metadata.name
        # The namespace denies everything else, so the pods wait for the flows they need.
        policies = [
            k8s.networking.v1.NetworkPolicy(
                f"{name}-network-policy", **service_network_policy(spec, endpoints), opts=child
            )
        ]
        tasks = [task.name for task in (migration, pruner[0] if pruner else None) if task is not None]
        if tasks:
            policies.append(
                k8s.networking.v1.NetworkPolicy(
                    f"{name}-tasks-network-policy", **tasks_network_policy(spec, tasks, endpoints), opts=child
                )
            )

        if migration is not None:
            # pulumi-kubernetes waits for a Job to complete, so whatever depends on it starts after.
            self.migration = k8s.batch.v1.Job(
                f"{name}-migration",
                **job(migration, spec, namespace, config_map_name, account_name),
                opts=self.child_opts(depends_on=[*start_after, *policies]),
            )

        waits = [self.migration] if self.migration is not None else list(start_after)
        self.deployment = k8s.apps.v1.Deployment(
            f"{name}-deploy",
            **deployment(spec, namespace, config_map_name, config_text.apply(checksum), account_name),
            opts=self.child_opts(depends_on=[*waits, *policies, *pods_need]),
        )
        budget = pod_disruption_budget(spec, namespace)
        if budget is not None:
            # Nothing awaits it, and a change updates it in place: pulumi-kubernetes v4.34.2 has no
            # awaiter for policy/v1 PodDisruptionBudget (provider/pkg/await/awaiters.go) and forces
            # a replacement only for policy/v1beta1's spec (provider/pkg/provider/diff.go forceNew;
            # cloudstation_tools/engine.py FORCE_NEW).
            k8s.policy.v1.PodDisruptionBudget(f"{name}-pdb", **budget, opts=child)

        if spec.service:
            svc = k8s.core.v1.Service(f"{name}-svc", **service(spec, namespace), opts=child)
            self.service_name = svc.metadata.name

        if pruner is not None:
            task, schedule = pruner
            k8s.batch.v1.CronJob(
                f"{name}-pruner",
                **cron_job(task, schedule, spec, namespace, config_map_name, account_name),
                opts=self.child_opts(depends_on=[*waits, *policies]),
            )
