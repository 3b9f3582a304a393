"""A local stand-in for the Armada server's REST API (v0.22.7), for testing the Queue provider and the
EntityBuild provider.

Queues, as `pkg/api/api.swagger.json` and armada/NOTES.md §8 say: `POST /v1/queue` (409 AlreadyExists on a
duplicate, 400 InvalidArgument when priorityFactor < 1), `GET | PUT | DELETE /v1/queue/{name}` (404 NotFound for
an unknown queue), `apiQueue` bodies with empty fields omitted as the gateway does.

Jobs (armadaproject/armada v0.22.7): `POST /v1/job/submit` (internal/server/submit/submit.go SubmitJobs: the
queue must exist and the caller hold `submit` on it or submit_any_jobs, else 403 PermissionDenied; then
validation/submit_request.go ValidateSubmitRequest, else 400 InvalidArgument; lower-case ULID job ids from
internal/common/util/uuid.go NewULID; clientId deduplication), `POST /v1/job/status` and `POST /v1/job/errors`
(internal/server/queryapi/query_api.go: no queue permission, unknown ids UNKNOWN / absent, at most 500 ids),
`POST /v1/job/cancel` (submit.go CancelJobs: the `cancel` verb or cancel_any_jobs),
`POST /v1/job-set/{queue}/{id}` (internal/server/event/event.go GetJobSetEvents, streamed by grpc-gateway v1.16.0
runtime/handler.go ForwardResponseStream: one `{"result": <apiEventStreamMessage>}` per line, chunked; an error
is one `{"error": {...}}` chunk). Events per job as internal/server/event/conversion/conversions.go makes them:
submitted + queued at submit, then leased, pending, running, succeeded | failed as an executor drives the job.

The scheduler's submit check, when `submit_check` is set (`SubmitCheck`): a job no pool of the scheduler's
executor snapshot can take is rejected (REJECTED, its error and `failed` event the reason text the scheduler
writes), as on a fresh install before the snapshot shows the executor's nodes.

Every request body is validated against the vendored swagger (tests/armada_swagger.py; unknown fields refused,
which the real gateway would silently drop) and answered in the real gateway's JSON (encoding/json: enums as
numbers, timestamps as {seconds, nanos}, errors `{error, code, message}`). Runs on 127.0.0.1 on a free port in a
background thread.
"""
from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import unquote

from tests import armada_swagger

# google.rpc.Code values and the HTTP statuses grpc-gateway maps them to (runtime/errors.go HTTPStatusFromCode).
UNKNOWN_CODE, INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED = 2, 3, 5, 6, 7
UNAVAILABLE, UNAUTHENTICATED = 14, 16
HTTP_STATUS = {UNKNOWN_CODE: 500, INVALID_ARGUMENT: 400, NOT_FOUND: 404, ALREADY_EXISTS: 409, PERMISSION_DENIED: 403,
               UNAVAILABLE: 503, UNAUTHENTICATED: 401}
HTTP_TEXT = {500: "Internal Server Error", 400: "Bad Request", 404: "Not Found", 409: "Conflict", 403: "Forbidden",
             503: "Service Unavailable", 401: "Unauthorized"}
QUEUE_KEYS = {
    "name", "priorityFactor", "userOwners", "groupOwners", "resourceLimits", "resourceLimitsByPriorityClassName",
    "permissions", "cordoned", "labelsDeprecated", "labels", "retryPolicies",
}
OWNER_VERBS = ("submit", "cancel", "preempt", "reprioritize", "watch")
"""pkg/client/queue/permission_verb.go AllPermissionVerbs: what queue.go NewQueue gives userOwners/groupOwners."""

JOB_ID = re.compile(r"^[0-9a-hjkmnp-tv-z]{26}$")
"""A ULID in lower case (Crockford base32, 26 characters), as util.NewULID returns it."""
CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED", "REJECTED")
NEXT_STATES = {"QUEUED": ("LEASED",), "LEASED": ("PENDING",), "PENDING": ("RUNNING",), "RUNNING": ("SUCCEEDED",)}
"""The happy path a job takes; FAILED may follow any state that is not terminal."""
EVENT_OF_STATE = {"LEASED": "leased", "PENDING": "pending", "RUNNING": "running", "SUCCEEDED": "succeeded",
                  "FAILED": "failed"}
MAX_QUERY_ITEMS = 500
"""config/server/config.yaml queryapi.maxQueryItems."""
JOB_SET_ID_MAX = 1024
CLIENT_ID_MAX = 100


