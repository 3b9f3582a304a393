"""The test doubles of the in-cluster builds, tested themselves: the fake Armada's job API against the vendored
v0.22.7 swagger (requests refused as the swagger refuses them, answers validated against it as the real gateway
writes them), and the fake executor against a real docker-registry (Pod Security, context contents, the
entity's tests, the pushed image)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import textwrap
import time
from pathlib import Path

import pytest
import requests

from components import build_context, entity_image
from tests import armada_swagger
from tests.conftest import ROOT
from tests.fake_armada import JOB_ID, FakeArmada, Job, SubmitCheck
from tests.fake_executor import (
    CONTEXT_ANNOTATION, ENTITY_LABEL, IMAGE_ANNOTATION, PROJECT_LABEL, TAG_LABEL, FakeExecutor, context_problems,
    FakeBinoculars, build_cluster, termination_tail, upload_blob,
)
from tests.registry_server import registry  # noqa: F401 (fixture)

USER = "platform"
AUTH = "Basic " + base64.b64encode(f"{USER}:pw".encode()).decode()
QUEUE, JOB_SET, NAMESPACE = "shop-builds", "shop-test", "cloudstation-builds"
REGISTRY_HOST = "registry.cloudstation-registry.svc.cluster.local:5000"
IMAGE = "docker.io/library/node:20.20.2-bookworm-slim@sha256:" + "a" * 64


@pytest.fixture()
def armada():
    with FakeArmada() as server:
        server.add_queue(QUEUE, submitters=[USER], watchers=[USER])
        yield server


def post(server: FakeArmada, path: str, body, authorization: str = AUTH, **kwargs) -> requests.Response:
    return requests.post(server.url + path, data=json.dumps(body), timeout=10,
                         headers={"Authorization": authorization, "Content-Type": "application/json"}, **kwargs)


def pod_spec(**container_overrides) -> dict:
    """A build pod as the restricted level wants it."""
    container = {
        "name": "build", "image": IMAGE, "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "readOnlyRootFilesystem": True},
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        **container_overrides,
    }
    return {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "activeDeadlineSeconds": 600,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container], "volumes": [{"name": "work", "emptyDir": {}}],
    }


def item(spec: dict | None = None, **fields) -> dict:
    return {"namespace": NAMESPACE, "priority": 1, "podSpec": spec or pod_spec(), **fields}


def submit(server: FakeArmada, *items, job_set: str = JOB_SET, queue: str = QUEUE, **kwargs) -> requests.Response:
    return post(server, "/v1/job/submit", {"queue": queue, "jobSetId": job_set, "jobRequestItems": list(items)}, **kwargs)


def events(server: FakeArmada, body: dict | None = None, queue: str = QUEUE, job_set: str = JOB_SET,
           **kwargs) -> tuple[requests.Response, list[dict]]:
    """The job set's stream, split on the gateway's newline delimiter."""
    answer = post(server, f"/v1/job-set/{queue}/{job_set}", body or {}, stream=True, **kwargs)
    lines = [json.loads(line) for line in answer.iter_lines() if line]
    return answer, lines


def assert_wire(path: str, body: dict) -> None:
    assert armada_swagger.response_errors(armada_swagger.answer_definition(path), body) == []


# --- the swagger ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", sorted(armada_swagger.SWAGGER_FILES))
def test_the_vendored_swagger_is_the_upstream_file(api):
    data = armada_swagger.SWAGGER_FILES[api].read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == armada_swagger.SWAGGER_BLOBS[api]
    provenance = (ROOT / "tests" / "upstream" / "PROVENANCE.md").read_text()
    assert armada_swagger.SWAGGER_BLOBS[api] in provenance and hashlib.sha256(data).hexdigest() in provenance
    # An extra check where the team's reference folder is beside the repository (never required).
    reference = Path(os.environ.get("CLOUDSTATION_REFERENCE") or ROOT.parent / "shared" / "reference")
    copy = reference / "armada" / "armada-v0.22.7" / "pkg" / "api" / "api.swagger.json"
    if api == "server" and copy.is_file():
        assert copy.read_bytes() == data


def test_the_schemas_follow_the_swagger_and_the_wire():
    assert armada_swagger.JOB_STATES[:6] == ["QUEUED", "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "UNKNOWN"]
    assert armada_swagger.body_definition("/v1/job/submit") == "apiJobSubmitRequest"
    assert armada_swagger.answer_definition("/v1/job-set/{queue}/{id}") == "apiEventStreamMessage"
    # Answers: enums are numbers, Armada's timestamps {seconds, nanos} (encoding/json), not the swagger's strings.
    assert armada_swagger.response_errors("apiJobStatusResponse", {"jobStates": {"x": 2}}) == []
    assert armada_swagger.response_errors("apiJobStatusResponse", {"jobStates": {"x": "RUNNING"}})
    assert armada_swagger.response_errors("apiJobQueuedEvent", {"jobId": "x", "created": {"seconds": 1}}) == []
    assert armada_swagger.response_errors("apiJobQueuedEvent", {"jobId": "x", "created": "2026-01-01T00:00:00Z"})
    # Requests: Kubernetes types as Kubernetes reads them; unknown keys refused at any depth.
    probe = pod_spec(readinessProbe={"httpGet": {"port": 8080, "path": "/"}})
    assert armada_swagger.request_errors("v1PodSpec", probe) == []
    assert armada_swagger.request_errors("v1PodSpec", pod_spec(readinessProbe={"httpGet": {"port": {"IntVal": 1}}}))
    assert armada_swagger.request_errors("v1PodSpec", pod_spec(resources={"limits": {"cpu": "1 core"}}))
    assert armada_swagger.request_errors("v1PodSpec", {**pod_spec(), "hostname_": "x"})


# --- submit -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path, body, where", [
    ("/v1/job/submit", {"queue": QUEUE, "jobSetId": JOB_SET, "jobRequestItems": [item()], "jobSetID": "x"}, "(root)"),
    ("/v1/job/submit", {"queue": QUEUE, "jobSetId": JOB_SET, "jobRequestItems": [item(pod_spec(imagee="x"))]},
     "jobRequestItems/0/podSpec/containers/0"),
    ("/v1/job/submit", {"queue": QUEUE, "jobSetId": 7, "jobRequestItems": [item()]}, "jobSetId"),
    ("/v1/job/submit", {"queue": QUEUE, "jobSetId": JOB_SET, "jobRequestItems": item()}, "jobRequestItems"),
    ("/v1/job/submit", {"queue": QUEUE, "jobSetId": JOB_SET, "jobRequestItems": [item(labels={"a": 1})]},
     "jobRequestItems/0/labels/a"),
    ("/v1/job/status", {"jobIds": "01hx"}, "jobIds"),
    ("/v1/job/errors", {"jobId": ["01hx"]}, "(root)"),
    (f"/v1/job-set/{QUEUE}/{JOB_SET}", {"watch": "yes"}, "watch"),
])
def test_a_body_the_swagger_refuses_gets_400(armada, path, body, where):
    answer = post(armada, path, body)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["code"] == 3 and error["error"] == error["message"] and f" at {where}:" in error["message"]
    assert armada_swagger.response_errors("runtimeError", error) == []
    assert armada.jobs == {}


def test_a_valid_submit_gets_ulid_job_ids_and_its_events(armada):
    answer = submit(armada, item(clientId="cart-1"), item())
    assert answer.status_code == 200, answer.text
    assert_wire("/v1/job/submit", answer.json())
    ids = [i["jobId"] for i in answer.json()["jobResponseItems"]]
    assert len(set(ids)) == 2 and all(JOB_ID.fullmatch(i) for i in ids)
    assert [armada.jobs[i].state for i in ids] == ["QUEUED", "QUEUED"]
    # A resubmission with the same clientId gets the first job's id (submit.go deduplication), no new job.
    again = submit(armada, item(clientId="cart-1"))
    assert again.json()["jobResponseItems"] == [{"jobId": ids[0]}] and len(armada.jobs) == 2
    stream, chunks = events(armada)
    assert stream.headers["Content-Type"] == "application/json" and stream.headers["Transfer-Encoding"] == "chunked"
    assert [list(c["result"]["message"]) for c in chunks] == [["submitted"], ["queued"]] * 2
    for chunk in chunks:
        assert list(chunk) == ["result"]
        assert_wire("/v1/job-set/{queue}/{id}", chunk["result"])
    submitted = chunks[0]["result"]["message"]["submitted"]
    assert submitted["job"]["podSpec"] == pod_spec() and submitted["job"]["owner"] == USER


@pytest.mark.parametrize("change, status, fragment", [
    (dict(queue="nobody-builds"), 403, 'could not find queue "nobody-builds"'),
    (dict(authorization="Basic " + base64.b64encode(b"mallory:x").decode()), 403,
     "mallory lacks permission submit required for action submit for queue shop-builds"),
    (dict(job_set=""), 400, "job set id is a required field"),
    (dict(items=[item(namespace="")]), 400, "namespace is a required field"),
    (dict(items=[{"namespace": NAMESPACE}]), 400, "Job must contain at least one PodSpec"),
    (dict(items=[item(podSpecs=[pod_spec()])]), 400, "PodSpec must be nil if PodSpecs is provided"),
    (dict(items=[item(pod_spec(resources={"requests": {"cpu": "1", "memory": "1Gi"},
                                           "limits": {"cpu": "2", "memory": "1Gi"}}))]),
     400, "container build defines cpu with limits great than 1.00*requests"),
    (dict(items=[item(pod_spec(resources={"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}}))]),
     400, "container build defines different resources for requests and limits"),
    (dict(items=[item({**pod_spec(), "priorityClassName": "armada-resilient"})]), 400,
     "priority class armada-resilient is not supported"),
])
def test_submit_refuses_what_armada_refuses(armada, change, status, fragment):
    answer = submit(armada, *change.pop("items", [item()]), **change)
    assert answer.status_code == status and fragment in answer.json()["message"], answer.text
    assert armada_swagger.response_errors("runtimeError", answer.json()) == []
    assert armada.jobs == {}


def test_a_wrong_credential_is_unauthenticated(armada):
    armada.authorization = AUTH
    answer = submit(armada, item(), authorization="Basic " + base64.b64encode(b"platform:wrong").decode())
    assert answer.status_code == 401 and answer.json()["code"] == 16 and armada.jobs == {}


# --- status, errors, the job set ---------------------------------------------------------------


def test_status_errors_and_events_follow_the_job(armada):
    job_id = submit(armada, item()).json()["jobResponseItems"][0]["jobId"]
    unknown = "01hzzzzzzzzzzzzzzzzzzzzzzz"

    def status() -> dict:
        answer = post(armada, "/v1/job/status", {"jobIds": [job_id, unknown]})
        assert answer.status_code == 200
        assert_wire("/v1/job/status", answer.json())
        return {k: armada_swagger.JOB_STATES[v] for k, v in answer.json()["jobStates"].items()}

    assert status() == {job_id: "QUEUED", unknown: "UNKNOWN"}
    for state in ("LEASED", "PENDING", "RUNNING"):
        armada.advance(job_id, state)
        assert status()[job_id] == state
    with pytest.raises(ValueError, match="RUNNING -> PENDING"):
        armada.advance(job_id, "PENDING")
    armada.advance(job_id, "FAILED", reason="Container build failed with exit code 1 because Error: boom\n",
                   container_statuses=[{"name": "build", "exitCode": 1, "message": "boom", "reason": "Error"}])
    assert status()[job_id] == "FAILED"
    errors = post(armada, "/v1/job/errors", {"jobIds": [job_id, unknown]})
    assert_wire("/v1/job/errors", errors.json())
    assert errors.json() == {"jobErrors": {job_id: "Container build failed with exit code 1 because Error: boom\n"}}

    _, chunks = events(armada, {"watch": False})
    messages = [c["result"]["message"] for c in chunks]
    assert [list(m) for m in messages] == [["submitted"], ["queued"], ["leased"], ["pending"], ["running"], ["failed"]]
    for chunk in chunks:
        assert_wire("/v1/job-set/{queue}/{id}", chunk["result"])
    failed = messages[-1]["failed"]
    assert failed["reason"].endswith("boom\n") and failed["containerStatuses"][0]["exitCode"] == 1
    assert failed["podName"] == f"armada-{job_id}-0" and failed["podNamespace"] == NAMESPACE
    # fromMessageId: only what came after it; ids order as Armada's Time:Seq:SubSeq:last.
    _, later = events(armada, {"fromMessageId": chunks[3]["result"]["id"]})
    assert [list(c["result"]["message"]) for c in later] == [["running"], ["failed"]]


# The scheduler's rejection messages, as Go prints them: the output of internal/scheduler/submitcheck.go
# getSchedulingResult's formatting with context/pod.go PodSchedulingContext.String()'s text/tabwriter
# (NewWriter(&sb, 1, 1, 1, ' ', 0)) for one pool, run with go1.24 (issue 19 defect 2).
EMPTY_POOL = ("pool default:\nNode:                       none\nNumber of nodes in cluster: 0\n"
              "Excluded nodes:             none\n\n---\n")
TOO_SMALL = ("pool default:\nNode:                       none\nNumber of nodes in cluster: 1\n"
             "Excluded nodes:\n 1: insufficient resources available\n\n---\n")


def test_the_submit_check_rejects_what_the_executor_snapshot_cannot_take(armada):
    """v0.22.7 submitcheck.go: jobs are checked against the executors' nodes as of the scheduler's
    last snapshot (at start, then every executorUpdateFrequency); on a fresh install the executor
    reports after the start, so until the next refresh every job is REJECTED for an empty pool."""
    check = armada.submit_check = SubmitCheck(update_frequency=0.5)
    check.report("default")  # the executor's first lease request, just after the scheduler started
    rejected = submit(armada, item()).json()["jobResponseItems"][0]["jobId"]
    assert armada.state(rejected) == "REJECTED"
    assert post(armada, "/v1/job/errors", {"jobIds": [rejected]}).json() == {"jobErrors": {rejected: EMPTY_POOL}}
    _, chunks = events(armada)
    assert [list(c["result"]["message"]) for c in chunks] == [["submitted"], ["queued"], ["failed"]]
    assert_wire("/v1/job-set/{queue}/{id}", chunks[-1]["result"])
    failed = chunks[-1]["result"]["message"]["failed"]
    assert failed["reason"] == EMPTY_POOL and armada_swagger.CAUSES[failed["cause"]] == "Rejected"
    assert (failed["failureCategory"], failed["failureSubcategory"]) == ("internal", "job-rejected")
    time.sleep(0.5)  # the next refresh sees the executor's node
    accepted = submit(armada, item()).json()["jobResponseItems"][0]["jobId"]
    assert armada.state(accepted) == "QUEUED"
    big = {"cpu": "16", "memory": "1Gi"}
    too_big = submit(armada, item(pod_spec(resources={"requests": big, "limits": big}))).json()["jobResponseItems"][0]
    assert armada.state(too_big["jobId"]) == "REJECTED" and armada.jobs[too_big["jobId"]].error == TOO_SMALL
    assert check.reason(pod_spec(), now=check.started) == EMPTY_POOL  # as of the start: nothing reported


def test_the_submit_check_lists_every_pool_in_the_schedulers_order():
    check = SubmitCheck(pools=["default", "gpu"])
    check.report("gpu", allocatable={"cpu": "1", "memory": "1Gi"}, at=check.started)
    big = {"cpu": "2", "memory": "1Gi"}
    assert check.reason(pod_spec(resources={"requests": big, "limits": big})) == (
        EMPTY_POOL + TOO_SMALL.replace("pool default:", "pool gpu:"))
    assert check.reason(pod_spec()) is None


def test_the_job_set_stream_watches_and_reports_errors_as_a_stream_chunk(armada):
    answer, chunks = events(armada, {"errorIfMissing": True})
    assert answer.status_code == 404 and len(chunks) == 1
    assert chunks[0] == {"error": {"grpc_code": 5, "http_code": 404, "http_status": "Not Found",
                                   "message": f"[GetJobSetEvents] Jobset {JOB_SET} for queue {QUEUE} does not exist"}}
    answer, chunks = events(armada, queue="nobody-builds")
    assert answer.status_code == 404 and "Queue nobody-builds does not exist" in chunks[0]["error"]["message"]
    answer, chunks = events(armada, authorization="Basic " + base64.b64encode(b"mallory:x").decode())
    assert answer.status_code == 403 and "lacks permission watch" in chunks[0]["error"]["message"]

    job_id = submit(armada, item()).json()["jobResponseItems"][0]["jobId"]
    with post(armada, f"/v1/job-set/{QUEUE}/{JOB_SET}", {"watch": True}, stream=True) as stream:
        lines = stream.iter_lines()
        assert [list(json.loads(next(lines))["result"]["message"]) for _ in range(2)] == [["submitted"], ["queued"]]
        armada.advance(job_id, "LEASED")
        assert "leased" in json.loads(next(lines))["result"]["message"]


def test_status_and_errors_lag_like_the_lookout_database(armada):
    armada.lookout_lag = 2
    job_id = submit(armada, item()).json()["jobResponseItems"][0]["jobId"]
    states = [post(armada, "/v1/job/status", {"jobIds": [job_id]}).json()["jobStates"][job_id] for _ in range(3)]
    assert [armada_swagger.JOB_STATES[s] for s in states] == ["UNKNOWN", "UNKNOWN", "QUEUED"]
    armada.job_state_names = True
    assert post(armada, "/v1/job/status", {"jobIds": [job_id]}).json() == {"jobStates": {job_id: "QUEUED"}}


# --- the executor -----------------------------------------------------------------------------


def write_entity(root: Path, test_body: str = "assert.equal(add(1, 2), 3);") -> tuple[Path, str]:
    """A tiny JavaScript entity: code, a test, a .dockerignore, an executable script and a symlink."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "add.js").write_text("module.exports.add = (a, b) => a + b;\n")
    (root / "src" / "add.test.js").write_text(textwrap.dedent(f"""\
        const test = require("node:test");
        const assert = require("node:assert/strict");
        const {{ add }} = require("./add");
        test("adds", () => {{ {test_body} }});
        """))
    (root / "run.sh").write_text("#!/bin/sh\nexec node src/add.js\n")
    (root / "run.sh").chmod(0o755)
    (root / "main.js").symlink_to("src/add.js")
    (root / "README.md").write_text("not in the image\n")
    (root / ".dockerignore").write_text("**/*.md\n")
    return root, "FROM node:20\nCOPY . /app\nRUN node --test src/\n"


