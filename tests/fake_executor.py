"""A fake Armada executor for the in-cluster builds (docs/builds.md; seam 6 of issue 13's contract): attached
to a FakeArmada, it plays each submitted build job's pod against a real docker-registry:

1. LEASED: the pod the executor would create (`armada-<job id>-0` in the item's namespace) is admitted as it
   is: admission (the Pod schema, the namespace's Pod Security level, RBAC, the job admission policy) is a
   real API server's, in the end-to-end tier (e2e/standins.py ClusterExecutor creates each build pod there
   as the executor's ServiceAccount), which retired this fake's model of it.
2. PENDING: the context named by `cloudstation.io/build-context` (`<registry host>/[<prefix>/]builds/<project>/
   <entity>@sha256:<hex>`) is fetched from the registry with the build credentials and its sha256 checked.
3. RUNNING: the tar must be exactly the entity's hashed files (components/entity_image.py context_files) plus
   `Dockerfile`, deterministic as seam 1 says, and the labels/`cloudstation.io/build-image` must name the
   entity's content tag; then the entity's tests run (`node --test` over its *.test.js / *.test.mjs in the
   extracted context).
4. A failing test: FAILED with the reason Armada's executor writes (internal/executor/util/pod_status.go
   ExtractPodFailedReason: "Container <name> failed with exit code <n> because Error: <message>"), where the
   message is the container's termination message: with terminationMessagePolicy FallbackToLogsOnError the
   last 80 lines / 2048 bytes of its output (kubelet MaxContainerTerminationMessageLogLines/-Length), else
   empty, as on a real cluster. Otherwise a synthesized image (config + one layer, real digests) is pushed to
   the build-image tag and the job SUCCEEDED.

Options: `fail` (entity -> output: the tests "fail" with it), `hang` (entities whose jobs stay RUNNING until
`release()`; `hang_all`), `jobs` (ids handled, in order), `pushed` (job id -> image digest)."""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import stat
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

import requests

from components import build_job, entity_image
from tests.fake_armada import TERMINAL, FakeArmada, Job

CONTEXT_ANNOTATION = "cloudstation.io/build-context"
IMAGE_ANNOTATION = "cloudstation.io/build-image"
PROJECT_LABEL, ENTITY_LABEL, TAG_LABEL = "cloudstation.io/project", "cloudstation.io/entity", "cloudstation.io/content-tag"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TERMINATION_LOG_LINES, TERMINATION_LOG_BYTES = 80, 2048
"""kubelet kubecontainer.MaxContainerTerminationMessageLogLines / MaxContainerTerminationMessageLogLength."""
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"
TEST_FILE = re.compile(r"\.test\.m?js$")
CONTEXT_REF = re.compile(r"(?P<host>[^/]+)/(?P<repository>[^@]+)@(?P<digest>sha256:[0-9a-f]{64})")
IMAGE_REF = re.compile(r"(?P<host>[^/]+)/(?P<repository>[^:@]+):(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})")

Contexts = Union[dict, Callable[[str, str], tuple[Path, str]]]
"""(project, entity) -> (the entity's source directory, the Dockerfile text it builds with)."""


class BuildFailed(Exception):
    """The job fails: `reason` as Armada reports it, the container's exit code and termination message."""

    def __init__(self, reason: str, exit_code: int = 1, message: str = "", container: str = "", cause: str = "Error"):
        super().__init__(reason)
        self.reason, self.exit_code, self.message, self.container, self.cause = reason, exit_code, message, container, cause


