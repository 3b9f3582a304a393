"""Armada's credentials: generated basic-auth users, kept in Secrets, for every caller of the
server and the scheduler that this program creates, and for the people who use the API.

Armada's basic auth (v0.22.7 internal/common/auth/basic.go) compares a request's user and
password with `auth.basicAuth.users` of the service's config; its clients (server ->
scheduler, scheduler -> server, executor -> scheduler) send `basicAuth.{username,password}` of
their connection (pkg/client/connection.go, ApiConnectionDetails). Those passwords must not sit
in the ConfigMaps, so each service that needs them gets a second override file from a Secret,
`/secrets/auth.yaml`, passed as a second `--config` (every binary merges repeated `--config`
files, internal/common/startup.go LoadConfig).

Who is who (each user only in its own group; Armada also puts everyone in `everyone`):

| user | accepted by | group | may |
|---|---|---|---|
| `admin` (people, armadactl) | server, binoculars | `armada-admins` | what `auth.permissionGroupMapping` grants (default: everything) |
| `auth.users[*]` | server, binoculars | their `groups` | what the mapping grants those groups |
| `cloudstation-queues` (`pulumi up`) | server | `cloudstation-queue-managers` | create_queue, delete_queue |
| `cloudstation-builds` (`pulumi up`, `platform.builds.mode: armada`) | server | none | submit, cancel and watch in the `<project>-builds` queues only (a queue permission, components/armada/queue.py SUBMITTER_VERBS) |
| `cloudstation-scheduler` | server; the other schedulers (more than one replica) | none | read queues; a non-leader asks the leader for scheduling reports (neither needs a permission) |
| `cloudstation-server` | scheduler | none | scheduling reports (need no permission) |
| `cloudstation-executor-<name>` | scheduler | `cloudstation-executors` | execute_jobs |
| `cloudstation-executor-<worker>` (an executor-only stack's, `armada.workers`) | scheduler | `cloudstation-executors` | execute_jobs; its password is in the Secret `armada-worker-<worker>` for the worker stack's `armadaExecutorPassword` |
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random
import yaml

from components.armada.config import armadactl_config
from components.armada.settings import ADMINS, EXECUTORS, QUEUE_MANAGERS, ArmadaConfig, ExecutorSettings, WorkerSettings
from components.component import Component
from components.k8s import metadata

COMPONENT = "armada"
ADMIN = "admin"
SERVER_USER = "cloudstation-server"
SCHEDULER_USER = "cloudstation-scheduler"
QUEUES_USER = "cloudstation-queues"
BUILDS_USER = "cloudstation-builds"
"""Who `pulumi up` submits build jobs as: no group, so no server permission; each build queue
grants it the verbs `submit`, `cancel` (a build `pulumi up` gives up on) and `watch` (the job set's
events) and nothing else (components/armada/queue.py SUBMITTER_VERBS; Armada v0.22.7
internal/server/submit/submit.go `authorize`, event/event.go `validateUserHasWatchPermissions`). Reading job status and errors needs no permission
(internal/server/queryapi/query_api.go checks none)."""
AUTH_DIR = "/secrets"
AUTH_FILE = "auth.yaml"
AUTH_PATH = f"{AUTH_DIR}/{AUTH_FILE}"
PASSWORD_LENGTH = 32
"""Letters and digits only: safe in YAML, in a basic-auth pair (no ':') and in a URL."""


def executor_user(executor: "ExecutorSettings | WorkerSettings") -> str:
    """An executor's user at the scheduler: this stack's executors' and the workers' alike."""
    return f"cloudstation-executor-{executor.name}"


def worker_secret(worker: WorkerSettings) -> str:
    """The Secret holding a worker's username and password, for its stack's `armadaExecutorPassword`."""
    return f"armada-worker-{worker.name}"


@dataclass(frozen=True)
class Principal:
    name: str
    groups: tuple[str, ...] = ()


def people(config: ArmadaConfig) -> list[Principal]:
    """The generated admin and the configured users."""
    return [Principal(ADMIN, (ADMINS,)), *(Principal(u.name, tuple(u.groups)) for u in config.auth.users)]


def server_principals(config: ArmadaConfig, builds: bool = False) -> list[Principal]:
    found = [*people(config), Principal(SCHEDULER_USER), Principal(QUEUES_USER, (QUEUE_MANAGERS,))]
    return found + [Principal(BUILDS_USER)] if builds else found


def scheduler_principals(config: ArmadaConfig) -> list[Principal]:
    found = [Principal(SERVER_USER), *(Principal(executor_user(e), (EXECUTORS,)) for e in config.executors)]
    # Executors of other clusters (executor-only stacks): the same group, so the same permission.
    found += [Principal(executor_user(w), (EXECUTORS,)) for w in config.workers]
    if config.scheduler.replicas > 1:
        # A non-leader proxies scheduling reports to the leader (config.py leader_election).
        found.append(Principal(SCHEDULER_USER))
    return found


def binoculars_principals(config: ArmadaConfig) -> list[Principal]:
    return people(config)


def all_principals(config: ArmadaConfig, builds: bool = False) -> list[Principal]:
    """Everyone who gets a password (each exactly once)."""
    found: dict[str, Principal] = {}
    for principal in [*server_principals(config, builds), *scheduler_principals(config)]:
        found.setdefault(principal.name, principal)
    return list(found.values())


def users_section(principals: list[Principal], passwords: Mapping[str, str]) -> dict:
    return {
        "auth": {
            "basicAuth": {
                "users": {p.name: {"password": passwords[p.name], "groups": list(p.groups)} for p in principals}
            }
        }
    }


def client_section(connection: str, user: str, passwords: Mapping[str, str]) -> dict:
    """`connection` is the config key of an ApiConnectionDetails (e.g. executorApiConnection)."""
    return {connection: {"basicAuth": {"username": user, "password": passwords[user]}}}


def server_auth_file(config: ArmadaConfig, passwords: Mapping[str, str], builds: bool = False) -> dict:
    return {
        **users_section(server_principals(config, builds), passwords),
        **client_section("schedulerApiConnection", SERVER_USER, passwords),
    }


def scheduler_auth_file(config: ArmadaConfig, passwords: Mapping[str, str]) -> dict:
    document = {
        **users_section(scheduler_principals(config), passwords),
        **client_section("armadaApi", SCHEDULER_USER, passwords),
    }
    if config.scheduler.replicas > 1:
        # Merged into the `leader` section of the override file (Viper merges maps across files).
        document["leader"] = client_section("leaderConnection", SCHEDULER_USER, passwords)
    return document


def executor_auth_file(executor: ExecutorSettings, passwords: Mapping[str, str]) -> dict:
    return client_section("executorApiConnection", executor_user(executor), passwords)


def binoculars_auth_file(config: ArmadaConfig, passwords: Mapping[str, str]) -> dict:
    return users_section(binoculars_principals(config), passwords)


def login_armadactl(context: str, address: str, tls: bool, username: str, password: str) -> dict:
    """`.armadactl.yaml` that logs in as `username` (reference _local/.armadactl.yaml, `basicAuth`)."""
    document = armadactl_config(context, address, tls)
    document["contexts"][context]["basicAuth"] = {"username": username, "password": password}
    return document


def render(document: dict) -> str:
    return yaml.safe_dump(document, sort_keys=True, default_flow_style=False)


def checksum(text: str) -> str:
    # A digest of 32 random letters and digits reveals nothing about them; it only rolls the pods.
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ServiceCredentials:
    """A service's credentials file: the Secret holding `auth.yaml` and a digest of it (the
    pod template carries the digest, so new credentials roll the pods)."""

    secret: Any
    checksum: Any


@dataclass(frozen=True)
class ArmadaAuthArgs:
    config: ArmadaConfig
    namespace: str
    context: str
    """armadactl context name of the login files (e.g. cloudstation-test)."""
    api_address: str
    """gRPC address users reach: the public one, or `localhost:50051` through a port-forward."""
    api_tls: bool = False
    builds: bool = False
    """Generate the build submitter `cloudstation-builds` (`platform.builds.mode: armada`)."""


class ArmadaAuth(Component):
    """Passwords (RandomPassword) and Secrets. Attributes: `server`, `scheduler`, `binoculars`
    (ServiceCredentials, binoculars None when disabled), `executors` ({executor name:
    ServiceCredentials}), `queue_user` and `queue_password` (secret Output) for the queue
    resources, `build_user` and `build_password` (None without `builds`) for the build jobs, `login_secrets` ({user: Secret name} with keys username, password, armadactl.yaml)."""

    def __init__(self, name: str, args: ArmadaAuthArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Auth", name, None, opts)
        config = args.config
        child = self.child_opts()
        # RandomPasswords, not KeptSecrets (components/kept_secret.py): no data holds these, each
        # service reads its users from the Secrets at start, so those are not kept and a stack deployed
        # again generates new ones everywhere at once.
        generated = {
            p.name: random.RandomPassword(
                f"{name}-{p.name}", length=PASSWORD_LENGTH, special=False, opts=child
            ).result
            for p in all_principals(config, args.builds)
        }
        passwords = pulumi.Output.all(**generated)

        def credentials(service: str, build) -> ServiceCredentials:
            text = pulumi.Output.secret(passwords.apply(lambda values: render(build(values))))
            secret = k8s.core.v1.Secret(
                f"{name}-{service}",
                metadata=metadata(f"{service}-auth", args.namespace, COMPONENT),
                type="Opaque",
                string_data={AUTH_FILE: text},
                opts=child,
            )
            return ServiceCredentials(secret.metadata.name, pulumi.Output.unsecret(text.apply(checksum)))

        self.server = credentials("armada-server", lambda p: server_auth_file(config, p, args.builds))
        self.scheduler = credentials("armada-scheduler", lambda p: scheduler_auth_file(config, p))
        self.executors = {
            e.name: credentials(f"armada-executor-{e.name}", lambda p, e=e: executor_auth_file(e, p))
            for e in config.executors
        }
        self.binoculars = (
            credentials("armada-binoculars", lambda p: binoculars_auth_file(config, p))
            if config.binoculars.enabled else None
        )
        self.queue_user = QUEUES_USER
        self.queue_password = pulumi.Output.secret(generated[QUEUES_USER])
        self.build_user = BUILDS_USER if args.builds else None
        self.build_password = pulumi.Output.secret(generated[BUILDS_USER]) if args.builds else None

        # Each worker's credentials, read by whoever sets up its stack (docs/armada.md "Worker clusters").
        self.workers: dict[str, pulumi.Output[str]] = {}
        for worker in config.workers:
            user = executor_user(worker)
            kept = k8s.core.v1.Secret(
                f"{name}-worker-{worker.name}",
                metadata=metadata(worker_secret(worker), args.namespace, COMPONENT),
                type="Opaque",
                string_data={"username": user, "password": generated[user], "pool": worker.pool, "clusterId": worker.id},
                opts=child,
            )
            self.workers[worker.name] = kept.metadata.name

        self.login_secrets: dict[str, pulumi.Output[str]] = {}
        for person in people(config):
            secret_name = "armada-admin" if person.name == ADMIN else f"armada-user-{person.name}"
            password = generated[person.name]
            login = k8s.core.v1.Secret(
                f"{name}-login-{person.name}",
                metadata=metadata(secret_name, args.namespace, COMPONENT),
                type="Opaque",
                string_data={
                    "username": person.name,
                    "password": password,
                    "armadactl.yaml": password.apply(
                        lambda value, user=person.name: render(
                            login_armadactl(args.context, args.api_address, args.api_tls, user, value)
                        )
                    ),
                },
                opts=child,
            )
            self.login_secrets[person.name] = login.metadata.name
        self.register_outputs({"queueUser": self.queue_user})