def build_item(registry, context: Path, dockerfile_text: str, spec: dict | None = None, tar: bytes | None = None,
               **annotations) -> dict:
    """Upload the context per seam 2 (the blob is what the pod fetches) and the job item per seam 3."""
    tar = build_context.context_tar(context, dockerfile_text) if tar is None else tar
    repository = f"builds/shop/{context.name}"
    digest = upload_blob(registry, repository, tar, registry.auth)["digest"]
    tag = entity_image.content_tag(context, dockerfile_text)
    return item(spec, labels={PROJECT_LABEL: "shop", ENTITY_LABEL: context.name, TAG_LABEL: tag},
                annotations={CONTEXT_ANNOTATION: f"{REGISTRY_HOST}/{repository}@{digest}",
                             IMAGE_ANNOTATION: f"{REGISTRY_HOST}/shop/{context.name}:{tag}", **annotations})


def run_build(armada: FakeArmada, registry, context: Path, dockerfile_text: str, *,
              configure=lambda executor: None, **kwargs) -> tuple[Job, FakeExecutor]:
    with FakeExecutor(armada, registry, {("shop", context.name): (context, dockerfile_text)},
                      registry_host=REGISTRY_HOST) as executor:
        configure(executor)
        answer = submit(armada, build_item(registry, context, dockerfile_text, **kwargs))
        assert answer.status_code == 200, answer.text
        job = armada.jobs[answer.json()["jobResponseItems"][0]["jobId"]]
        assert armada.wait_settled(60), armada.jobs
    return job, executor