class FakeExecutor:
    """`with FakeExecutor(armada, registry, contexts, registry_host=...)`: handles every job submitted to
    `armada` from then on. `registry` is a tests/registry_server.py RegistryServer standing for the in-cluster
    registry that pods reach as `registry_host` (the host in the annotations); `credentials` are what the
    build Secret holds (default: the registry's own user), or a function of the name of the Secret the pod
    mounts as its docker config (each project's own build Secret). `builders`: the content tag hashes the pod's
    builder and fetch images too (components/build_job.py builder_key), as the program's in-cluster tags do
    (infra/builds.py builder; pods here run the pins, no mirror); False for items tagged by content alone."""

    def __init__(self, armada: FakeArmada, registry, contexts: Contexts, *, registry_host: str,
                 credentials: Union[tuple[str, str], Callable[[str], tuple[str, str]], None] = None,
                 test_timeout: float = 120.0, builders: bool = False):
        self.armada, self.registry, self.contexts = armada, registry, contexts
        self.registry_host = registry_host
        self.credentials = credentials or (registry.username, registry.password)
        self.test_timeout = test_timeout
        self.builders = builders
        self.fail: dict[str, str] = {}
        self.hang: set[str] = set()
        self.hang_all = False
        self.jobs: list[str] = []
        self.pushed: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self._release = threading.Event()
        self._lock = threading.Lock()
        armada.executor = self.run

    def __enter__(self) -> "FakeExecutor":
        return self

    def __exit__(self, *_exc) -> None:
        self.release()
        if self.armada.executor == self.run:
            self.armada.executor = None

    def release(self) -> None:
        """Let hanging jobs go on."""
        self._release.set()

    # --- one job ------------------------------------------------------------------------------

    def run(self, job: Job) -> None:
        with self._lock:
            self.jobs.append(job.id)
        armada = self.armada
        try:
            armada.advance(job.id, "LEASED")
            spec = job.pod_spec
            self._admit(job, spec)
            armada.advance(job.id, "PENDING")
            project, entity, tag = self._identity(job)
            context, dockerfile_text = self._context_of(project, entity)
            login = self._login(spec)
            data = self._fetch_context(job, project, entity, login)
            armada.advance(job.id, "RUNNING")
            builder = (spec.get("containers") or [{}])[0]
            self._check(job, data, context, dockerfile_text, project, entity, tag, builder.get("name", ""))
            if self.hang_all or entity in self.hang:
                while not self._release.wait(0.05):
                    if armada.state(job.id) != "RUNNING":
                        return  # cancelled
            code, output = self._run_tests(data, entity, spec)
            self.outputs[job.id] = output
            if code == "deadline":
                raise BuildFailed(DEADLINE_MESSAGE, cause="DeadlineExceeded")
            if code != 0:
                policy = builder.get("terminationMessagePolicy", "File")
                message = termination_tail(output) if policy == "FallbackToLogsOnError" else ""
                raise BuildFailed("", code, message, builder.get("name", ""))
            self.pushed[job.id] = push_image(self.registry, self._image_repository(job), tag, data, login,
                                             labels={PROJECT_LABEL: project, ENTITY_LABEL: entity})
            if armada.state(job.id) == "RUNNING":  # not cancelled meanwhile
                armada.advance(job.id, "SUCCEEDED")
        except BuildFailed as failure:
            self._failed(job, failure)
        except Exception as error:  # the fake's own trouble: fail the job loudly rather than hang the test
            self._failed(job, BuildFailed(f"fake executor error: {type(error).__name__}: {error}"))

    def _failed(self, job: Job, failure: BuildFailed) -> None:
        statuses = []
        reason = failure.reason
        if failure.container:
            # pod_status.go ExtractPodFailedReason and ExtractFailedPodContainerStatuses.
            reason = (f"Container {failure.container} failed with exit code {failure.exit_code} because Error: "
                      f"{failure.message}\n")
            statuses = [{"name": failure.container, "exitCode": failure.exit_code, "message": failure.message,
                         "reason": "Error"}]
        if self.armada.state(job.id) not in TERMINAL:
            self.armada.advance(job.id, "FAILED", reason=reason, container_statuses=statuses, cause=failure.cause)

    def _admit(self, job: Job, spec: dict) -> None:
        """Where a real API server admits the pod (e2e/standins.py ClusterExecutor); offline, every pod is."""

    def _identity(self, job: Job) -> tuple[str, str, str]:
        labels = job.item.get("labels") or {}
        missing = [key for key in (PROJECT_LABEL, ENTITY_LABEL, TAG_LABEL) if not labels.get(key)]
        if missing:
            raise BuildFailed(f"build job without labels {missing}")
        return labels[PROJECT_LABEL], labels[ENTITY_LABEL], labels[TAG_LABEL]

    def _context_of(self, project: str, entity: str) -> tuple[Path, str]:
        contexts = self.contexts
        found = contexts(project, entity) if callable(contexts) else contexts.get((project, entity))
        if found is None:
            raise BuildFailed(f"no entity {project}/{entity} in this test's stacks")
        return Path(found[0]), found[1]

    def _login(self, spec: dict) -> tuple[str, str]:
        """The credentials in the Secret the pod mounts as its docker config (as kaniko and the fetch read them)."""
        if not callable(self.credentials):
            return self.credentials
        names = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
        if len(names) != 1:
            raise BuildFailed(f"the build pod mounts {sorted(names)}, not one build Secret")
        return self.credentials(names.pop())

    def _fetch_context(self, job: Job, project: str, entity: str, login: tuple[str, str]) -> bytes:
        ref = (job.item.get("annotations") or {}).get(CONTEXT_ANNOTATION, "")
        match = CONTEXT_REF.fullmatch(ref)
        if not match:
            raise BuildFailed(f"annotation {CONTEXT_ANNOTATION}={ref!r}: not <host>/<repository>@sha256:<hex>")
        if match["host"] != self.registry_host:
            raise BuildFailed(f"{CONTEXT_ANNOTATION} names registry {match['host']!r}, the pods reach {self.registry_host!r}")
        repository = match["repository"]
        if not (repository == f"builds/{project}/{entity}" or repository.endswith(f"/builds/{project}/{entity}")):
            raise BuildFailed(f"{CONTEXT_ANNOTATION} repository {repository!r} is not [<prefix>/]builds/{project}/{entity}")
        answer = requests.get(f"{self.registry.url}/v2/{repository}/blobs/{match['digest']}",
                              auth=login, timeout=30)
        if answer.status_code != 200:
            raise BuildFailed(f"fetching the context {ref}: HTTP {answer.status_code} {answer.text[:200]}",
                              container="fetch-context", message=f"HTTP {answer.status_code}")
        if "sha256:" + hashlib.sha256(answer.content).hexdigest() != match["digest"]:
            raise BuildFailed(f"the context blob does not hash to {match['digest']}")
        return answer.content

    def _image_repository(self, job: Job) -> str:
        match = IMAGE_REF.fullmatch((job.item.get("annotations") or {}).get(IMAGE_ANNOTATION, ""))
        return match["repository"]

    def _check(self, job: Job, data: bytes, context: Path, dockerfile_text: str, project: str, entity: str,
               tag: str, container: str) -> None:
        problems = context_problems(data, context, dockerfile_text)
        builder = None
        if self.builders:
            spec = job.pod_spec
            builder = build_job.builder_key(spec["containers"][0]["image"], spec["initContainers"][0]["image"])
        expected_tag = entity_image.content_tag(context, dockerfile_text, builder)
        if tag != expected_tag:
            problems.append(f"label {TAG_LABEL}={tag!r}, the entity's content tag is {expected_tag!r}")
        image = (job.item.get("annotations") or {}).get(IMAGE_ANNOTATION, "")
        match = IMAGE_REF.fullmatch(image)
        if not match:
            problems.append(f"annotation {IMAGE_ANNOTATION}={image!r}: not <host>/<repository>:<tag>")
        else:
            if match["host"] != self.registry_host:
                problems.append(f"{IMAGE_ANNOTATION} names registry {match['host']!r}, the pods reach {self.registry_host!r}")
            if not (match["repository"] == f"{project}/{entity}" or match["repository"].endswith(f"/{project}/{entity}")):
                problems.append(f"{IMAGE_ANNOTATION} repository {match['repository']!r} is not [<prefix>/]{project}/{entity}")
            if match["tag"] != expected_tag:
                problems.append(f"{IMAGE_ANNOTATION} tag {match['tag']!r} is not the content tag {expected_tag!r}")
        if problems:
            message = "build context: " + "; ".join(problems)
            raise BuildFailed("", 1, termination_tail(message), container or "build")

    def _run_tests(self, data: bytes, entity: str, spec: dict) -> tuple[Union[int, str], str]:
        if entity in self.fail:
            return 1, self.fail[entity] or f"not ok 1 - {entity}: a test failed (forced by the fake executor)"
        deadline = spec.get("activeDeadlineSeconds")
        timeout = min(self.test_timeout, deadline) if deadline else self.test_timeout
        with tempfile.TemporaryDirectory(prefix="fake-build-") as work:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                tar.extractall(work, filter="data")
            tests = sorted(str(p.relative_to(work)) for p in Path(work).rglob("*")
                           if TEST_FILE.search(p.name) and "node_modules" not in p.parts and p.is_file())
            if not tests:
                return 0, "no *.test.js or *.test.mjs files: nothing to run"
            try:
                done = subprocess.run(["node", "--test", *tests], cwd=work, capture_output=True, text=True,
                                      timeout=timeout, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work})
            except subprocess.TimeoutExpired:
                return "deadline", ""
            return done.returncode, done.stdout + done.stderr