class ApiError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def new_job_id() -> str:
    """A lower-case ULID: 48 bits of milliseconds, 80 random bits, Crockford base32."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    return "".join(CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def error_body(code: int, message: str) -> dict:
    """grpc-gateway v1.16.0 runtime/errors.go DefaultHTTPError through encoding/json (empty details omitted)."""
    return {"error": message, "code": code, "message": message}


def stream_error_chunk(code: int, message: str) -> dict:
    """runtime/handler.go errorChunk(DefaultHTTPStreamErrorHandler(err)) through encoding/json: the proto field
    names of internal.StreamError (grpc_code, http_code, http_status), empty ones omitted."""
    status = HTTP_STATUS[code]
    return {"error": {"grpc_code": code, "http_code": status, "message": message, "http_status": HTTP_TEXT[status]}}


def omit_empty(fields: dict) -> dict:
    """encoding/json `omitempty` on one struct's fields: drop "", 0, false, null, empty lists and maps (not
    inside nested values: Kubernetes pointers keep their zero values)."""
    return {k: v for k, v in fields.items() if v is True or v not in ("", 0, False, None, [], {})}


def timestamp(seconds: float) -> dict:
    """gogo types.Timestamp through encoding/json."""
    return omit_empty({"seconds": int(seconds), "nanos": int(round((seconds % 1) * 1e9)) % 1_000_000_000})


def principal_of(authorization: Optional[str]) -> str:
    """The user a Basic Authorization header names (Armada's basicAuth authenticator), else anonymous."""
    if authorization and authorization.startswith("Basic "):
        try:
            return base64.b64decode(authorization[6:]).decode().split(":", 1)[0]
        except (ValueError, UnicodeDecodeError):
            pass
    return "anonymous"


@dataclass
class Submission:
    """The server's `submission` config the validation reads (config/server/config.yaml at v0.22.7, with the
    platform's priority classes: components/armada/config.py switches armada-resilient off)."""

    allowed_priority_classes: frozenset = frozenset({"armada-default", "armada-preemptible"})
    min_memory_bytes: int = 1024 * 1024  # minJobResources.memory: 1Mi
    min_termination_grace_seconds: int = 1
    max_termination_grace_seconds: int = 300
    assert_init_containers_fractional_cpu: bool = True
    max_oversubscription: dict = field(default_factory=dict)  # maxOversubscriptionByResourceRequest (none: 1.0)


@dataclass
class Job:
    """One submitted job: the request item as sent, and what the server knows of it."""

    id: str
    queue: str
    job_set_id: str
    item: dict
    owner: str
    created: float
    state: str = "QUEUED"
    error: str = ""
    status_reads: int = 0

    @property
    def pod_spec(self) -> dict:
        return self.item.get("podSpec") or (self.item.get("podSpecs") or [{}])[0]

    @property
    def pod_name(self) -> str:
        return f"armada-{self.id}-0"  # the executor's pod name (internal/executor/util/kubernetes_object.go)


PodRequirementsNotMetReasonInsufficientResources = "insufficient resources available"
"""internal/scheduler/nodedb/nodematching.go: what a node that cannot fit the job's requests is excluded for."""


def _tabwriter(rows: list[list[str]]) -> str:
    """Go's text/tabwriter as internal/scheduler/scheduling/context/pod.go configures it
    (tabwriter.NewWriter(&sb, 1, 1, 1, ' ', 0)) for rows of tab-terminated cells plus a last
    free cell: each column of a block of consecutive rows that have it is as wide as its widest
    cell plus one space; a row with no tab-terminated cell ends every block."""
    out = []
    block: list[list[str]] = []

    def flush():
        columns = max((len(r) - 1 for r in block), default=0)
        widths = [max(len(r[c]) for r in block if len(r) - 1 > c) + 1 for c in range(columns)]
        out.extend("".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:-1])) + r[-1] for r in block)
        block.clear()

    for row in rows:
        if len(row) == 1:
            flush()
            out.append(row[0])
        else:
            block.append(row)
    flush()
    return "".join(line + "\n" for line in out)


def pod_scheduling_context(nodes: int, excluded: dict[str, int]) -> str:
    """context/pod.go PodSchedulingContext.String() of a job no node was found for (Node: none)."""
    rows = [["Node:", "none"], ["Number of nodes in cluster:", str(nodes)]]
    if not excluded:
        rows.append(["Excluded nodes:", "none"])
    else:
        rows.append(["Excluded nodes:"])
        rows += [["", f"{count}:", reason] for reason, count in excluded.items()]
    return _tabwriter(rows)