def test_the_executor_builds_tests_and_pushes_the_image(armada, registry, tmp_path):
    context, dockerfile_text = write_entity(tmp_path / "adder")
    job, executor = run_build(armada, registry, context, dockerfile_text)
    assert (job.state, job.error) == ("SUCCEEDED", ""), job.error
    assert executor.jobs == [job.id] and "# pass 1" in executor.outputs[job.id]
    tag = entity_image.content_tag(context, dockerfile_text)
    assert registry.digest_of("shop/adder", tag) == executor.pushed[job.id]
    assert post(armada, "/v1/job/errors", {"jobIds": [job.id]}).json() == {"jobErrors": {job.id: ""}}
    _, chunks = events(armada)
    assert [list(c["result"]["message"])[0] for c in chunks] == \
        ["submitted", "queued", "leased", "pending", "running", "succeeded"]


@pytest.mark.parametrize("change, fragment", [
    (lambda root: (root / "src" / "extra.js").write_text("1\n"), "hashed files missing from the context: ['src/extra.js']"),
    (lambda root: (root / "src" / "add.js").unlink(), "entries that are not the entity's hashed files: ['src/add.js']"),
    (lambda root: (root / "run.sh").chmod(0o644), "run.sh: mode 755, the file's is 644"),
    (lambda root: (root / "src" / "add.js").write_text("module.exports.add = (a, b) => a - b;\n"),
     "src/add.js: content differs"),
])
def test_a_context_that_is_not_the_entitys_files_is_refused(armada, registry, tmp_path, change, fragment):
    context, dockerfile_text = write_entity(tmp_path / "adder")
    tar = build_context.context_tar(context, dockerfile_text)
    change(context)
    job, executor = run_build(armada, registry, context, dockerfile_text, tar=tar)
    assert job.state == "FAILED" and fragment in job.error, job.error
    assert executor.pushed == {} and job.id not in executor.outputs  # refused before any test ran