def termination_tail(output: str) -> str:
    """What the kubelet keeps of a container's log as its termination message (FallbackToLogsOnError):
    the last 80 lines, then the last 2048 bytes of those."""
    lines = output.splitlines(keepends=True)[-TERMINATION_LOG_LINES:]
    return "".join(lines).encode()[-TERMINATION_LOG_BYTES:].decode(errors="replace")


def context_problems(data: bytes, context: Path, dockerfile_text: str) -> list[str]:
    """Why `data` is not the build context of `context` as seam 1 defines it; [] when it is."""
    if data[:2] == b"\x1f\x8b":
        return ["the context is gzip-compressed; it must be an uncompressed tar"]
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    except tarfile.TarError as error:
        return [f"not an uncompressed tar: {error}"]
    names = [m.name for m, _ in members]
    expected = set(entity_image.context_files(context)) | {entity_image.DOCKERFILE}
    problems = []
    if names != sorted(names):
        problems.append("entries are not sorted by path")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"entries repeated: {duplicates}")
    extra, missing = sorted(set(names) - expected), sorted(expected - set(names))
    if extra:
        problems.append(f"entries that are not the entity's hashed files: {extra}")
    if missing:
        problems.append(f"hashed files missing from the context: {missing}")
    for member, content in members:
        name = member.name
        if name not in expected:
            continue
        if (member.mtime, member.uid, member.gid, member.uname, member.gname) != (0, 0, 0, "", ""):
            problems.append(f"{name}: mtime/uid/gid/uname/gname {member.mtime}/{member.uid}/{member.gid}/"
                            f"{member.uname!r}/{member.gname!r}, not 0/0/0/''/''")
        if name == entity_image.DOCKERFILE:
            if not member.isfile() or content != dockerfile_text.encode() or member.mode != 0o644:
                problems.append("Dockerfile: not the Dockerfile text the image is built with (a 0644 file)")
            continue
        path = context / name
        info = path.lstat()
        mode = 0o755 if info.st_mode & 0o111 else 0o644
        if stat.S_ISLNK(info.st_mode):
            if not member.issym() or member.linkname != os.readlink(path):
                problems.append(f"{name}: not the symlink to {os.readlink(path)!r}")
        elif not member.isfile() or content != path.read_bytes():
            problems.append(f"{name}: content differs from the entity's file")
        elif member.mode != mode:
            problems.append(f"{name}: mode {member.mode:o}, the file's is {mode:o}")
    return problems