def pod_requests(spec: dict) -> dict[str, int]:
    """A pod's requests in thousandths as the scheduler counts them: per resource the larger of
    the containers' sum and the largest init container (k8s resource.TotalPodResourceRequest,
    which Armada's PodRequirementsFromPodSpec uses)."""
    def requests(container: dict) -> dict[str, int]:
        return {k: quantity_milli(v) for k, v in ((container.get("resources") or {}).get("requests") or {}).items()}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for name, value in requests(container).items():
            total[name] = total.get(name, 0) + value
    for container in spec.get("initContainers") or []:
        for name, value in requests(container).items():
            total[name] = max(total.get(name, 0), value)
    return total


@dataclass
class SubmitCheck:
    """The scheduler's submit check, armadaproject/armada v0.22.7 internal/scheduler/submitcheck.go:
    `SubmitChecker` keeps a snapshot of the executors' nodes, taken when the scheduler starts
    (`Initialise`) and every `scheduling.executorUpdateFrequency` after (`Run`'s ticker; 60s in
    config/scheduler/config.yaml), from what executors stored at their last lease request
    (internal/scheduler/api.go LeaseJobRuns -> StoreExecutor; the executor asks every
    `task.allocateSpareClusterCapacityInterval`, 5s). Each new job is checked against that
    snapshot (scheduler.go `submitCheck`): if no pool (`scheduling.pools`, in order) has a node that
    fits it, the job gets a terminal JobRejected whose message is `getSchedulingResult`'s text,
    per pool "pool <name>:\n" + the pod scheduling context + "\n---\n". Lookout records it as
    REJECTED with the message as the job's error (lookoutingester/instructions/instructions.go), the
    event stream as a `failed` event with it as reason, cause Rejected
    (server/event/conversion/conversions.go FromInternalJobErrors). A pool without nodes says
    "Number of nodes in cluster: 0"; one whose nodes are too small excludes them for
    "insufficient resources available" (nodedb.go SelectNodeForJobWithTxn's deferred count).

    `report(pool, ...)` is an executor's lease request storing its nodes; `started` the scheduler's
    start (time.monotonic())."""

    pools: list[str] = field(default_factory=lambda: ["default"])
    update_frequency: float = 60.0
    started: float = field(default_factory=time.monotonic)
    reported: list[tuple[float, str, int, dict[str, int]]] = field(default_factory=list)

    def report(self, pool: str = "default", nodes: int = 1, allocatable: Optional[dict] = None,
               at: Optional[float] = None) -> None:
        """An executor reports `nodes` nodes of `allocatable` (cpu 8, memory 32Gi by default) in `pool`."""
        allocatable = allocatable or {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "100Gi"}
        self.reported.append((time.monotonic() if at is None else at, pool, nodes,
                              {k: quantity_milli(v) for k, v in allocatable.items()}))

    def snapshot(self, now: Optional[float] = None) -> dict[str, tuple[int, dict[str, int]]]:
        """pool -> (nodes, allocatable per node) as of the last refresh (the latest report of each
        pool stored by then; StoreExecutor replaces an executor's nodes)."""
        now = time.monotonic() if now is None else now
        refreshed = self.started + (max(now - self.started, 0) // self.update_frequency) * self.update_frequency
        seen: dict[str, tuple[int, dict[str, int]]] = {}
        for at, pool, nodes, allocatable in sorted(self.reported, key=lambda r: r[0]):
            if at <= refreshed:
                seen[pool] = (nodes, allocatable)
        return seen

    def reason(self, spec: dict, now: Optional[float] = None) -> Optional[str]:
        """None when some pool can take a pod of `spec`, else the rejection message."""
        snapshot, wanted = self.snapshot(now), pod_requests(spec)
        text = ""
        for pool in self.pools:
            nodes, allocatable = snapshot.get(pool, (0, {}))
            if nodes and all(allocatable.get(name, 0) >= value for name, value in wanted.items()):
                return None
            excluded = {PodRequirementsNotMetReasonInsufficientResources: nodes} if nodes else {}
            text += f"pool {pool}:\n" + pod_scheduling_context(nodes, excluded) + "\n---\n"
        return text


class FakeArmada:
    """`queues` is the server's state; `requests` logs (method, path, body); `deny` names queues the caller
    lacks every permission for (403); `unavailable` makes the next N requests answer 503; `authorization`,
    when set, is the only Authorization header accepted (else 401).

    Jobs: `jobs` by id; `submit_any_jobs` / `watch_all_events` / `cancel_any_jobs` name users holding those
    global permissions (others need the queue's `submit` / `watch` / `cancel` verb: `permissions` or
    `userOwners`); `POST /v1/job/cancel` cancels (CANCELLED at once); `submission` the server's
    validation settings; `executor`, when set, is called with each new Job on its own thread and drives it with
    `advance`; `lookout_lag` makes status and errors not know a job for its first N reads (the lookout ingester's
    delay); `job_state_names` answers state names instead of the wire's numbers; `submit_check` (a
    `SubmitCheck`), when set, rejects what the scheduler's executor snapshot cannot take (the executor then
    never sees the job)."""

    def __init__(self):
        self.queues: dict[str, dict] = {}
        self.requests: list[tuple[str, str, Optional[dict]]] = []
        self.deny: set[str] = set()
        self.unavailable = 0
        self.authorization: Optional[str] = None
        self.jobs: dict[str, Job] = {}
        self.submit_any_jobs: set[str] = set()
        self.watch_all_events: set[str] = set()
        self.cancel_any_jobs: set[str] = set()
        self.submission = Submission()
        self.executor: Optional[Callable[[Job], None]] = None
        self.submit_check: Optional[SubmitCheck] = None
        self.lookout_lag = 0
        self.job_state_names = False
        self.cluster_id = "fake-cluster"
        self.events: dict[tuple[str, str], list[dict]] = {}
        self._client_ids: dict[tuple[str, str], str] = {}
        self._sequence = 0
        self._closing = False
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeArmada":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # --- helpers for tests --------------------------------------------------------------------

    def add_queue(self, name: str, submitters=(), watchers=(), cancellers=(), owners=()) -> dict:
        """A queue as the Queue provider would create it: `submitters` hold `submit`, `watchers` `watch`,
        `cancellers` `cancel`, `owners` every verb."""
        permissions = [
            {"subjects": [{"kind": "User", "name": u} for u in sorted(users)], "verbs": [verb]}
            for verb, users in (("submit", submitters), ("watch", watchers), ("cancel", cancellers)) if users
        ]
        queue = omit_empty({"name": name, "priorityFactor": 1, "userOwners": sorted(owners), "permissions": permissions})
        with self._lock:
            self.queues[name] = queue
        return queue

    def state(self, job_id: str) -> str:
        with self._lock:
            return self.jobs[job_id].state

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        """Wait until `predicate()` (evaluated under the lock) holds; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))
            return True

    def wait_settled(self, timeout: float = 60.0) -> bool:
        """Wait until every job is in a terminal state."""
        return self.wait_for(lambda: all(j.state in TERMINAL for j in self.jobs.values()), timeout)

    # --- the executor's side ------------------------------------------------------------------

    def advance(self, job_id: str, state: str, reason: str = "", container_statuses: Optional[list[dict]] = None,
                cause: str = "Error") -> None:
        """Move a job to `state` (an apiJobState name) and publish its event: LEASED, PENDING, RUNNING, SUCCEEDED
        in that order, FAILED from any state that is not terminal (with `reason` and the failed containers)."""
        with self._changed:
            job = self.jobs[job_id]
            allowed = NEXT_STATES.get(job.state, ()) + (("FAILED",) if job.state not in TERMINAL else ())
            if state not in allowed:
                raise ValueError(f"job {job_id}: {job.state} -> {state} is not a transition Armada makes ({allowed})")
            job.state = state
            run = {"clusterId": self.cluster_id}
            if state != "LEASED":
                run.update(kubernetesId=job.id, podName=job.pod_name, podNamespace=job.item.get("namespace", ""))
            if state in ("RUNNING", "SUCCEEDED", "FAILED"):
                run["nodeName"] = "fake-node"
            if state in ("LEASED", "PENDING", "RUNNING"):
                run["pool"] = "default"
            if state == "FAILED":
                job.error = reason
                run.update(reason=reason, cause=armada_swagger.CAUSES.index(cause), containerStatuses=[
                    omit_empty({**status, "cause": armada_swagger.CAUSES.index(status.get("cause", cause))})
                    for status in container_statuses or []
                ])
            self._publish(job, [{EVENT_OF_STATE[state]: self._event(job, **run)}])

    def reject(self, job_id: str, reason: str) -> None:
        """The scheduler's submit check refused a queued job (`SubmitCheck`): REJECTED, `reason` its error and
        its `failed` event's reason (cause Rejected, category internal/job-rejected: errormatch types.go)."""
        with self._changed:
            job = self.jobs[job_id]
            if job.state != "QUEUED":
                raise ValueError(f"job {job_id}: only a queued job is submit-checked, not a {job.state} one")
            job.state, job.error = "REJECTED", reason
            self._publish(job, [{"failed": self._event(
                job, reason=reason, cause=armada_swagger.CAUSES.index("Rejected"), failureCategory="internal",
                failureSubcategory="job-rejected")}])

    def _event(self, of: Job, **fields) -> dict:
        return omit_empty({"jobId": of.id, "jobSetId": of.job_set_id, "queue": of.queue,
                           "created": timestamp(time.time()), **fields})

    def _publish(self, job: Job, messages: list[dict]) -> None:
        """Append one event sequence (ids Time:Seq:SubSeq:last, internal/server/event/sequence/sequence.go)."""
        self._sequence += 1
        stream = self.events.setdefault((job.queue, job.job_set_id), [])
        millis = int(time.time() * 1000)
        for index, message in enumerate(messages):
            last = "true" if index == len(messages) - 1 else "false"
            stream.append({"id": f"{millis}:{self._sequence}:{index}:{last}", "message": message})
        self._changed.notify_all()

    # --- the API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Optional[dict], authorization: Optional[str] = None) -> tuple[int, dict]:
        new_jobs: list[Job] = []
        with self._lock:
            self.requests.append((method, path, body))
            if self.authorization is not None and authorization != self.authorization:
                return 401, error_body(UNAUTHENTICATED, "Request could not be authenticated")
            if self.unavailable:
                self.unavailable -= 1
                return 503, error_body(UNAVAILABLE, "server is starting")
            try:
                answer = self._route(method, path, body, principal_of(authorization), new_jobs)
            except ApiError as error:
                return HTTP_STATUS[error.code], error_body(error.code, error.message)
            except Exception as error:  # a bug of the fake: answer it as the server's Unknown, visibly
                return 500, error_body(UNKNOWN_CODE, f"fake Armada error: {type(error).__name__}: {error}")
        for job in new_jobs:  # outside the lock: the executor calls advance()
            reason = self.submit_check.reason(job.pod_spec) if self.submit_check is not None else None
            if reason is not None:
                self.reject(job.id, reason)
                continue
            if self.executor is not None:
                threading.Thread(target=self.executor, args=(job,), daemon=True, name=f"executor-{job.id}").start()
        return 200, answer

    def _route(self, method: str, path: str, body: Optional[dict], principal: str, new_jobs: list[Job]) -> dict:
        if method == "POST" and path in ("/v1/job/submit", "/v1/job/status", "/v1/job/errors", "/v1/job/cancel"):
            self._check_body(path, body)
            if path == "/v1/job/submit":
                return self._submit(body or {}, principal, new_jobs)
            if path == "/v1/job/cancel":
                return self._cancel(body or {}, principal)
            job_ids = (body or {}).get("jobIds") or []
            if len(job_ids) > MAX_QUERY_ITEMS:
                raise ApiError(UNKNOWN_CODE, f"request contained more than {MAX_QUERY_ITEMS} jobIds")
            return self._status(job_ids) if path == "/v1/job/status" else self._errors(job_ids)
        if path == "/v1/queue" and method == "POST":
            queue = self._valid(body)
            if queue["name"] in self.queues:
                raise ApiError(ALREADY_EXISTS, f"[CreateQueue] error creating queue: Queue {queue['name']} already exists")
            self.queues[queue["name"]] = queue
            return {}
        if path.startswith("/v1/queue/"):
            name = unquote(path[len("/v1/queue/"):])
            if method == "GET":
                return self._existing(name)
            if method == "PUT":
                queue = self._valid(body)
                self._existing(name)
                self.queues[name] = queue
                return {}
            if method == "DELETE":
                self._existing(name)
                del self.queues[name]
                return {}
        raise ApiError(NOT_FOUND, f"Not Found: {method} {path}")

    def _check_body(self, path: str, body) -> None:
        """The swagger's definition of the path's body; the gateway answers a body it cannot decode with
        InvalidArgument (event.pb.gw.go / submit.pb.gw.go: status.Errorf(codes.InvalidArgument, "%v", err))."""
        problems = armada_swagger.request_errors(armada_swagger.body_definition(path), body if body is not None else {})
        if problems:
            raise ApiError(INVALID_ARGUMENT, "; ".join(problems))

    def _authorize(self, queue_name: str, principal: str, verb: str, any_permission: set[str],
                   any_name: str) -> dict:
        """internal/common/auth/authorization.go AuthorizeQueueAction (after the queue cache lookup)."""
        queue = self.queues.get(queue_name)
        if queue is None:
            raise ApiError(PERMISSION_DENIED, f'could not find queue "{queue_name}"')
        permitted = principal in queue.get("userOwners", []) or any(
            verb in (p.get("verbs") or []) and {"kind": "User", "name": principal} in (p.get("subjects") or [])
            for p in queue.get("permissions") or []
        )
        if queue_name in self.deny or not (permitted or principal in any_permission):
            raise ApiError(PERMISSION_DENIED, (
                f"{principal} lacks permission {verb} required for action {verb} for queue {queue_name}; user "
                f"{principal} cannot perform action {verb} on queue {queue_name} as they are neither explicitly "
                f"permissioned on the queue or a member of {any_name} group"))
        return queue

    def _submit(self, body: dict, principal: str, new_jobs: list[Job]) -> dict:
        queue_name = body.get("queue", "")
        self._authorize(queue_name, principal, "submit", self.submit_any_jobs, "submit_any_jobs")
        problem = self._submit_problem(body)
        if problem:
            raise ApiError(INVALID_ARGUMENT, problem)
        answers = []
        for item in body.get("jobRequestItems") or []:
            client_id = item.get("clientId", "")
            original = self._client_ids.get((queue_name, client_id)) if client_id else None
            if original:
                answers.append({"jobId": original})
                continue
            job = Job(new_job_id(), queue_name, body["jobSetId"], json.loads(json.dumps(item)), principal, time.time())
            self.jobs[job.id] = job
            if client_id:
                self._client_ids[(queue_name, client_id)] = job.id
            api_job = omit_empty({
                "id": job.id, "clientId": client_id, "jobSetId": job.job_set_id, "queue": queue_name,
                "namespace": item.get("namespace"), "labels": item.get("labels"), "annotations": item.get("annotations"),
                "owner": principal, "priority": item.get("priority"), "podSpec": job.pod_spec,
                "created": timestamp(job.created),
            })
            self._publish(job, [{"submitted": self._event(job, job=api_job)}, {"queued": self._event(job)}])
            new_jobs.append(job)
            answers.append({"jobId": job.id})
        return omit_empty({"jobResponseItems": answers})

    def _cancel(self, body: dict, principal: str) -> dict:
        """submit.go CancelJobs: reason at most 50 bytes, queue and job set required, the `cancel` verb or
        cancel_any_jobs; no job ids cancels the job set. Cancelling is asynchronous upstream (the scheduler
        publishes `cancelled` later); here both events are published at once."""
        reason = body.get("reason", "")
        if len(reason.encode()) > 50:
            raise ApiError(INVALID_ARGUMENT, "reason cannot be longer than 50 bytes")
        job_ids = list(dict.fromkeys([*(body.get("jobIds") or []), *([body["jobId"]] if body.get("jobId") else [])]))
        queue_name, job_set = body.get("queue", ""), body.get("jobSetId", "")
        if not queue_name:
            raise ApiError(INVALID_ARGUMENT, "queue cannot be empty")
        if not job_set:
            raise ApiError(INVALID_ARGUMENT, "jobset cannot be empty")
        if queue_name not in self.queues:
            raise ApiError(UNKNOWN_CODE, f'could not find queue "{queue_name}"')  # not mapped to a gRPC code
        self._authorize(queue_name, principal, "cancel", self.cancel_any_jobs, "cancel_any_jobs")
        targets = job_ids or [j.id for j in self.jobs.values() if (j.queue, j.job_set_id) == (queue_name, job_set)]
        for job_id in targets:
            job = self.jobs.get(job_id)
            if job is None or (job.queue, job.job_set_id) != (queue_name, job_set) or job.state in TERMINAL:
                continue
            job.state = "CANCELLED"
            self._publish(job, [{"cancelling": self._event(job, requestor=principal, reason=reason)}])
            self._publish(job, [{"cancelled": self._event(job, requestor=principal, reason=reason)}])
        return {"cancelledIds": job_ids or [""]}

    def _submit_problem(self, body: dict) -> Optional[str]:
        """internal/server/submit/validation/submit_request.go, the checks a build job can meet or miss."""
        if not body.get("queue"):
            return "queue is a required field"
        if not body.get("jobSetId"):
            return "job set id is a required field"
        if len(body["jobSetId"]) >= JOB_SET_ID_MAX:
            return f"job set id of length {len(body['jobSetId'])} must be less than max character length {JOB_SET_ID_MAX}"
        for item in body.get("jobRequestItems") or []:
            problem = self._item_problem(item)
            if problem:
                return problem
        return None

    def _item_problem(self, item: dict) -> Optional[str]:
        if not item.get("namespace"):
            return "namespace is a required field"
        specs = item.get("podSpecs") or []
        if item.get("podSpec") is None and not specs:
            return "Job must contain at least one PodSpec"
        if specs and item.get("podSpec") is not None:
            return "PodSpec must be nil if PodSpecs is provided (i.e., these are exclusive)"
        if len(specs) > 1:
            return "Jobs with multiple pods are not supported"
        spec = item.get("podSpec") or specs[0]
        containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for container in containers:
            problem = self._resources_problem(container)
            if problem:
                return problem
        if self.submission.assert_init_containers_fractional_cpu:
            for container in spec.get("initContainers") or []:
                for section in ("requests", "limits"):
                    cpu = ((container.get("resources") or {}).get(section) or {}).get("cpu")
                    if cpu is not None and quantity_milli(cpu) and quantity_milli(cpu) % 1000 == 0:
                        return (f"Init container {container.get('name')} contains invalid cpu value {cpu}.  All init "
                                "containers must set requests/limits to fractional cpu e.g. 900m")
        priority_class = spec.get("priorityClassName")
        if priority_class and priority_class not in self.submission.allowed_priority_classes:
            return f"priority class {priority_class} is not supported"
        grace = spec.get("terminationGracePeriodSeconds")
        low, high = self.submission.min_termination_grace_seconds, self.submission.max_termination_grace_seconds
        if grace and not low <= grace <= high:
            return f"terminationGracePeriodSeconds of {grace} must be [{low}s, {high}s], or omitted"
        seen_ports: dict[int, str] = {}
        for container in containers:
            for port in container.get("ports") or []:
                number = port.get("containerPort")
                if number in seen_ports:
                    return (f"container port {number} is exposed multiple times, specified in containers "
                            f'"{seen_ports[number]}" and "{container.get("name")}". Should only be exposed once')
                seen_ports[number] = container.get("name")
        if len(item.get("clientId", "")) > CLIENT_ID_MAX:
            return f"client id of length {len(item['clientId'])} is greater than max allowed length of  {CLIENT_ID_MAX}"
        return None

    def _resources_problem(self, container: dict) -> Optional[str]:
        name = container.get("name")
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        if not requests and not limits:
            return f"container {name} has no resources specified"
        if len(requests) != len(limits):
            return f"container {name} defines different resources for requests and limits"
        for resource, request in requests.items():
            if resource not in limits:
                return f"container {name} defines {resource} for requests but not limits"
            limit_milli, request_milli = quantity_milli(limits[resource]), quantity_milli(request)
            if limit_milli < request_milli:
                return f"container {name} defines {resource} with limits smaller than requests"
            factor = self.submission.max_oversubscription.get(resource, 1.0)
            if limit_milli > factor * request_milli:
                return f"container {name} defines {resource} with limits great than {factor:.2f}*requests"
        memory = requests.get("memory")
        if memory is not None and quantity_milli(memory) < self.submission.min_memory_bytes * 1000:
            return f'container "{name}" memory requests ({memory}) below server minimum (1Mi)'
        return None

    def _known(self, job_id: str) -> Optional[Job]:
        """A job the lookout database has ingested (after `lookout_lag` reads)."""
        job = self.jobs.get(job_id)
        if job is None:
            return None
        job.status_reads += 1
        return job if job.status_reads > self.lookout_lag else None

    def _status(self, job_ids: list[str]) -> dict:
        states = {}
        for job_id in job_ids:
            job = self._known(job_id)
            name = job.state if job else "UNKNOWN"
            states[job_id] = name if self.job_state_names else armada_swagger.JOB_STATES.index(name)
        return omit_empty({"jobStates": states}) if states else {}

    def _errors(self, job_ids: list[str]) -> dict:
        errors = {}
        for job_id in job_ids:
            job = self._known(job_id)
            if job is not None:
                errors[job_id] = job.error
        # A map value "" is kept by encoding/json (omitempty applies to the map, not its values).
        return {"jobErrors": errors} if errors else {}

    def job_set_events(self, queue: str, job_set: str, body: Optional[dict], authorization: Optional[str]):
        """(status, error body) for a refused request, else (200, iterator of stream chunks)."""
        with self._lock:
            self.requests.append(("POST", f"/v1/job-set/{queue}/{job_set}", body))
            if self.authorization is not None and authorization != self.authorization:
                return 401, error_body(UNAUTHENTICATED, "Request could not be authenticated")
            try:
                self._check_body("/v1/job-set/{queue}/{id}", body)
            except ApiError as error:
                return 400, error_body(error.code, error.message)
        request = {**(body or {}), "queue": queue, "id": job_set}  # the path's values win (event.pb.gw.go)
        return 200, self._stream(request, principal_of(authorization))

    def _stream(self, request: dict, principal: str):
        queue, job_set = request["queue"], request["id"]
        refusal = position = None
        with self._lock:  # decide under the lock, write without it
            after = request.get("fromMessageId") or ""
            if queue not in self.queues:
                refusal = stream_error_chunk(NOT_FOUND, f"[GetJobSetEvents] Queue {queue} does not exist")
            else:
                try:
                    self._authorize(queue, principal, "watch", self.watch_all_events, "watch_all_events")
                except ApiError as error:
                    refusal = stream_error_chunk(PERMISSION_DENIED, f"[GetJobSetEvents] error getting events for "
                                                                    f"queue: {queue}, job set: {job_set}: {error.message}")
            if refusal is None and request.get("errorIfMissing") and not self.events.get((queue, job_set)):
                refusal = stream_error_chunk(NOT_FOUND, f"[GetJobSetEvents] Jobset {job_set} for queue {queue} does not exist")
            if refusal is None and after:
                try:
                    position = _sequence_key(after)
                except ValueError:
                    refusal = stream_error_chunk(UNKNOWN_CODE, f"Could not convert legacy message id over to new message "
                                                               f"id for request for queue {queue}, jobset {job_set}")
        if refusal is not None:
            yield refusal
            return
        sent = 0
        while True:
            with self._changed:
                stream = self.events.get((queue, job_set), [])
                if position is not None:
                    pending = [m for m in stream if _sequence_key(m["id"]) > position]
                else:
                    pending = list(stream)
                pending = pending[sent:]
                if not pending:
                    if not request.get("watch") or self._closing:
                        return
                    self._changed.wait(0.1)
                    continue
            for message in pending:
                sent += 1
                yield {"result": message}

    def _valid(self, body: Optional[dict]) -> dict:
        if not isinstance(body, dict):
            raise ApiError(INVALID_ARGUMENT, "request body must be an apiQueue object")
        unknown = set(body) - QUEUE_KEYS
        if unknown:
            raise ApiError(INVALID_ARGUMENT, f"unknown field(s) {sorted(unknown)} in apiQueue")
        problems = armada_swagger.request_errors("apiQueue", body)
        if problems:
            raise ApiError(INVALID_ARGUMENT, "; ".join(problems))
        if not body.get("name"):
            raise ApiError(INVALID_ARGUMENT, "[CreateQueue] error validating queue: queue name cannot be empty")
        if body["name"] in self.deny:
            raise ApiError(PERMISSION_DENIED, f"user anonymous lacks permission create_queue for {body['name']}")
        if float(body.get("priorityFactor", 0)) < 1:
            raise ApiError(INVALID_ARGUMENT, "[CreateQueue] error validating queue: priority factor cannot be lower than 1.0")
        return {k: v for k, v in body.items() if v not in (None, [], {}, False, "")}

    def _existing(self, name: str) -> dict:
        if name not in self.queues:
            raise ApiError(NOT_FOUND, f"[GetQueue] error getting queue {name}: queue {name} not found")
        return dict(self.queues[name])

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the stream is chunked, as the gateway sends it

            def _reply(self, status: int, answer: dict) -> None:
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError as error:
                    self._reply(400, error_body(INVALID_ARGUMENT, f"invalid character in JSON: {error}"))
                    return
                match = re.fullmatch(r"/v1/job-set/([^/]+)/([^/]+)", self.path)
                if match and self.command == "POST":
                    self._stream(unquote(match[1]), unquote(match[2]), body)
                    return
                self._reply(*fake.handle(self.command, self.path, body, self.headers.get("Authorization")))

            def _stream(self, queue: str, job_set: str, body) -> None:
                status, chunks = fake.job_set_events(queue, job_set, body, self.headers.get("Authorization"))
                if status != 200:
                    self._reply(status, chunks)
                    return
                started = False
                try:
                    for chunk in chunks:
                        if not started:
                            error = chunk.get("error")
                            self.send_response(error["http_code"] if error else 200)
                            self.send_header("Content-Type", "application/json")
                            self.send_header("Transfer-Encoding", "chunked")
                            self.end_headers()
                            started = True
                        data = json.dumps(chunk).encode() + (b"" if "error" in chunk else b"\n")
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if not started:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *_args) -> None:  # keep test output clean
                pass

        return Handler


def _sequence_key(message_id: str) -> tuple[int, int, int]:
    """Order of ExternalSeqNo `Time:Seq:SubSeq:last`, or a legacy Redis id `Time-Seq`."""
    parts = message_id.split(":")
    if len(parts) == 4:
        return int(parts[0]), int(parts[1]), int(parts[2])
    time_part, seq = message_id.split("-")
    return int(time_part), int(seq), 1 << 30


_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def quantity_milli(value) -> int:
    """A Kubernetes quantity in thousandths (resource.Quantity MilliValue), rounded up."""
    if isinstance(value, (int, float)):
        return int(value * 1000)
    match = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[a-zA-Z]*)", str(value).strip())
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.groups()
    scale = 10 ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _SUFFIX[suffix]
    milli = float(number) * scale * 1000
    return int(milli) if milli == int(milli) else int(milli) + 1
