"""The in-cluster build's Pulumi side (issue 13 item 4): the deterministic context tar
(components/build_context.py), the Armada jobs client (components/armada/jobs_api.py) and the
EntityBuild provider (components/entity_build.py), against a real docker-registry and a stand-in
Armada that records every request."""
from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Callable, Optional

import pytest
import requests

from components import build_context, entity_build
from components.armada.jobs_api import JOB_STATES, JobsApiError, JobsClient, state_name
from components.entity_build import BuildFailed, EntityBuildProvider, job_item_of, job_item_text
from components.entity_image import content_tag, context_files
from components.registry_api import Credentials, RegistryError
from tests.conftest import create_in_provider_process
from tests.fake_armada import FakeArmada
from tests.registry_server import (  # noqa: F401 (fixture)
    CountingProxy, DrippingServer, ScriptedServer, build_oci_image, drip, free_port, registry)

ARMADA_AUTH = "Basic " + base64.b64encode(b"cloudstation-builds:armada-pw").decode()
DOCKERFILE_TEXT = "FROM node:20\nCOPY . .\nRUN node --test\n"
QUEUE, JOB_SET = "shop-builds", "shop-test"


# --- Armada: F's fake (tests/fake_armada.py), driven by small executors --------------------------


SUBMITTER = "cloudstation-builds"


@contextlib.contextmanager
def armada_with(executor: Optional[Callable] = None, *, cancel: bool = True, lookout_lag: int = 0):
    """The fake Armada with the build queue (the submitter may submit, and cancel when `cancel`),
    basic auth required, and `executor(armada, job)` driving each submitted job on its thread."""
    with FakeArmada() as armada:
        armada.authorization = ARMADA_AUTH
        armada.add_queue(QUEUE, submitters=[SUBMITTER], cancellers=[SUBMITTER] if cancel else [])
        armada.lookout_lag = lookout_lag
        if executor is not None:
            armada.executor = lambda job: executor(armada, job)
        yield armada


def succeeding(push: Callable[[dict], str]):
    """An executor that runs the job and, before it succeeds, pushes what `push(item)` pushes."""
    def run(armada, job):
        for state in ("LEASED", "PENDING", "RUNNING"):
            armada.advance(job.id, state)
        push(job.item)
        armada.advance(job.id, "SUCCEEDED")
    return run


def failing(reason: str):
    def run(armada, job):
        armada.advance(job.id, "LEASED")
        armada.advance(job.id, "FAILED", reason=reason)
    return run


def hanging(armada, job):
    for state in ("LEASED", "PENDING", "RUNNING"):
        armada.advance(job.id, state)


def sent(armada, path: str) -> list[dict]:
    return [body for _method, seen, body in armada.requests if seen == path]


# --- helpers --------------------------------------------------------------------------------------


def make_context(directory: Path, extra: str = "") -> Path:
    """A small JavaScript entity: sources, a test, an executable script, a symlink, a long and a
    non-ASCII name, a file its .dockerignore drops, and its own Dockerfile (replaced by the text)."""
    (directory / "src").mkdir(parents=True, exist_ok=True)
    (directory / "node_modules" / "x").mkdir(parents=True, exist_ok=True)
    (directory / "src" / "index.js").write_text("module.exports = 1;\n" + extra)
    (directory / "src" / "index.test.js").write_text("require('node:test');\n")
    (directory / "run.sh").write_text("#!/bin/sh\nexec node .\n")
    (directory / "run.sh").chmod(0o755)
    (directory / ("deep-" + "d" * 60) / ("n" * 90)).mkdir(parents=True, exist_ok=True)
    (directory / ("deep-" + "d" * 60) / ("n" * 90) / "file.txt").write_text("long path\n")
    (directory / "données.txt").write_text("é\n")
    (directory / "node_modules" / "x" / "index.js").write_text("ignored\n")
    (directory / ".dockerignore").write_text("node_modules\n")
    (directory / "Dockerfile").write_text("FROM something-else\n")
    if not (directory / "current").is_symlink():
        os.symlink("src/index.js", directory / "current")
    return directory