def upload_blob(registry, repository: str, data: bytes, credentials: tuple[str, str]) -> dict:
    """A monolithic blob upload (registry API v2: POST uploads/, PUT ?digest=); returns {digest, size}."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = requests.post(f"{registry.url}/v2/{repository}/blobs/uploads/", auth=credentials, timeout=30)
    start.raise_for_status()
    location = start.headers["Location"]
    location = location if location.startswith("http") else registry.url + location
    put = requests.put(location + ("&" if "?" in location else "?") + f"digest={digest}", data=data, auth=credentials,
                       headers={"Content-Type": "application/octet-stream"}, timeout=30)
    put.raise_for_status()
    return {"digest": digest, "size": len(data)}


def push_image(registry, repository: str, tag: str, context: bytes, credentials: tuple[str, str],
               labels: Optional[dict] = None) -> str:
    """Push a synthesized image (OCI config + one gzip layer holding the context) with the registry API v2;
    returns the manifest digest the registry reports."""
    layer = gzip.compress(context, mtime=0)
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": dict(labels or {}), "User": "1000:1000"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(context).hexdigest()]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/fake_executor.py"}],
    }
    config_blob = upload_blob(registry, repository, json.dumps(config).encode(), credentials)
    layer_blob = upload_blob(registry, repository, layer, credentials)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_blob},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer_blob}],
    }
    body = json.dumps(manifest).encode()
    answer = requests.put(f"{registry.url}/v2/{repository}/manifests/{tag}", data=body, auth=credentials,
                          headers={"Content-Type": OCI_MANIFEST}, timeout=30)
    answer.raise_for_status()
    digest = answer.headers["Docker-Content-Digest"]
    assert digest == "sha256:" + hashlib.sha256(body).hexdigest(), "the registry's digest is not the manifest's"
    return digest


class FakeBinoculars:
    """Armada's binoculars for the fake executor's pods: `POST /v1/binoculars/log` (pkg/api/binoculars/
    binoculars.proto Logs; internal/binoculars/service/logs.go GetLogs) answering the build container's output
    as `{"log": [{"timestamp", "line"}]}`, tailLines applied; 404 NotFound for a pod it never ran (upstream's
    "pod ... has been cleaned up"); a body the binoculars swagger refuses gets 400; no logOptions fails as
    upstream's nil dereference does (500). `authorization`, when set, is the only Authorization accepted."""

    def __init__(self, executor: "FakeExecutor", authorization: Optional[str] = None):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from tests import armada_swagger
        from tests.fake_armada import INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, UNKNOWN_CODE, error_body

        self.executor, self.authorization = executor, authorization
        self.requests: list[dict] = []
        fake = self

        def answer(body, header: Optional[str]) -> tuple[int, dict]:
            fake.requests.append(body)
            if fake.authorization is not None and header != fake.authorization:
                return 401, error_body(UNAUTHENTICATED, "Request could not be authenticated")
            problems = armada_swagger.request_errors("binocularsLogRequest", body, api="binoculars")
            if problems:
                return 400, error_body(INVALID_ARGUMENT, "; ".join(problems))
            if body.get("logOptions") is None:  # a nil *PodLogOptions; {} decodes to a non-nil one
                return 500, error_body(UNKNOWN_CODE, "runtime error: invalid memory address or nil pointer dereference")
            job = fake.executor.armada.jobs.get(body.get("jobId", ""))
            namespace = body.get("podNamespace") or "default"
            output = fake.executor.outputs.get(job.id) if job else None
            if output is None or body.get("podNumber", 0) != 0 or namespace != job.item.get("namespace"):
                return 404, error_body(NOT_FOUND, "The pod with these logs doesn't exist - this is likely because the "
                                                  "job has finished and the pod has been cleaned up")
            lines = output.splitlines()
            tail = body["logOptions"].get("tailLines")
            if tail is not None:
                lines = lines[-int(tail):] if int(tail) else []
            stamp = "2026-01-01T00:00:00.000000000Z"
            return 200, {"log": [{"timestamp": stamp, "line": line} for line in lines]} if lines else {}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/binoculars/log":
                    status, body = 404, {"error": "Not Found", "code": NOT_FOUND, "message": "Not Found"}
                else:
                    try:
                        status, body = answer(json.loads(raw) if raw else {}, self.headers.get("Authorization"))
                    except ValueError as error:
                        status, body = 400, error_body(INVALID_ARGUMENT, str(error))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FakeBinoculars":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._server.shutdown()
        self._server.server_close()


