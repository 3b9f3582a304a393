"""The Armada scheduler: migrates its database first, then schedules; prunes on a schedule."""
from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.armada.config import (
    SCHEDULER, SCHEDULER_LEASE, SCHEDULER_PORTS, leader_identity_env, postgres_env, scheduler_config,
)
from components.armada.service import ArmadaArgs, ArmadaService
from components.armada.workload import COMPONENT, SCHEDULER_CLIENTS, ServiceSpec, TaskSpec, config_args
from components import network
from components.armada.settings import ArmadaConfig
from components.k8s import metadata, selector_labels
from components.network import any_source, pods

LEADER_ROLE = f"{SCHEDULER}-leader-election"
EXECUTOR_API = f"{SCHEDULER}-executors"
"""The Service (and NetworkPolicy) through which executors of other clusters reach the scheduler."""
LEASE_RULES = [
    # RBAC cannot limit `create` by name (the name is not part of the request's URL), so creating
    # is granted for leases in the Armada namespace; reading and renewing only for the one Lease.
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [SCHEDULER_LEASE],
     "verbs": ["get", "update"]},
]
"""What leader election does with its Lease: client-go's LeaseLock (tools/leaderelection/
resourcelock/leaselock.go) only gets, creates and updates it; releasing on shutdown is an update
(v0.22.7 internal/leaderelection/leader.go: ReleaseOnCancel, no event recorder)."""


def replicated(args: ArmadaArgs) -> bool:
    return args.config.scheduler.replicas > 1


def scheduler_spec(args: ArmadaArgs) -> ServiceSpec:
    settings = args.config.scheduler
    grpc_callers = SCHEDULER_CLIENTS if settings.restrict_grpc else tuple(any_source())
    if replicated(args) and settings.restrict_grpc:
        # A non-leader forwards scheduling-report calls to the leader (config.py leader_election).
        grpc_callers = (*grpc_callers, pods(selector_labels(SCHEDULER)))
    return ServiceSpec(
        name=SCHEDULER,
        image=args.image,
        args=config_args("run"),
        config=scheduler_config(args.config, args.endpoints),
        ports=SCHEDULER_PORTS,
        resources=settings.resources,
        replicas=settings.replicas,
        env=postgres_env(args.endpoints),
        pod_env=[leader_identity_env()] if replicated(args) else [],
        health=True,
        credentials=args.credentials,
        # With armada.workers its gRPC API serves TLS with this certificate (config.py scheduler_config).
        tls_secret=args.endpoints.scheduler_tls_secret,
        # More than one replica elect a leader through a Lease on the API server.
        api_access=replicated(args),
        # One replica runs leader.mode standalone: every scheduler process considers itself the
        # leader (v0.22.7 internal/leaderelection/leader.go, StandaloneLeaderController), so two
        # during a rollout would both schedule and lease the same jobs. Elected leaders may
        # overlap in a rollout: only the Lease holder schedules.
        single_writer=not replicated(args),
        callers={"grpc": grpc_callers},
    )


def executor_api_service(config: ArmadaConfig, namespace: str) -> dict:
    """The scheduler's gRPC port for the executors of `workers`, outside the cluster. The client's
    address is kept (externalTrafficPolicy Local: no SNAT to a node's address), so the NetworkPolicy
    can admit exactly the workers' CIDRs; a LoadBalancer also limits its sources to them."""
    api = config.executor_api
    port: dict = {"name": "grpc", "port": api.port, "targetPort": "grpc", "protocol": "TCP"}
    if api.node_port is not None:
        port["nodePort"] = api.node_port
    spec: dict = {
        "type": api.service_type,
        "externalTrafficPolicy": "Local",
        "selector": selector_labels(SCHEDULER),
        "ports": [port],
    }
    if api.service_type == "LoadBalancer":
        spec["loadBalancerSourceRanges"] = [str(c) for w in config.workers for c in w.cidrs]
    return {"metadata": metadata(EXECUTOR_API, namespace, COMPONENT), "spec": spec}


def workers_network_policy(config: ArmadaConfig, namespace: str) -> dict:
    """The scheduler's pods accept the workers' executors (their CIDRs) on the gRPC port, which
    then serves TLS and checks their basic-auth users; nothing else is opened."""
    peers = network.ip_blocks([c for w in config.workers for c in w.cidrs])
    return network.policy(
        EXECUTOR_API, namespace, COMPONENT,
        network.spec({"matchLabels": selector_labels(SCHEDULER)},
                     ingress_rules=[network.ingress(peers, [SCHEDULER_PORTS["grpc"]])]),
    )


def leader_role(namespace: str) -> dict:
    """The Role of the schedulers' leader election, in the Armada namespace only."""
    return {"metadata": metadata(LEADER_ROLE, namespace, COMPONENT), "rules": LEASE_RULES}


def leader_role_binding(namespace: str) -> dict:
    return {
        "metadata": metadata(LEADER_ROLE, namespace, COMPONENT),
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": SCHEDULER, "namespace": namespace}],
    }


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
    """Outputs: `service_name`; attributes `migration` (the scheduler-database migration Job) and
    `executor_api_service` (the Service workers reach it through, or None without workers)."""

    def __init__(self, name: str, args: ArmadaArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Scheduler", name, opts)
        lease_access: list[pulumi.Resource] = []
        if replicated(args):
            namespace = args.endpoints.namespace
            role = k8s.rbac.v1.Role(f"{name}-leader-role", **leader_role(namespace), opts=self.child_opts())
            binding = k8s.rbac.v1.RoleBinding(
                f"{name}-leader-binding", **leader_role_binding(namespace), opts=self.child_opts(depends_on=[role])
            )
            # Without the grant a scheduler cannot take the Lease and never schedules.
            lease_access = [role, binding]
        self._deploy(
            name,
            scheduler_spec(args),
            args.endpoints,
            migration=migration_task(args),
            pruner=pruner_task(args),
            start_after=args.start_after,
            pods_need=lease_access,
        )
        self.executor_api_service: Optional[pulumi.Output[str]] = None
        if args.config.serves_remote_executors:
            namespace = args.endpoints.namespace
            k8s.networking.v1.NetworkPolicy(
                f"{name}-workers-network-policy", **workers_network_policy(args.config, namespace), opts=self.child_opts()
            )
            exposed = k8s.core.v1.Service(
                f"{name}-executors-svc", **executor_api_service(args.config, namespace), opts=self.child_opts()
            )
            self.executor_api_service = exposed.metadata.name
        self.register_outputs({"service_name": self.service_name})