def job_item(context_repository: str, digest: str, tag: str, namespace: str = "cloudstation-builds") -> dict:
    return {
        "namespace": namespace,
        "priority": 1,
        "labels": {"cloudstation.io/project": "shop", "cloudstation.io/entity": "cart", "cloudstation.io/content-tag": tag},
        "annotations": {
            "cloudstation.io/build-context": f"registry.cloudstation-registry.svc:5000/{context_repository}@{digest}",
            "cloudstation.io/build-image": f"registry.cloudstation-registry.svc:5000/shop/cart:{tag}",
        },
        "podSpec": {"restartPolicy": "Never", "containers": [{
            "name": "build", "image": "builder@sha256:" + "a" * 64,
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]},
    }


BUILDER = {"image": "builder@sha256:" + "a" * 64, "fetchImage": "fetch@sha256:" + "f" * 64}


def props_for(context: Path, registry_url: str, registry_auth: str, armada_url: str, builder: dict = BUILDER,
              **overrides) -> dict:
    """The provider's inputs as infra/builds.py makes them: the tag hashes the builder too."""
    tar = build_context.context_tar(context, DOCKERFILE_TEXT)
    digest, tag = build_context.context_digest(tar), content_tag(context, DOCKERFILE_TEXT, builder)
    context_repository = build_context.context_repository("", "shop", "cart")
    props = {
        "contentTag": tag, "contextDigest": digest, "contextDir": str(context), "dockerfileText": DOCKERFILE_TEXT,
        "repository": "shop/cart", "contextRepository": context_repository,
        "pushRef": f"registry.cloudstation-registry.svc:5000/shop/cart:{tag}", "pullHost": "localhost:32000",
        "registryUrl": registry_url, "registryAuthorization": registry_auth,
        "armadaUrl": armada_url, "armadaAuthorization": ARMADA_AUTH, "queue": QUEUE, "jobSetId": JOB_SET,
        "jobItem": job_item_text(job_item(context_repository, digest, tag)), "builder": builder,
        "timeoutSeconds": 20, "pollSeconds": 0.05,
        # As for the managed registry, whose gate leaves the project's own builds the only writer.
        "adoptExisting": True,
    }
    return {**props, **overrides}


def basic(registry) -> str:
    return Credentials(registry.username, registry.password).basic()


def push_image(registry, tmp_path: Path, repository: str, tag: str, payload: bytes = b"image") -> str:
    return registry.push(build_oci_image(tmp_path / f"layout-{tag}", tag, payload), repository, tag)


@pytest.fixture
def logged(monkeypatch) -> list[str]:
    """What the provider sends through pulumi.log (info and warn)."""
    messages: list[str] = []
    monkeypatch.setattr(entity_build.pulumi.log, "info", lambda message, *a, **k: messages.append(message))
    monkeypatch.setattr(entity_build.pulumi.log, "warn", lambda message, *a, **k: messages.append("warn: " + message))
    return messages


# --- the context tar ------------------------------------------------------------------------------


def _members(tar: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        return archive.getmembers()


def test_context_tar_is_exactly_the_hashed_files_plus_the_dockerfile(tmp_path):
    context = make_context(tmp_path / "cart")
    tar = build_context.context_tar(context, DOCKERFILE_TEXT)
    members = _members(tar)
    expected = sorted({*context_files(context), "Dockerfile"})
    assert [m.name for m in members] == expected
    assert "node_modules/x/index.js" not in expected and ".dockerignore" in expected  # the ignore rules applied
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        for member in members:
            if member.name == "Dockerfile":
                assert archive.extractfile(member).read() == DOCKERFILE_TEXT.encode()  # the text, not the kept file
            elif member.issym():
                assert member.linkname == os.readlink(context / member.name) and member.mode == 0o755
            else:
                assert member.isfile() and archive.extractfile(member).read() == (context / member.name).read_bytes()
                assert member.mode == (0o755 if member.name == "run.sh" else 0o644)
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
    assert not any(m.isdir() for m in members)
    assert tar[257:262] == b"ustar" and not tar.startswith(b"\x1f\x8b")  # a plain tar, not gzip
    assert build_context.context_digest(tar) == "sha256:" + __import__("hashlib").sha256(tar).hexdigest()


def test_context_tar_is_the_same_bytes_whatever_the_mtime_umask_owner_or_creation_order(tmp_path):
    first = make_context(tmp_path / "a")
    reference = build_context.context_tar(first, DOCKERFILE_TEXT)
    assert build_context.context_tar(first, DOCKERFILE_TEXT) == reference  # twice: same bytes

    # The same files made in another order, with other times, permissions (umask) and owner.
    old = os.umask(0o077)
    try:
        second = tmp_path / "b"
        (second / "src").mkdir(parents=True)
        (second / "src" / "index.test.js").write_text("require('node:test');\n")
        make_context(second)
    finally:
        os.umask(old)
    (second / "run.sh").chmod(0o700)  # still executable, other bits differ
    (second / "src" / "index.js").chmod(0o600)
    for path in second.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
        if os.geteuid() == 0:
            os.lchown(path, 4321, 4321)
    assert build_context.context_tar(second, DOCKERFILE_TEXT) == reference

    # It can fail: content, the exec bit and the Dockerfile text all change the bytes.
    (second / "run.sh").chmod(0o600)
    assert build_context.context_tar(second, DOCKERFILE_TEXT) != reference
    (second / "run.sh").chmod(0o700)
    assert build_context.context_tar(second, DOCKERFILE_TEXT + "# x\n") != reference
    (second / "src" / "index.js").write_text("module.exports = 2;\n")
    assert build_context.context_tar(second, DOCKERFILE_TEXT) != reference


def test_context_manifest_is_an_oci_artifact_with_the_empty_config():
    tar_digest = "sha256:" + "b" * 64
    manifest = json.loads(build_context.context_manifest(tar_digest, 10240))
    assert manifest == {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.cloudstation.build-context.v1",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                   "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": tar_digest, "size": 10240}],
    }
    assert build_context.context_repository("", "shop", "cart") == "builds/shop/cart"
    assert build_context.context_repository("team/", "shop", "cart") == "team/builds/shop/cart"


# --- the provider against the registry and Armada -------------------------------------------------


def test_a_tag_the_registry_has_needs_no_job(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        digest = push_image(registry, tmp_path, "shop/cart", props["contentTag"])
        result = EntityBuildProvider().create(props)
        assert armada.requests == []
    assert result.outs["digest"] == digest and result.outs["jobId"] == ""
    assert result.outs["ref"] == f"localhost:32000/shop/cart:{props['contentTag']}@{digest}"
    assert result.id == f"shop/cart:{props['contentTag']}"
    assert registry.digest_of("builds/shop/cart", props["contentTag"]) is None  # nothing uploaded either


def test_a_missing_tag_uploads_the_context_submits_one_job_and_reads_the_digest(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v2\n")
    pushed: dict[str, str] = {}
    push = lambda item: pushed.setdefault("digest", push_image(  # noqa: E731 - the executor's push
        registry, tmp_path, "shop/cart", item["labels"]["cloudstation.io/content-tag"]))
    with armada_with(succeeding(push), lookout_lag=1) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        result = EntityBuildProvider().create(props)
        # The item as rendered, with its deterministic clientId (one job per content: tests/test_build_fixes.py).
        item = {**job_item_of(props), "clientId": entity_build.client_id(props)}
        assert sent(armada, "/v1/job/submit") == [{"queue": QUEUE, "jobSetId": JOB_SET, "jobRequestItems": [item]}]
        (job_id,) = armada.jobs
        assert sent(armada, "/v1/job/status") and all(b == {"jobIds": [job_id]} for b in sent(armada, "/v1/job/status"))
    assert result.outs["digest"] == pushed["digest"] == registry.digest_of("shop/cart", props["contentTag"])
    assert result.outs["jobId"] == job_id
    # The context artifact: the tagged manifest names the tar, and the blob is the tar.
    session = requests.Session()
    manifest = session.get(f"{registry.url}/v2/builds/shop/cart/manifests/{props['contentTag']}", auth=registry.auth,
                           headers={"Accept": build_context.OCI_MANIFEST}).json()
    assert manifest["artifactType"] == build_context.CONTEXT_ARTIFACT_TYPE
    assert manifest["layers"][0]["digest"] == props["contextDigest"]
    blob = session.get(f"{registry.url}/v2/builds/shop/cart/blobs/{props['contextDigest']}", auth=registry.auth).content
    assert blob == build_context.context_tar(context, DOCKERFILE_TEXT)
    # Progress went through pulumi.log: the submission and each state change once.
    assert any("submitted Armada job" in m for m in logged)
    states = [m.rsplit(" is ", 1)[1] for m in logged if f"job {job_id} is " in m]
    assert states[0] == "UNKNOWN" and states[-1] == "SUCCEEDED" and len(states) == len(set(states))


def test_a_context_already_in_the_registry_is_not_uploaded_again(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v3\n")
    with CountingProxy(registry.url) as proxy:
        with armada_with(failing("flaky node")) as armada:  # the first attempt fails
            props = props_for(context, proxy.url, basic(registry), armada.url)
            with pytest.raises(BuildFailed, match="flaky node"):
                EntityBuildProvider().create(props)
        first, sent_first = proxy.reset()
        assert any(s.method == "PUT" and "/blobs/uploads/" in s.path for s in first)
        with armada_with(succeeding(lambda item: push_image(registry, tmp_path, "shop/cart", props["contentTag"]))) as armada:
            props = {**props, "armadaUrl": armada.url}
            EntityBuildProvider().create(props)
            assert len(sent(armada, "/v1/job/submit")) == 1
        second, sent_second = proxy.reset()
    uploads = [s for s in second if "/blobs/uploads/" in s.path]
    assert uploads == [], uploads
    assert [s.method for s in second if "/blobs/" in s.path] == ["HEAD", "HEAD"]  # config and tar: both there
    assert sent_second < sent_first - len(build_context.context_tar(context, DOCKERFILE_TEXT)) + 4096


def test_a_failed_job_fails_with_the_job_error_text_and_the_pod_log(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v4\n")
    output = "not ok 1 - adds an item\n  AssertionError: expected 2 items, got 1\n# fail 1"
    log = {"log": [{"timestamp": "2026-01-01T00:00:00Z", "line": line} for line in ("npm test", "# fail 1")]}
    with armada_with(failing(output)) as armada, ScriptedServer(
            lambda seen: (200, {"Content-Type": "application/json"}, json.dumps(log).encode())) as binoculars:
        props = props_for(context, registry.url, basic(registry), armada.url, binocularsUrl=binoculars.url)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        (job_id,) = armada.jobs
        assert sent(armada, "/v1/job/errors") == [{"jobIds": [job_id]}]
        assert [s.path for s in binoculars.seen] == ["/v1/binoculars/log"]
        assert binoculars.seen[0].headers["Authorization"] == ARMADA_AUTH
    assert output in str(error.value) and f"Armada job {job_id} FAILED" in str(error.value)
    assert "pod log" in str(error.value) and "npm test\n# fail 1" in str(error.value)
    assert registry.digest_of("shop/cart", props["contentTag"]) is None


def test_a_job_reported_succeeded_without_the_image_is_a_clear_failure(registry, tmp_path, logged):
    """Issue 20 finding 11: Armada says SUCCEEDED but nothing was pushed (a pod that pushed
    elsewhere): the build fails naming the job and the tag, never an `...@None` reference."""
    context = make_context(tmp_path / "cart", extra="// pushed elsewhere\n")
    with armada_with(succeeding(lambda item: None)) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        (job_id,) = armada.jobs
    assert (f"Armada job {job_id} succeeded but the registry at {registry.url} has no tag {props['contentTag']} "
            f"in shop/cart: did the job push to {props['pushRef']}?") in str(error.value)


@pytest.mark.parametrize("tag", ["-leading-dash", ".dot", "a" * 129, "two words", "../../platform/x", "v1:latest",
                                 "t\u00e9st", "tag\n"])
def test_a_malformed_content_tag_is_refused_before_any_request(tmp_path, tag):
    """Issue 20 finding 11: the tag goes into registry paths and the job; one that is not an image
    tag is refused by Check and by Create before anything reaches the registry or Armada."""
    with armada_with() as armada, CountingProxy(armada.url) as registry_front:
        props = props_for(make_context(tmp_path / "cart"), registry_front.url, "Basic eDp5", armada.url, contentTag=tag)
        failures = {f.property: f.reason for f in EntityBuildProvider().check({}, props).failures}
        assert failures["contentTag"] == f"must be an image tag, got {tag!r}"
        with pytest.raises(BuildFailed, match="contentTag must be an image tag"):
            EntityBuildProvider().create(props)
        assert armada.requests == [] and registry_front.seen == []


def test_an_unreachable_armada_fails_naming_its_url(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v5\n")
    url = f"http://127.0.0.1:{free_port()}"
    props = props_for(context, registry.url, basic(registry), url, timeoutSeconds=1)
    with pytest.raises(JobsApiError) as error:
        EntityBuildProvider().create(props)
    assert f"{url}/v1/job/submit" in str(error.value) and f"reachable at {url}" in str(error.value)
    assert "armada-pw" not in str(error.value)


def test_a_job_that_does_not_finish_in_time_fails_clearly_and_is_cancelled(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v6\n")
    with armada_with(hanging) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url, timeoutSeconds=1, pollSeconds=0.1)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        (job_id,) = armada.jobs
        assert sent(armada, "/v1/job/cancel") == [
            {"queue": QUEUE, "jobSetId": JOB_SET, "jobIds": [job_id], "reason": "pulumi up gave up after 1 s"}]
        assert armada.state(job_id) == "CANCELLED"
    assert "timed out after 1 s (timeoutSeconds)" in str(error.value) and "last state RUNNING" in str(error.value)
    assert "it was cancelled" in str(error.value)


def test_a_context_that_changed_since_the_program_ran_submits_nothing(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v7\n")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        (context / "src" / "index.js").write_text("changed meanwhile\n")
        with pytest.raises(BuildFailed, match="changed after the program computed its digest"):
            EntityBuildProvider().create(props)
        assert armada.requests == []


def test_refresh_checks_the_registry_and_a_gone_tag_reads_as_deleted(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// v8\n")
    props = props_for(context, registry.url, basic(registry), "http://127.0.0.1:1")
    digest = push_image(registry, tmp_path, "shop/cart", props["contentTag"], b"v8")
    outs = {**props, "digest": digest, "ref": "old", "jobId": ""}
    read = EntityBuildProvider().read(f"shop/cart:{props['contentTag']}", outs)
    assert read.id == f"shop/cart:{props['contentTag']}" and read.outs["digest"] == digest
    assert read.outs["ref"].endswith(f":{props['contentTag']}@{digest}")
    deleted = requests.delete(f"{registry.url}/v2/shop/cart/manifests/{digest}", auth=registry.auth)
    assert deleted.status_code == 202
    gone = EntityBuildProvider().read(f"shop/cart:{props['contentTag']}", outs)
    assert gone.id == "" and gone.outs == {}  # the engine drops it; the next `pulumi up` rebuilds
    assert any("no longer in the registry" in m for m in logged)


def test_new_registry_access_is_an_update_that_refresh_then_uses(registry, tmp_path, logged):
    """A same step keeps the old outputs and refresh reads with them (pulumi step.go SameStep.Apply,
    dynamic/__main__.py Read): a registry address that changed is an update (no job: the tag is
    there), after which refresh goes to the new address."""
    context = make_context(tmp_path / "cart", extra="// moved\n")
    gone = f"http://127.0.0.1:{free_port()}"  # where the registry was reached when the image was built
    old_props = props_for(context, gone, basic(registry), "http://127.0.0.1:1")  # Armada: any job would fail
    digest = push_image(registry, tmp_path, "shop/cart", old_props["contentTag"], b"moved")
    old_outs = {**old_props, "digest": digest, "ref": "old", "jobId": "j-1"}
    with pytest.raises(Exception, match="cannot reach"):
        EntityBuildProvider().read(f"shop/cart:{old_props['contentTag']}", old_outs)  # the stale place
    news = {**old_props, "registryUrl": registry.url}
    diff = EntityBuildProvider().diff("id", old_outs, news)
    assert diff.changes is True and diff.replaces == []
    updated = EntityBuildProvider().update("id", old_outs, news)
    assert updated.outs["registryUrl"] == registry.url and updated.outs["digest"] == digest
    assert updated.outs["jobId"] == "" and any("nothing to build" in m for m in logged)
    read = EntityBuildProvider().read(f"shop/cart:{old_props['contentTag']}", updated.outs)
    assert read.outs["digest"] == digest and read.outs["registryUrl"] == registry.url


def test_a_tag_found_on_create_is_taken_only_where_the_projects_own_builds_are_its_only_writer(registry, tmp_path, logged):
    """Issue 20 step 3: without `adoptExisting` (a registry whose rights this program does not set), a
    tag someone else pushed before the build is refused, not deployed untested."""
    context = make_context(tmp_path / "cart", extra="// foreign\n")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url, adoptExisting=False)
        foreign = push_image(registry, tmp_path, "shop/cart", props["contentTag"], b"pushed by another tenant")
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        assert armada.requests == []
    assert str(error.value) == (
        f"shop/cart:{props['contentTag']} is already in the registry at {registry.url} ({foreign}) before this stack "
        "built it, and this registry's rights do not make the project's own builds its only possible writer "
        "(adoptExisting is off): refusing to deploy an image whose build and tests this stack did not see. Remove the "
        "tag and run `pulumi up` again to build it")
    taken = EntityBuildProvider().create({**props, "adoptExisting": True})
    assert taken.outs["digest"] == foreign


def moved_tag(registry, tmp_path, name: str) -> tuple[dict, str, str]:
    """An EntityBuild's recorded outputs (digest `built`) whose tag then moved to `moved`."""
    context = make_context(tmp_path / name, extra=f"// {name}\n")
    props = props_for(context, registry.url, basic(registry), "http://127.0.0.1:1")  # Armada: any job would fail
    built = push_image(registry, tmp_path, "shop/cart", props["contentTag"], f"built {name}".encode())
    moved = push_image(registry, tmp_path / "other", "shop/cart", props["contentTag"], f"moved {name}".encode())
    assert built != moved
    return {**props, "digest": built, "ref": "recorded", "jobId": "j-1"}, built, moved


def test_refresh_never_switches_a_recorded_digest(registry, tmp_path, logged):
    """Issue 20 step 3: `pulumi refresh` used to take whatever digest the tag had."""
    outs, built, moved = moved_tag(registry, tmp_path, "refreshed")
    with pytest.raises(BuildFailed) as error:
        EntityBuildProvider().read(f"shop/cart:{outs['contentTag']}", outs)
    assert f"the registry's tag now resolves to {moved}, but this stack built and recorded {built}" in str(error.value)
    assert "nothing was changed" in str(error.value)


def test_an_update_never_switches_a_recorded_digest(registry, tmp_path, logged):
    """... nor an update, e.g. after rotating the registry password (a change of registry access)."""
    outs, built, moved = moved_tag(registry, tmp_path, "updated")
    news = {k: v for k, v in outs.items() if k not in ("digest", "ref", "jobId")}
    news["registryAuthorization"] = basic(registry) + " "  # rotated credentials: an update, no replacement
    assert EntityBuildProvider().diff("id", outs, news).replaces == []
    with pytest.raises(BuildFailed, match=f"resolves to {moved}, but this stack built and recorded {built}"):
        EntityBuildProvider().update("id", outs, news)
    same = EntityBuildProvider().update("id", {**outs, "digest": moved}, news)  # a recorded digest still there is fine
    assert same.outs["digest"] == moved


def test_delete_removes_nothing(tmp_path):
    # Every URL points at a closed port: any request would raise.
    props = props_for(make_context(tmp_path / "cart"), "http://127.0.0.1:1", "Basic eDp5", "http://127.0.0.1:1")
    assert EntityBuildProvider().delete("shop/cart:x", props) is None


# --- check, diff, preview ----------------------------------------------------------------------


def test_diff_replaces_only_on_the_content_tag_or_the_builder(tmp_path):
    old = props_for(make_context(tmp_path / "cart"), "http://127.0.0.1:1", "Basic eDp5", "http://127.0.0.1:2")
    provider = EntityBuildProvider()
    for key, value in [("armadaUrl", "https://armada.example"), ("armadaAuthorization", "Basic b3RoZXI6cHc="),
                       ("timeoutSeconds", 99), ("pollSeconds", 9), ("jobSetId", "shop-other"),
                       ("jobItem", job_item_text({**job_item_of(old), "priority": 2})), ("contextDir", "../elsewhere")]:
        diff = provider.diff("id", old, {**old, key: value})
        assert diff.changes is False and diff.replaces == [], key
    # How the registry is reached: an update (outputs rewritten for refresh), never a replacement.
    for key, value in [("registryUrl", "https://registry.example"), ("registryAuthorization", "Basic b3RoZXI6cHc="),
                       ("registryTunnel", {"namespace": "cloudstation", "selector": {"app": "registry"}, "port": 5000})]:
        diff = provider.diff("id", old, {**old, key: value})
        assert diff.changes is True and diff.replaces == [], key
    for key, value in [("contentTag", "f" * 32), ("builder", {"image": "builder@sha256:" + "c" * 64})]:
        diff = provider.diff("id", old, {**old, key: value})
        assert diff.changes is True and diff.replaces == [key] and diff.delete_before_replace is False


def test_check_reports_bad_inputs_and_accepts_a_previews_unknowns(tmp_path):
    from pulumi.runtime import rpc

    good = props_for(make_context(tmp_path / "cart"), "http://127.0.0.1:1", "Basic eDp5", "http://127.0.0.1:2")
    provider = EntityBuildProvider()
    assert provider.check({}, good).failures == []
    unknown = {**good, "contentTag": rpc.UNKNOWN, "contextDigest": rpc.UNKNOWN, "jobItem": rpc.UNKNOWN,
               "armadaAuthorization": rpc.UNKNOWN}
    assert provider.check({}, unknown).failures == []
    item = job_item_of(good)
    other = job_item_text({**item, "annotations": {**item["annotations"],
                                                   "cloudstation.io/build-context": "r:5000/builds/shop/cart@sha256:" + "9" * 64}})
    bad = {**good, "jobItem": other, "armadaUrl": "armada:8080", "timeoutSeconds": 0, "contextDigest": "sha256:x"}
    failures = {f.property: f.reason for f in provider.check({}, bad).failures}
    assert set(failures) == {"armadaUrl", "timeoutSeconds", "contextDigest", "jobItem"}
    assert "must be http(s)://host[:port]" in failures["armadaUrl"] and "positive" in failures["timeoutSeconds"]
    failures = {f.property: f.reason for f in provider.check({}, {**good, "jobItem": other}).failures}
    assert "the pod would fetch another context" in failures["jobItem"]
    for not_text in [item, "{not json", json.dumps({"namespace": "x"})]:  # a map, bad JSON, no podSpec
        failures = {f.property: f.reason for f in provider.check({}, {**good, "jobItem": not_text}).failures}
        assert "must be the JSON text of an apiJobSubmitRequestItem" in failures["jobItem"], not_text
    assert provider.check({}, {k: v for k, v in good.items() if k != "queue"}).failures[0].property == "queue"


def test_check_and_diff_make_no_request(tmp_path):
    """A preview runs only Check and Diff (see the next test): neither may reach the registry or Armada."""
    with armada_with() as armada, CountingProxy(armada.url) as registry_front:
        props = props_for(make_context(tmp_path / "cart"), registry_front.url, "Basic eDp5", armada.url)
        provider = EntityBuildProvider()
        provider.check({}, props)
        provider.diff("id", props, {**props, "contentTag": "e" * 32})
        assert armada.requests == [] and registry_front.seen == []


def test_the_pinned_dynamic_provider_host_does_not_support_preview():
    """Preview submits nothing because the engine never calls a dynamic provider's Create or Update
    in a preview: the host's Configure answers without supportsPreview (pulumi 3.272.0
    sdk/python/lib/pulumi/dynamic/__main__.py), and the engine then returns the inputs itself
    (pulumi/pulumi pkg/resource/plugin/provider_plugin.go Create/Update). Fails if that changes."""
    import runpy
    from unittest import mock

    from pulumi.runtime.proto import provider_pb2

    with mock.patch("grpc.server"), mock.patch("threading.Event.wait", side_effect=KeyboardInterrupt), \
            mock.patch("sys.stdout") as stdout:
        stdout.buffer.write = lambda _b: None
        host = runpy.run_module("pulumi.dynamic.__main__", run_name="dynamic_host")
    servicer = host["DynamicResourceProviderServicer"]()
    answer = servicer.Configure(provider_pb2.ConfigureRequest(), None)
    assert answer.supportsPreview is False and answer.acceptSecrets is False


def test_the_provider_survives_pulumi_serialization_and_runs_from_infra(registry, tmp_path):
    """Pulumi pickles the provider and runs it in its own process in the program's directory
    (infra/), where `components` is not importable."""
    from pulumi.dynamic.dynamic import serialize_provider

    serialized = serialize_provider(EntityBuildProvider())
    assert serialized == serialize_provider(EntityBuildProvider())  # deterministic: no spurious diffs
    context = make_context(tmp_path / "cart", extra="// v9\n")
    props = props_for(context, registry.url, basic(registry), "http://127.0.0.1:1")
    digest = push_image(registry, tmp_path, "shop/cart", props["contentTag"], b"v9")
    assert create_in_provider_process(serialized, props)["outs"]["digest"] == digest


def test_logging_outside_an_engine_never_fails_a_build(monkeypatch, capsys):
    def broken(*_a, **_k):
        raise RuntimeError("no engine")

    monkeypatch.setattr(entity_build.pulumi.log, "info", broken)
    entity_build.log("job is RUNNING")
    assert "info: job is RUNNING" in capsys.readouterr().err


# --- the jobs client ------------------------------------------------------------------------------


def test_job_states_are_read_as_the_gateway_sends_them():
    # JSONBuiltin sends enum numbers; the swagger documents names: both mean the same state.
    assert [state_name(i) for i in range(len(JOB_STATES))] == list(JOB_STATES)
    assert state_name("FAILED") == "FAILED" and state_name(42) == "UNKNOWN" and state_name(None) == "UNKNOWN"
    assert JOB_STATES.index("SUCCEEDED") == 3 and JOB_STATES.index("FAILED") == 4  # submit.proto enum JobState


def test_a_submission_is_not_repeated_after_the_server_may_have_seen_it():
    def drop(_seen):
        raise ConnectionResetError("the connection drops before an answer")  # the server may have seen it

    with ScriptedServer(drop) as server:
        client = JobsClient(server.url, timeout=2, wait_seconds=5, retry_interval=0.05)
        with pytest.raises(JobsApiError):
            client.submit(QUEUE, JOB_SET, [{"podSpec": {}}])
        assert [s.path for s in server.seen] == ["/v1/job/submit"]


def test_job_set_events_are_read_from_the_ndjson_stream():
    from components.armada.jobs_api import failure_reason

    lines = [
        {"result": {"id": "1-0", "message": {"submitted": {"jobId": "j1", "queue": QUEUE}}}},
        {"result": {"id": "2-0", "message": {"failed": {"jobId": "j1", "reason": "test failed: 1 of 3"}}}},
    ]
    body = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, body)) as server:
        events = JobsClient(server.url).job_set_events(QUEUE, JOB_SET)
        assert server.seen[0].path == f"/v1/job-set/{QUEUE}/{JOB_SET}"
    assert [e["id"] for e in events] == ["1-0", "2-0"]
    assert failure_reason(events, "j1") == "test failed: 1 of 3" and failure_reason(events, "j2") is None
    error = body + json.dumps({"error": {"grpc_code": 5, "message": "job set not found"}}).encode() + b"\n"
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, error)) as server:
        with pytest.raises(JobsApiError, match="job set not found"):
            JobsClient(server.url).job_set_events(QUEUE, JOB_SET)


def test_an_event_line_that_never_ends_cannot_hold_the_call_past_its_deadline():
    """Issue 20 finding 7: a stream line dripped without its newline was read whole before the
    deadline was checked (15 s against 2 s); every read is bounded by the call's deadline."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    pieces = [(head, 0)] + [(b"1\r\n \r\n", 0.2)] * 75  # 15 s of one line's spaces, never a newline
    with DrippingServer(pieces) as server:
        started = time.monotonic()
        with pytest.raises(JobsApiError, match="deadline"):
            JobsClient(server.url, timeout=1, wait_seconds=0).job_set_events(QUEUE, JOB_SET)
        assert time.monotonic() - started < 3


def test_a_build_gives_up_on_a_registry_dripping_its_headers_at_its_timeout(tmp_path, logged):
    """The provider's registry calls share the build's deadline (timeoutSeconds): a registry whose
    headers never finish arriving fails the build instead of holding `pulumi up`."""
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 60 + b"\r\n"
    with DrippingServer(drip(headers, 0.2)) as server:
        props = props_for(make_context(tmp_path / "cart"), server.url, "Basic eDp5", "http://127.0.0.1:1",
                          timeoutSeconds=1)
        started = time.monotonic()
        with pytest.raises(RegistryError, match="deadline"):
            EntityBuildProvider().create(props)
        assert time.monotonic() - started < 3


# --- the component --------------------------------------------------------------------------------


def test_the_component_wraps_one_dynamic_build_with_secret_credentials(mocked, tmp_path):
    from tests.conftest import run_mocked
    from cloudstation_tools.mocks import is_wrapped_secret

    props = props_for(make_context(tmp_path / "cart"), "http://127.0.0.1:1", "Basic eDp5", "http://127.0.0.1:2")
    args = entity_build.EntityBuildArgs(
        context_dir=props["contextDir"], dockerfile_text=DOCKERFILE_TEXT, content_tag=props["contentTag"],
        context_digest=props["contextDigest"], repository="shop/cart", context_repository=props["contextRepository"],
        push_ref=props["pushRef"], pull_host="localhost:32000", registry_url=props["registryUrl"],
        registry_authorization="Basic eDp5", armada_url=props["armadaUrl"], armada_authorization=ARMADA_AUTH,
        queue=QUEUE, job_set_id=JOB_SET, job_item=job_item_of(props), builder=props["builder"],
        timeout_seconds=600, poll_seconds=2, binoculars_url="http://127.0.0.1:3", adopt_existing=True,
    )
    outputs = run_mocked(lambda: {"ref": (build := entity_build.EntityBuild("shop-cart", args)).ref,
                                  "digest": build.digest})
    component = [r for r in mocked.registrations if r.type == "cloudstation:builds:EntityBuild"]
    dynamic = [r for r in mocked.registrations if r.type == "pulumi-python:dynamic/builds:EntityBuild"]
    assert [r.name for r in component] == ["shop-cart"] and [r.name for r in dynamic] == ["shop-cart-build"]
    assert dynamic[0].parent == component[0].urn
    inputs = dynamic[0].inputs
    assert is_wrapped_secret(inputs["registryAuthorization"]) and is_wrapped_secret(inputs["armadaAuthorization"])
    expected = {k: v for k, v in props.items() if k not in ("registryAuthorization", "armadaAuthorization")}
    expected.update(timeoutSeconds=600, pollSeconds=2, binocularsUrl="http://127.0.0.1:3")
    assert {k: inputs[k] for k in expected} == expected
    assert outputs["ref"] == f"localhost:32000/shop/cart:{props['contentTag']}@{outputs['digest']}"


# --- with the fake Armada, its executor and E's job item (the seams end to end) ---------------------

REGISTRY_HOST = "registry.cloudstation-registry.svc.cluster.local:5000"


def e2e_props(cluster, context: Path) -> dict:
    from components.build_job import BuildSettings, build_job_item

    props = props_for(context, cluster.registry.url, basic(cluster.registry), cluster.armada.url,
                      builder=BuildSettings().rebuild_key(), binocularsUrl=cluster.binoculars.url, timeoutSeconds=120,
                      pollSeconds=0.1)
    props["jobItem"] = job_item_text(build_job_item(
        project="shop", entity="cart", content_tag=props["contentTag"], context_digest=props["contextDigest"],
        registry_host=REGISTRY_HOST, namespace="cloudstation-builds", secret_name="build-registry",
        settings=BuildSettings(), plain_http=True))
    props["pushRef"] = job_item_of(props)["annotations"]["cloudstation.io/build-image"]
    return props


@pytest.fixture
def cluster(tmp_path):
    from tests.fake_executor import build_cluster

    contexts: dict = {}
    with build_cluster(tmp_path / "cluster", contexts, registry_host=REGISTRY_HOST, queues=[QUEUE], users=[SUBMITTER],
                       authorization=ARMADA_AUTH, builders=True) as built:
        built.contexts = contexts
        yield built


def test_end_to_end_one_job_builds_the_image_the_program_then_uses(cluster, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// e2e\n")
    cluster.contexts[("shop", "cart")] = (context, DOCKERFILE_TEXT)
    cluster.armada.lookout_lag = 2  # status answers UNKNOWN at first, as a lagging lookout ingester would
    props = e2e_props(cluster, context)
    assert EntityBuildProvider().check({}, props).failures == []
    result = EntityBuildProvider().create(props)
    (job_id,) = cluster.executor.jobs
    assert result.outs["jobId"] == job_id and result.outs["digest"] == cluster.executor.pushed[job_id]
    assert [p for _m, p, _b in cluster.armada.requests].count("/v1/job/submit") == 1
    assert cluster.armada.state(job_id) == "SUCCEEDED"
    # A second run (unchanged source): the registry has the tag, no job.
    again = EntityBuildProvider().create(props)
    assert again.outs["digest"] == result.outs["digest"] and again.outs["jobId"] == "" and cluster.executor.jobs == [job_id]


def test_end_to_end_a_failing_test_fails_with_its_output(cluster, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// e2e fail\n")
    (context / "src" / "cart.test.js").write_text(
        "const test = require('node:test');\nconst assert = require('node:assert');\n"
        "test('adds an item to the cart', () => { assert.strictEqual(1 + 1, 3, 'cart total is wrong'); });\n")
    cluster.contexts[("shop", "cart")] = (context, DOCKERFILE_TEXT)
    props = e2e_props(cluster, context)
    with pytest.raises(BuildFailed) as error:
        EntityBuildProvider().create(props)
    assert "adds an item to the cart" in str(error.value) and "cart total is wrong" in str(error.value)
    assert cluster.registry.digest_of("shop/cart", props["contentTag"]) is None


def test_the_pod_specs_numbers_reach_armada_as_integers(registry, tmp_path, logged):
    """The engine hands a provider every number of a map as a double (a protobuf Struct: pulumi
    3.272.0 runtime/rpc.py serialize_property), and Armada's gateway (Go encoding/json) refuses 1800.0
    for an integer field: the job item travels as JSON text (`job_item_text`), so its numbers arrive
    as written, whatever the engine does to the other inputs."""
    from pulumi.runtime import rpc
    from pulumi.runtime.sync_await import _sync_await

    context = make_context(tmp_path / "cart", extra="// floats\n")
    with armada_with(succeeding(lambda item: push_image(registry, tmp_path, "shop/cart",
                                                         item["labels"]["cloudstation.io/content-tag"]))) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        item = job_item_of(props)
        props["jobItem"] = job_item_text({**item, "podSpec": {**item["podSpec"], "activeDeadlineSeconds": 1800}})
        # Through the engine's wire format and back, as the dynamic-provider host receives them.
        as_engine_sends = rpc.deserialize_properties(_sync_await(rpc.serialize_properties(props, {})))
        assert type(as_engine_sends["timeoutSeconds"]) is float  # what a map's numbers would suffer
        EntityBuildProvider().create(as_engine_sends)
        (item,) = sent(armada, "/v1/job/submit")[0]["jobRequestItems"]
    assert item["priority"] == 1 and type(item["priority"]) is int
    assert item["podSpec"]["activeDeadlineSeconds"] == 1800 and type(item["podSpec"]["activeDeadlineSeconds"]) is int


def test_each_operation_closes_the_registry_connections_it_kept_alive(registry, tmp_path, logged, monkeypatch):
    """One dynamic-provider process serves every build of a `pulumi up`: a connection kept alive after
    an operation is never used again, and through the registry tunnel it holds a port-forward's
    sockets and relay thread. At 500 entities (bench/real_engine.py, the real engine) the process
    passed 1023 descriptors and the relay's select() failed: 7 builds errored."""
    from components import registry_api

    opened = []

    def for_url(*args, **kwargs):
        opened.append(real(*args, **kwargs))
        return opened[-1]

    real = registry_api.for_url
    monkeypatch.setattr(registry_api, "for_url", for_url)
    context = make_context(tmp_path / "cart")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        push_image(registry, tmp_path, "shop/cart", props["contentTag"])
        outs = EntityBuildProvider().create(props).outs
        EntityBuildProvider().read(outs["contentTag"], outs)
    assert len(opened) == 2
    assert all(client.connections.idle == {} for client in opened), [client.connections.idle for client in opened]