def test_context_problems_checks_the_seams_determinism(tmp_path):
    import gzip
    import io
    import tarfile

    context, dockerfile_text = write_entity(tmp_path / "adder")
    good = build_context.context_tar(context, dockerfile_text)
    assert context_problems(good, context, dockerfile_text) == []
    assert "gzip" in context_problems(gzip.compress(good), context, dockerfile_text)[0]
    assert any("Dockerfile" in p for p in context_problems(good, context, "FROM other\n"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(good)) as source, tarfile.open(fileobj=buffer, mode="w") as target:
        for member in reversed(source.getmembers()):
            member.mtime = 5
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    problems = context_problems(buffer.getvalue(), context, dockerfile_text)
    assert "entries are not sorted by path" in problems and any("mtime" in p for p in problems)


def test_a_failing_entity_test_fails_the_job_with_its_output(armada, registry, tmp_path):
    context, dockerfile_text = write_entity(tmp_path / "adder", "assert.equal(add(2, 2), 5, 'two and two make five');")
    job, executor = run_build(armada, registry, context, dockerfile_text)
    assert job.state == "FAILED" and executor.pushed == {}
    assert job.error.startswith("Container build failed with exit code 1 because Error: ")
    assert "two and two make five" in job.error and "not ok 1 - adds" in job.error
    assert job.error[len("Container build failed with exit code 1 because Error: "):-1] == \
        termination_tail(executor.outputs[job.id])
    failed = [c["result"]["message"]["failed"] for c in events(armada)[1] if "failed" in c["result"]["message"]]
    assert failed[0]["containerStatuses"][0]["name"] == "build" and "two and two" in failed[0]["reason"]


def test_without_fallback_to_logs_the_output_never_reaches_armada(armada, registry, tmp_path):
    """The kubelet writes a container's log into its termination message only with FallbackToLogsOnError;
    Armada's failure reason is built from that message, so a build pod without it fails silently."""
    context, dockerfile_text = write_entity(tmp_path / "adder", "assert.equal(add(2, 2), 5, 'two and two make five');")
    job, _ = run_build(armada, registry, context, dockerfile_text, spec=pod_spec(terminationMessagePolicy="File"))
    assert job.state == "FAILED" and job.error == "Container build failed with exit code 1 because Error: \n"


def test_termination_tail_keeps_what_the_kubelet_keeps():
    lines = [f"line {n}" for n in range(200)]
    assert termination_tail("\n".join(lines)).splitlines() == lines[-80:]
    assert termination_tail("x" * 5000) == "x" * 2048


def test_forced_failure_and_hang_options(armada, registry, tmp_path):
    context, dockerfile_text = write_entity(tmp_path / "adder")
    job, _ = run_build(armada, registry, context, dockerfile_text,
                       configure=lambda executor: executor.fail.update(adder="not ok 1 - forced"))
    assert job.state == "FAILED" and "not ok 1 - forced" in job.error

    with FakeExecutor(armada, registry, {("shop", "adder"): (context, dockerfile_text)},
                      registry_host=REGISTRY_HOST) as executor:
        executor.hang.add("adder")
        job_id = submit(armada, build_item(registry, context, dockerfile_text)).json()["jobResponseItems"][0]["jobId"]
        assert armada.wait_for(lambda: armada.jobs[job_id].state == "RUNNING", 30)
        time.sleep(0.3)
        assert armada.state(job_id) == "RUNNING"
        executor.release()
        assert armada.wait_settled(60) and armada.state(job_id) == "SUCCEEDED"
        assert executor.jobs == [job_id]


def test_cancel_needs_the_cancel_verb_and_stops_the_job(armada, registry, tmp_path):
    context, dockerfile_text = write_entity(tmp_path / "adder")
    with FakeExecutor(armada, registry, {("shop", "adder"): (context, dockerfile_text)},
                      registry_host=REGISTRY_HOST) as executor:
        executor.hang_all = True
        job_id = submit(armada, build_item(registry, context, dockerfile_text)).json()["jobResponseItems"][0]["jobId"]
        assert armada.wait_for(lambda: armada.jobs[job_id].state == "RUNNING", 30)
        cancel = {"queue": QUEUE, "jobSetId": JOB_SET, "jobIds": [job_id], "reason": "pulumi up timed out"}
        refused = post(armada, "/v1/job/cancel", cancel)  # the queue grants submit and watch only
        assert refused.status_code == 403 and "lacks permission cancel" in refused.json()["message"]
        assert post(armada, "/v1/job/cancel", {**cancel, "reason": "x" * 51}).status_code == 400
        armada.add_queue(QUEUE, submitters=[USER], watchers=[USER], cancellers=[USER])
        answer = post(armada, "/v1/job/cancel", cancel)
        assert answer.status_code == 200 and answer.json() == {"cancelledIds": [job_id]}
        assert_wire("/v1/job/cancel", answer.json())
        assert armada.wait_settled(10) and armada.state(job_id) == "CANCELLED"
        time.sleep(0.2)
        assert armada.state(job_id) == "CANCELLED" and executor.pushed == {}
    kinds = [list(c["result"]["message"])[0] for c in events(armada)[1]]
    assert kinds[-2:] == ["cancelling", "cancelled"]


def test_build_cluster_starts_the_three_together(tmp_path):
    context, dockerfile_text = write_entity(tmp_path / "src" / "adder")
    with build_cluster(tmp_path / "registry", {("shop", "adder"): (context, dockerfile_text)},
                       registry_host=REGISTRY_HOST, queues=[QUEUE], users=[USER], verbs=("submit", "watch"),
                       authorization=AUTH) as cluster:
        answer = submit(cluster.armada, build_item(cluster.registry, context, dockerfile_text))
        assert answer.status_code == 200, answer.text
        assert cluster.armada.wait_settled(60)
        (job,) = cluster.armada.jobs.values()
        assert job.state == "SUCCEEDED" and cluster.executor.jobs == [job.id]
        assert cluster.registry.digest_of("shop/adder", job.item["labels"][TAG_LABEL]) == cluster.executor.pushed[job.id]
        logs = requests.post(cluster.binoculars.url + "/v1/binoculars/log", timeout=10, headers={"Authorization": AUTH},
                             json={"jobId": job.id, "podNumber": 0, "podNamespace": NAMESPACE,
                                   "logOptions": {"tailLines": 3}})
        assert logs.status_code == 200
        assert armada_swagger.response_errors("binocularsLogResponse", logs.json(), api="binoculars") == []
        assert [line["line"] for line in logs.json()["log"]] == cluster.executor.outputs[job.id].splitlines()[-3:]


@pytest.mark.parametrize("body, status, fragment", [
    ({"jobId": "01hzzzzzzzzzzzzzzzzzzzzzzz", "podNamespace": NAMESPACE, "logOptions": {}}, 404, "cleaned up"),
    ({"jobId": "x", "podNamespace": NAMESPACE, "logOptions": {"tailLine": 3}}, 400, "logOptions"),
    ({"jobId": "x", "podNamespace": NAMESPACE}, 500, "nil pointer"),
])
def test_binoculars_refuses_as_upstream_does(armada, registry, body, status, fragment):
    with FakeExecutor(armada, registry, {}, registry_host=REGISTRY_HOST) as executor, \
            FakeBinoculars(executor) as binoculars:
        answer = requests.post(binoculars.url + "/v1/binoculars/log", json=body, timeout=10)
    assert answer.status_code == status and fragment in answer.json()["message"], answer.text


def test_the_builders_job_item_passes_the_fake_executor(armada, registry):
    """Seams 3 and 6: the job item components/build_job.py makes for a real entity fetches its context and
    builds (its pod's admission is the real API server's: e2e/test_scenario.py step 7, e2e/test_security.py)."""
    from components import build_job

    context = ROOT / "entities" / "shop" / "cart"
    dockerfile_text = (context / "Dockerfile").read_text()
    tar = build_context.context_tar(context, dockerfile_text)
    digest = upload_blob(registry, "builds/shop/cart", tar, registry.auth)["digest"]
    job_item = build_job.build_job_item(
        project="shop", entity="cart", content_tag=entity_image.content_tag(context, dockerfile_text),
        context_digest=digest, registry_host=REGISTRY_HOST, namespace=NAMESPACE, secret_name="build-registry",
        settings=build_job.BuildSettings())
    with FakeExecutor(armada, registry, {("shop", "cart"): (context, dockerfile_text)}, registry_host=REGISTRY_HOST) as executor:
        answer = submit(armada, job_item)
        assert answer.status_code == 200, answer.text
        assert armada.wait_settled(120)
    (job,) = armada.jobs.values()
    assert (job.state, job.error) == ("SUCCEEDED", ""), job.error
    assert "# fail 0" in executor.outputs[job.id]
