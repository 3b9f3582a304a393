"""Armada queues as code: each queue is a Pulumi resource managed through the server's REST API.

Armada keeps queues in its `lookout` database and offers no Kubernetes object for them (the
operator's Queue CRD is a stub, armada/NOTES.md §8, §11.2), so a dynamic provider creates,
updates, reads and deletes them with `/v1/queue` calls from the machine running `pulumi up`.
Stack config lists queues under `platform.armada.queues`; every CloudStation project also gets
`<project>-builds` for its build jobs (`project_queues`).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import pulumi
import pulumi.dynamic as dynamic
from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.armada.queue_api import QueueClient, QueueExists
from components.dynamic_provider import ProjectDynamicResource, ProjectProvider
from components.model import ConfigModel, DnsLabel, problem
from components.component import Component

if TYPE_CHECKING:
    # The stack config (infra/config.py StackConfig), named only as a type: components import
    # nothing from the program (tests/test_layout.py).
    StackConfig = Any

PROJECT_QUEUE_SUFFIX = "-builds"
QUEUE_API_PASSWORD_KEY = "armadaQueueApiPassword"
"""Secret config key with the password of `queueApi.username`."""
QUEUE_FIELDS = ("name", "priorityFactor", "userOwners", "groupOwners", "labels", "cordoned", "permissions")
"""The queue settings this program owns (apiQueue fields); others keep the server's defaults."""
UNORDERED_FIELDS = ("userOwners", "groupOwners")
CONNECTION_FIELDS = ("apiUrl", "waitSeconds", "timeoutSeconds", "authorization")
"""Inputs that say how to reach the API; changing them changes no queue."""


class QueueArgs(ConfigModel):
    """One Armada queue (an `apiQueue` of the REST API)."""

    name: DnsLabel
    """Queue name: lowercase letters, digits and '-' (used in REST paths and armadactl)."""
    priority_factor: float = 1.0
    """Share weight: a queue with factor 2 gets half the share of one with factor 1. At least 1."""
    user_owners: list[str] = []
    """Users who own the queue (may submit and cancel its jobs); empty means `admin` when the
    program's own queue user creates it (Armada would make that user the owner)."""
    group_owners: list[str] = []
    """Groups whose members own the queue."""
    labels: dict[str, str] = {}
    """Kubernetes-like labels of the queue."""
    cordoned: bool = False
    """A cordoned queue accepts no new jobs."""

    @field_validator("priority_factor")
    @classmethod
    def _at_least_one(cls, value: float) -> float:
        if value < 1:
            raise problem("must be at least 1 (Armada rejects lower priority factors)")
        return value


class ProjectQueueSettings(ConfigModel):
    """The queue every CloudStation project gets for its build jobs, `<project>-builds`."""

    enabled: bool = True
    """Give every project a build queue."""
    priority_factor: float = Field(default=1.0, ge=1)
    """Priority factor of every build queue (at least 1)."""
    user_owners: list[str] = []
    """Users who own every build queue: each may submit a job to any project's queue, whose pods may mount that
    project's build credential (docs/security.md), so the platform's own principals only, never a tenant's CI."""
    group_owners: list[str] = []
    """Groups who own every build queue (the same reach as `userOwners`)."""