QUEUE_VERB_ARGUMENT = {"submit": "submitters", "watch": "watchers", "cancel": "cancellers"}


class BuildCluster:
    """What `build_cluster` yields: the fake Armada, its executor and the real registry behind them."""

    def __init__(self, armada: FakeArmada, executor: FakeExecutor, registry, binoculars: "FakeBinoculars"):
        self.armada, self.executor, self.registry, self.binoculars = armada, executor, registry, binoculars


@contextlib.contextmanager
def build_cluster(workdir: Path, contexts: Contexts, *, registry_host: str, queues=(), users=(),
                  verbs=("submit",), authorization: Optional[str] = None, builders: bool = False) -> Iterator[BuildCluster]:
    """A docker-registry (tests/registry_server.py, in `workdir`), a FakeArmada whose `queues` give `users` the
    queue `verbs` (submit, watch, cancel; the Queue component grants the build user all three:
    components/armada/queue.py SUBMITTER_VERBS), a FakeExecutor playing the build pods and a FakeBinoculars
    serving their logs (same `authorization`), all stopped afterwards."""
    from tests.registry_server import RegistryServer

    with RegistryServer(workdir) as registry, FakeArmada() as armada:
        armada.authorization = authorization
        for queue in queues:
            armada.add_queue(queue, **{QUEUE_VERB_ARGUMENT[verb]: users for verb in verbs})
        with FakeExecutor(armada, registry, contexts, registry_host=registry_host,
                          builders=builders) as executor, FakeBinoculars(executor, authorization) as binoculars:
            yield BuildCluster(armada, executor, registry, binoculars)