class QueueApiSettings(ConfigModel):
    """How `pulumi up` reaches the Armada server's REST API to manage queues."""

    enabled: bool = True
    """Manage queues from this stack (false: no Queue resources, create them with armadactl)."""
    url: str = Field(default="http://localhost:8080", pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    """REST base URL as seen from the machine running `pulumi up` (not in-cluster DNS); the
    default suits `kubectl -n <armada namespace> port-forward svc/armada-server 8080:8080`."""
    wait_seconds: int = Field(default=300, ge=0, le=3600)
    """How long a queue operation retries while the server is unreachable or starting."""
    timeout_seconds: int = Field(default=30, ge=1, le=600)
    """Timeout of one HTTP request."""
    username: Optional[str] = None
    """Basic-auth user to manage queues as, with its password in the secret config key
    `armadaQueueApiPassword` (`pulumi config set --secret ...`). Unset: the user this program
    generates for it (`cloudstation-queues`, allowed create_queue and delete_queue only)."""

    @model_validator(mode="after")
    def _password_is_set(self, info: ValidationInfo) -> "QueueApiSettings":
        secrets = (info.context or {}).get("secrets")
        if self.enabled and self.username and secrets is not None and QUEUE_API_PASSWORD_KEY not in secrets:
            raise problem(
                f"needs the password in the secret config key {QUEUE_API_PASSWORD_KEY} "
                f"(pulumi config set --secret {QUEUE_API_PASSWORD_KEY} ...)",
                ".username",
                self.username,
            )
        return self


def project_queue_name(project: str) -> str:
    return f"{project}{PROJECT_QUEUE_SUFFIX}"


def project_queues(config: "StackConfig") -> list[QueueArgs]:
    """Every queue of the stack: the configured ones, then one build queue per project."""
    armada = config.platform.armada
    queues = list(armada.queues)
    template = armada.project_queue
    if template.enabled:
        queues += [
            QueueArgs(
                name=project_queue_name(project.name),
                priority_factor=template.priority_factor,
                user_owners=template.user_owners,
                group_owners=template.group_owners,
                labels={"cloudstation.io/project": project.name},
            )
            for project in config.projects
        ]
    return queues


def project_queue_clashes(queues: list[QueueArgs], projects: list[str], enabled: bool = True) -> list[tuple[int, str]]:
    """(index, name) of configured queues whose name a project's build queue already takes."""
    if not enabled:
        return []
    taken = {project_queue_name(p) for p in projects}
    return [(index, q.name) for index, q in enumerate(queues) if q.name in taken]


# --- the resource -----------------------------------------------------------------------------


OWNER_VERBS = ("submit", "cancel", "preempt", "reprioritize", "watch")
"""The verbs Armada gives a queue's owners (v0.22.7 pkg/client/queue/permission_verb.go
AllPermissionVerbs; queue.go NewQueue turns userOwners/groupOwners into one permission with all of them)."""


SUBMITTER_VERBS = ("submit", "cancel", "watch")
"""What a build queue's submitter may do, and no more (never preempt or reprioritize): submit its
jobs, cancel them when `pulumi up` gives up waiting (v0.22.7 internal/server/submit/submit.go
CancelJobs: `cancel_any_jobs` or the queue's `cancel` verb) and read the job set's events when
lookout has no error text yet (internal/server/event/event.go validateUserHasWatchPermissions:
`watch_all_events` or the queue's `watch` verb); submitting needs `submit` (submit.go `authorize`)."""


def submit_permission(users: list[str]) -> dict:
    """An apiQueue `permissions` entry letting `users` submit, cancel and watch jobs and nothing
    else (SUBMITTER_VERBS)."""
    return {"subjects": [{"kind": "User", "name": user} for user in sorted(users)], "verbs": list(SUBMITTER_VERBS)}


def api_body(props: dict) -> dict:
    """The apiQueue body for the REST API from a Queue resource's properties."""
    body = {
        "name": props["name"],
        "priorityFactor": float(props["priorityFactor"]),
        "userOwners": list(props.get("userOwners") or []),
        "groupOwners": list(props.get("groupOwners") or []),
        "labels": dict(props.get("labels") or {}),
        "cordoned": bool(props.get("cordoned", False)),
    }
    if props.get("permissions"):
        body["permissions"] = [dict(p) for p in props["permissions"]]
    return body


def normalized(queue: dict) -> dict:
    """Queue settings in a comparable form: the gateway omits empty fields, owners are sets."""
    body = api_body({"priorityFactor": 1.0, **queue})
    for field in UNORDERED_FIELDS:
        body[field] = sorted(body[field])
    # The server answers owners as one permission with every verb (v0.22.7 queue.go ToAPI): only
    # the other permissions are this program's `permissions`.
    body["permissions"] = sorted(
        ({"subjects": sorted(p.get("subjects") or [], key=lambda s: (s.get("kind", ""), s.get("name", ""))),
          "verbs": sorted(p.get("verbs") or [])}
         for p in body.get("permissions") or [] if sorted(p.get("verbs") or []) != sorted(OWNER_VERBS)),
        key=repr,
    )
    return body


def changed_fields(olds: dict, news: dict) -> list[str]:
    """Names of the queue settings that differ, in apiQueue order."""
    old, new = normalized(olds), normalized(news)
    return [field for field in QUEUE_FIELDS if old[field] != new[field]]


def client_for(props: dict) -> QueueClient:
    headers = {"Authorization": props["authorization"]} if props.get("authorization") else {}
    return QueueClient(
        props["apiUrl"],
        timeout=float(props.get("timeoutSeconds", 30)),
        wait_seconds=float(props.get("waitSeconds", 0)),
        headers=headers,
    )


class QueueProvider(ProjectProvider):
    """CRUD of one Armada queue over REST; the queue's name is its id."""

    def problems(self, news: dict[str, Any]) -> list[tuple[str, str]]:
        factor = news.get("priorityFactor")
        if isinstance(factor, (int, float)) and factor < 1:
            return [("priorityFactor", f"must be at least 1, got {factor}")]
        return []

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = changed_fields(olds, news)
        connection = [k for k in CONNECTION_FIELDS if olds.get(k) != news.get(k)]
        return dynamic.DiffResult(
            changes=bool(changed or connection),
            # A queue cannot be renamed: a new name is a new queue (the old one is deleted after).
            replaces=["name"] if "name" in changed else [],
            delete_before_replace=False,
        )

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        client = client_for(props)
        body = api_body(props)
        try:
            client.create(body)
        except QueueExists:
            # Created earlier by hand or by a lost run: adopt it and make it match the code.
            client.update(body)
        return dynamic.CreateResult(id_=body["name"], outs=dict(props))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        live = client_for(props).get(id_)
        if live is None:
            return dynamic.ReadResult(id_="", outs={})  # deleted outside Pulumi
        current = normalized({**live, "name": live.get("name") or id_})
        return dynamic.ReadResult(id_=id_, outs={**props, **current})

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        client_for(news).update(api_body(news))
        return dynamic.UpdateResult(outs=dict(news))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        client_for(props).delete(id_)


def queue_props(
    args: QueueArgs, api: QueueApiSettings, password: Optional[pulumi.Input[str]] = None, submitters: tuple[str, ...] = ()
) -> dict:
    """The Queue resource's inputs: the apiQueue fields plus how to reach the API (with a
    basic-auth header, kept secret in state, when `api.username` is set); `submitters` may submit,
    cancel and watch jobs of the queue and do nothing else there (SUBMITTER_VERBS)."""
    fields = args.model_dump(by_alias=True)
    if submitters:
        fields["permissions"] = [submit_permission(list(submitters))]
    props: dict = {
        **api_body(fields),
        "apiUrl": api.url,
        "waitSeconds": api.wait_seconds,
        "timeoutSeconds": api.timeout_seconds,
    }
    if api.username:
        props["authorization"] = pulumi.Output.secret(
            pulumi.Output.from_input(password).apply(lambda p: basic_auth(api.username, p or ""))
        )
    return props


def basic_auth(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


class Queue(ProjectDynamicResource, module="armada", name="Queue"):
    """An Armada queue (type `pulumi-python:dynamic/armada:Queue`); its id is the queue name. Registered
    as `dynamic.Resource` registers it, its provider serialized once per process (components/dynamic_provider.py)."""

    name: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: QueueArgs,
        api: QueueApiSettings,
        opts: Optional[pulumi.ResourceOptions] = None,
        password: Optional[pulumi.Input[str]] = None,
        submitters: tuple[str, ...] = (),
    ):
        super().__init__(QueueProvider(), name, queue_props(args, api, password, submitters), opts)


@dataclass(frozen=True)
class QueuesArgs:
    """The queues to manage (usually `project_queues(config)`) and how to reach the API."""

    queues: list[QueueArgs]
    api: QueueApiSettings
    password: Optional[pulumi.Input[str]] = None
    """Password of `api.username` (a secret Output)."""
    submitters: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Queue name -> users allowed to submit, cancel and watch its jobs, and nothing else (the build
    user on the `<project>-builds` queues; SUBMITTER_VERBS)."""


class Queues(Component):
    """Every queue of the stack, one Queue child `<name>-<queue>` each. Outputs: `names`;
    `by_name` ({queue name: Queue}) for what must wait for one queue (its build jobs).

    The queues can only be created once the Armada server answers, so the children wait for
    whatever the caller puts in `opts.depends_on` (the server, its lookout migration). Pass the
    Kubernetes provider or not: the children belong to the dynamic provider either way.
    """

    names: pulumi.Output[list[str]]

    def __init__(self, name: str, args: QueuesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("cloudstation:armada:Queues", name, None, opts)
        queues = [
            Queue(f"{name}-{queue.name}", queue, args.api, self.child_opts(),
                  password=args.password, submitters=args.submitters.get(queue.name, ()))
            for queue in args.queues
        ]
        self.by_name: dict[str, Queue] = {queue.name: resource for queue, resource in zip(args.queues, queues)}
        self.names = pulumi.Output.all(*[queue.name for queue in queues]) if queues else pulumi.Output.from_input([])
        self.register_outputs({"names": self.names})


PLATFORM_BUILDS = "platform"
"""The project part of the project-state entity's build queue, `platform-builds`."""
DEFAULT_OWNER = "admin"
"""The generated administrator (components/armada/auth.py): owner of queues that name none."""


def queues_args(
    config: "StackConfig", default_login: Optional[tuple[str, pulumi.Input[str]]] = None,
    build_user: Optional[str] = None,
) -> Optional[QueuesArgs]:
    """What `Queues` needs for this stack, or None when queues are not managed here.
    `default_login` (user, secret password) is used unless `queueApi.username` names another;
    `build_user` may submit, cancel and watch jobs in every project's build queue (SUBMITTER_VERBS,
    nothing else there)."""
    api = config.platform.armada.queue_api
    if not api.enabled:
        return None
    queues = project_queues(config)
    api_user = api.username
    if api.username:
        password = pulumi.Config().require_secret(QUEUE_API_PASSWORD_KEY)
    elif default_login is not None:
        user, password = default_login
        api = api.model_copy(update={"username": user})
        # Armada makes the caller the owner of a queue without owners (CreateQueue): not the
        # platform's queue user, which must not gain rights on the queues it creates.
        queues = [q if q.user_owners else q.model_copy(update={"user_owners": [DEFAULT_OWNER]}) for q in queues]
    else:
        password = None
    submitters = {}
    if build_user and config.platform.armada.project_queue.enabled:
        # The platform's own project-state entity builds too, in `platform-builds` ("platform" is
        # a reserved project name, so no project's queue clashes; a configured queue may not).
        template = config.platform.armada.project_queue
        owners = {"user_owners": template.user_owners or ([DEFAULT_OWNER] if default_login and not api_user else [])}
        queues.append(QueueArgs(
            name=project_queue_name(PLATFORM_BUILDS), priority_factor=template.priority_factor,
            group_owners=template.group_owners, labels={"cloudstation.io/project": PLATFORM_BUILDS}, **owners,
        ))
        submitters = {project_queue_name(name): (build_user,) for name in [*(p.name for p in config.projects), PLATFORM_BUILDS]}
    return QueuesArgs(queues=queues, api=api, password=password, submitters=submitters)
