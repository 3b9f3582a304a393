"""Review fixes of the in-cluster builds (issue 13, helper J): the image mirror reaches the build pods
and kaniko's base-image pulls; builds are refused where a worker cluster could run them; the job
admission policy refuses a build pod that lost `hostUsers: false`; the build user may cancel and
watch its jobs; a repeated `pulumi up` reattaches to the job already building (clientId) and builds
again after a failed one; the fetch container's failure reaches `pulumi up`."""
from __future__ import annotations

import copy
import functools
import json
import threading
import time

import pytest

from cloudstation_tools import render
from components import build_job as bj
from components import entity_build
from components.armada.cluster import JOB_POLICY, job_policy, service_account_user
from components.armada.config import executor_name
from components.armada.jobs_api import JobsClient, job_id_time
from components.armada.queue import OWNER_VERBS, SUBMITTER_VERBS, project_queue_name
from components.armada.auth import BUILDS_USER
from components.entity_build import BuildFailed, EntityBuildProvider, job_item_of
from infra import builds, config as stack_config, versions
from tests import fake_armada, stacks
from tests.stacks import config_of
from tests.conftest import find
from tests.test_armada_security import admission_request, admitted
from tests.test_entity_build import (  # noqa: F401 (logged is a fixture)
    ARMADA_AUTH, JOB_SET, QUEUE, SUBMITTER, armada_with, basic, failing, hanging, logged, make_context, props_for,
    push_image, sent, succeeding,
)

PLATFORM = "cloudstation:platform"
MIRROR = "mirror.example:5000/hub"


def stack_values(change) -> tuple[dict, list[str]]:
    """Pulumi.test.yaml as the engine passes it, with `change(platform)` applied."""
    stack_file = stacks.read("test")
    values = copy.deepcopy(stack_file.values)
    platform = json.loads(values[PLATFORM])
    change(platform)
    values[PLATFORM] = json.dumps(platform)
    return values, list(stack_file.secret_keys)


def builds_of(rendered: render.Rendered) -> list:
    return [r for r in rendered.registrations if r.type.endswith("dynamic/builds:EntityBuild")]


@functools.lru_cache(maxsize=None)
def mirrored() -> render.Rendered:
    values, secret_keys = stack_values(lambda p: p.update(imageMirror=MIRROR))
    return stacks.render("test", stack_file=render.StackFile(values, secret_keys))


# --- A: platform.imageMirror reaches the build pods --------------------------------------------------


def test_a_mirrored_stack_pulls_the_build_pods_images_and_base_images_through_the_mirror():
    rendered = mirrored()
    entity_builds = builds_of(rendered)
    assert entity_builds, "the test stack builds in armada mode"
    for build in entity_builds:
        spec = job_item_of(build.inputs)["podSpec"]
        [fetch] = spec["initContainers"]
        [builder] = spec["containers"]
        assert fetch["image"] == versions.image(bj.FETCH_IMAGE, MIRROR), build.name
        assert builder["image"] == versions.image(bj.BUILDER_IMAGE, MIRROR), build.name
        assert [a for a in builder["args"] if a.startswith("--registry-mirror=")] == [f"--registry-mirror={MIRROR}"]
        assert not any(c["image"].startswith("docker.io/") for c in [fetch, builder])


def kaniko_pull(ref: str, mirror: str) -> str:
    """Where kaniko v1.28.3 pulls a docker.io `ref` from with `--registry-mirror=mirror`: root.go
    ValidateFlags maps index.docker.io to the mirror; remote.go parseRegistryMapping cuts host and
    path prefix at the first "/", remapRepository puts the prefix before the repository
    (go-containerregistry normalises docker.io to index.docker.io and adds library/)."""
    registry, rest = ref.split("/", 1)
    assert registry in ("docker.io", "index.docker.io"), ref
    host, _, prefix = mirror.partition("/")
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    return f"{host}/{prefix}{rest}"


@pytest.mark.parametrize("name", ["node-cloudstate-build", "node-cloudstate", "node-test", "maven", "java-runtime"])
def test_kaniko_finds_the_base_image_pins_where_the_mirror_keeps_the_platforms(name):
    # The mirror holds the pins at versions.image's layout; kaniko asks it at the same path.
    assert kaniko_pull(versions.image(name), MIRROR) == versions.image(name, MIRROR)
    assert kaniko_pull(versions.image(name), MIRROR + "/") == versions.image(name, MIRROR + "/")


def test_declared_registry_mirrors_come_first_and_the_image_mirror_once():
    settings = bj.BuildSettings(registry_mirrors=["a.example/dockerhub"])
    assert bj.base_image_mirrors(settings, None) == ["a.example/dockerhub"]
    assert bj.base_image_mirrors(settings, MIRROR + "/") == ["a.example/dockerhub", MIRROR]
    assert bj.base_image_mirrors(bj.BuildSettings(registry_mirrors=[MIRROR]), MIRROR) == [MIRROR]
    assert bj.base_image_mirrors(bj.BuildSettings(), None) == []


def test_without_a_mirror_the_build_pods_pull_the_pins(rendered_stacks):
    for build in builds_of(rendered_stacks["test"]):
        spec = job_item_of(build.inputs)["podSpec"]
        assert spec["initContainers"][0]["image"] == versions.image(bj.FETCH_IMAGE)
        assert not [a for a in spec["containers"][0]["args"] if a.startswith("--registry-mirror=")]


# --- B: no armada builds with worker clusters --------------------------------------------------------


WORKER = {"name": "gpu", "pool": "gpu", "clusterId": "gpu-cluster", "cidrs": ["10.50.0.0/16"]}
EXECUTOR_API = {"host": "armada.example.com", "serviceType": "LoadBalancer", "tlsSecret": "armada-executor-api-tls"}


def load(values_and_secret_keys: tuple[dict, list[str]]) -> stack_config.StackConfig:
    values, secret_keys = values_and_secret_keys
    return stacks.load(values, secret_keys=secret_keys)


def with_workers(platform: dict, mode=None) -> None:
    platform["armada"] = {**platform["armada"], "workers": [WORKER], "executorApi": EXECUTOR_API}
    if mode:
        platform["builds"] = {**platform.get("builds", {}), "mode": mode}


def test_armada_builds_with_workers_are_refused_naming_both_keys_and_the_way_out():
    with pytest.raises(stack_config.ConfigError) as error:
        load(stack_values(lambda p: with_workers(p, "armada")))
    message = str(error.value)
    assert "cloudstation:platform.builds.mode: 'armada'" in message
    assert "platform.armada.workers" in message and "platform.builds.mode: local" in message


def test_with_workers_builds_default_to_local_and_local_is_accepted():
    config = load(stack_values(with_workers))
    assert config.platform.build_mode == "local" and not builds.in_armada(config)
    config = load(stack_values(lambda p: with_workers(p, "local")))
    assert config.platform.build_mode == "local"
    # Without workers the same stack builds in armada (the default).
    assert load(stack_values(lambda p: None)).platform.build_mode == "armada"


# --- C: build pods must keep hostUsers: false ------------------------------------------------------------


def build_pod(rendered: render.Rendered, **spec_changes) -> tuple[dict, dict]:
    """(admission request, pod) of a rendered build job as the executor creates it."""
    config = config_of(rendered)
    [build] = builds_of(rendered)[:1]
    job = job_item_of(build.inputs)
    executor = service_account_user(config.platform.armada.namespace, executor_name(config.platform.armada.executors[0]))
    spec = {"serviceAccountName": config.platform.armada.job_service_account, **job["podSpec"], **spec_changes}
    spec = {k: v for k, v in spec.items() if v is not None}
    queue = project_queue_name(job["labels"]["cloudstation.io/project"])  # the executor's label: the job's queue
    labels = {**job["labels"], "armada_job_id": "01abc", "armada_queue_id": queue}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "armada-01abc-0", "namespace": job["namespace"], "labels": labels,
                        "annotations": job["annotations"]},
           "spec": spec}
    return admission_request(executor, job["namespace"]), pod


def test_the_job_policy_admits_a_build_pod_only_in_its_own_user_namespace(rendered_stacks):
    rendered = rendered_stacks["test"]
    assert config_of(rendered).platform.builds.user_namespace
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = build_pod(rendered)
    assert pod["spec"]["hostUsers"] is False
    assert admitted(policy, request, pod)
    # The API server drops hostUsers when its UserNamespacesSupport gate is off: refused.
    request, dropped = build_pod(rendered, hostUsers=None)
    assert "hostUsers" not in dropped["spec"]
    assert not admitted(policy, request, dropped)
    assert not admitted(policy, request, build_pod(rendered, hostUsers=True)[1])
    # The rule is the builds namespace's: a job pod elsewhere needs no user namespace.
    config = config_of(rendered)
    [other] = [n for n in config.platform.armada.job_namespaces if n != config.platform.builds_namespace][:1]
    elsewhere = copy.deepcopy(dropped)
    elsewhere["metadata"]["namespace"] = other
    elsewhere["metadata"]["labels"] = {"armada_job_id": "01abc", "armada_queue_id": "research"}
    assert admitted(policy, admission_request(request["userInfo"]["username"], other), elsewhere)


def test_a_build_pod_refers_to_its_own_projects_build_secret_only(rendered_stacks):
    """Issue 20 item 1: every project's builds run in one namespace, which holds every project's
    build Secret; a pod of queue `<project>-builds` may mount `<project>`'s only (its project's push
    rights), however it refers to a Secret."""
    from components.registry_access import build_secret_name

    rendered = rendered_stacks["test"]
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = build_pod(rendered)
    project = pod["metadata"]["labels"]["cloudstation.io/project"]
    own = build_secret_name(project)
    other = build_secret_name(next(p for p in builds.build_projects(config_of(rendered)) if p != project))
    assert {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v} == {own}
    assert admitted(policy, request, pod)

    def changed(change) -> dict:
        changed_pod = copy.deepcopy(pod)
        change(changed_pod["spec"])
        return changed_pod

    def volume(spec, source):
        spec["volumes"].append({"name": "other", **source})

    def env(kind, field):
        def change(spec):
            container = (spec.get(kind) or [{"name": "x", "image": "busybox"}])[0]
            spec[kind] = [container, *(spec.get(kind) or [])[1:]]
            container.setdefault(field, []).append(
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": other, "key": "auth"}}} if field == "env"
                else {"secretRef": {"name": other}})
        return change

    refused = {
        "a secret volume": lambda spec: volume(spec, {"secret": {"secretName": other}}),
        "a projected secret": lambda spec: volume(spec, {"projected": {"sources": [{"secret": {"name": other}}]}}),
        "env of the build container": env("containers", "env"),
        "envFrom of the fetch container": env("initContainers", "envFrom"),
        "env of an ephemeral container": env("ephemeralContainers", "env"),
        "an image pull secret": lambda spec: spec.update(imagePullSecrets=[{"name": other}]),
        "a CSI volume": lambda spec: volume(spec, {"csi": {"driver": "x", "nodePublishSecretRef": {"name": other}}}),
    }
    for what, change in refused.items():
        assert not admitted(policy, request, changed(change)), what
    # Its own Secret through any of these ways is fine, and so are Secret-free volumes.
    assert admitted(policy, request, changed(lambda spec: volume(spec, {"projected": {"sources": [{"secret": {"name": own}}]}})))
    assert admitted(policy, request, changed(lambda spec: spec.update(imagePullSecrets=[{"name": own}])))
    assert admitted(policy, request, changed(lambda spec: volume(spec, {"emptyDir": {}})))
    # The same pod labelled for the other project's queue may not mount this project's Secret.
    moved = copy.deepcopy(pod)
    moved["metadata"]["labels"]["armada_queue_id"] = project_queue_name(other.removeprefix("build-registry-"))
    assert not admitted(policy, request, moved)


def test_with_user_namespaces_off_the_policy_has_no_such_rule():
    args = (["system:serviceaccount:armada:armada-executor-a"], ["jobs", "cs-build"], "default", "cs-build",
            ["shop-builds"], ["cloudstation.io/project"])
    on, off = job_policy(*args, build_user_namespace=True), job_policy(*args)
    assert len(on["spec"]["validations"]) == len(off["spec"]["validations"]) + 1
    request = admission_request("system:serviceaccount:armada:armada-executor-a", "cs-build")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "cs-build",
                                                              "labels": {"armada_queue_id": "shop-builds"}},
           "spec": {"containers": [{"name": "build", "image": "kaniko"}]}}
    assert admitted(off, request, pod) and not admitted(on, request, pod)
    assert admitted(on, request, {**pod, "spec": {**pod["spec"], "hostUsers": False}})


# --- D: the build user may submit, cancel and watch its queues' jobs -------------------------------------


def queue_permissions(rendered: render.Rendered) -> dict[str, list]:
    return {q.inputs["name"]: q.inputs.get("permissions") or [] for q in rendered.of_type("pulumi-python:dynamic/armada:Queue")}


def test_every_build_queue_grants_the_build_user_exactly_submit_cancel_and_watch(rendered_stacks):
    rendered = rendered_stacks["test"]
    build_queues = set(builds.build_queues(config_of(rendered)))
    permissions = queue_permissions(rendered)
    assert build_queues <= set(permissions)
    for name, granted in permissions.items():
        mine = [p for p in granted if {"kind": "User", "name": BUILDS_USER} in p["subjects"]]
        if name in build_queues:
            assert [sorted(p["verbs"]) for p in mine] == [["cancel", "submit", "watch"]], name
            assert [p["subjects"] for p in mine] == [[{"kind": "User", "name": BUILDS_USER}]], name
        else:
            assert granted == [], name  # other queues unchanged: owners only
    assert set(SUBMITTER_VERBS) < set(OWNER_VERBS)  # never preempt or reprioritize


def test_with_the_rendered_permission_the_provider_cancels_a_build_it_gives_up_on(rendered_stacks, registry, tmp_path, logged):
    [granted] = queue_permissions(rendered_stacks["test"])[builds.build_queues(config_of(rendered_stacks["test"]))[0]]
    context = make_context(tmp_path / "cart", extra="// cancel\n")
    with armada_with(hanging, cancel=False) as armada:
        armada.queues[QUEUE] = {"name": QUEUE, "priorityFactor": 1, "userOwners": ["admin"],
                                "permissions": [{**granted, "subjects": [{"kind": "User", "name": SUBMITTER}]}]}
        props = props_for(context, registry.url, basic(registry), armada.url, timeoutSeconds=1, pollSeconds=0.1)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        (job_id,) = armada.jobs
        assert armada.state(job_id) == "CANCELLED"
        # And the job-set events (the failure reason's fallback) are readable with `watch`.
        client = JobsClient(armada.url, headers={"Authorization": ARMADA_AUTH})
        assert any(e["message"].get("cancelled") for e in client.job_set_events(QUEUE, JOB_SET))
    assert "it was cancelled" in str(error.value)


def test_with_submit_alone_cancelling_is_refused(registry, tmp_path, logged):
    # The denial the grant fixes (the fake refuses as submit.go CancelJobs does).
    context = make_context(tmp_path / "cart", extra="// no cancel\n")
    with armada_with(hanging, cancel=False) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url, timeoutSeconds=1, pollSeconds=0.1)
        with pytest.raises(BuildFailed, match="cancelling it failed"):
            EntityBuildProvider().create(props)


# --- E: one job per content across `pulumi up`s (clientId) ------------------------------------------------


@pytest.fixture
def earlier_ids(monkeypatch):
    """The fake stamps the next `n` job ids an hour earlier, as jobs of an earlier `pulumi up`."""
    original = fake_armada.new_job_id
    left = {"n": 0}

    def new_job_id():
        job_id = original()
        if left["n"] > 0:
            left["n"] -= 1
            millis = int((time.time() - 3600) * 1000)
            head = "".join(fake_armada.CROCKFORD[(millis >> shift) & 31] for shift in range(45, -5, -5))
            job_id = head + job_id[10:]
        return job_id

    monkeypatch.setattr(fake_armada, "new_job_id", new_job_id)
    return left


def submit_earlier(armada, props: dict, attempt: int = 1) -> str:
    """What an interrupted `pulumi up` left: the same item, submitted with the same clientId."""
    client = JobsClient(armada.url, headers={"Authorization": ARMADA_AUTH})
    item = {**job_item_of(props), "clientId": entity_build.client_id(props, attempt)}
    (job_id,) = client.submit(QUEUE, JOB_SET, [item])
    return job_id


def test_the_client_id_is_deterministic_and_within_armadas_limit(tmp_path):
    props = props_for(make_context(tmp_path / "cart"), "http://localhost:1", "", "http://localhost:2")
    first = entity_build.client_id(props)
    assert first == entity_build.client_id(dict(props)) and first.endswith(".1")
    assert first.startswith(props["contentTag"] + ".")
    assert entity_build.client_id(props, 2) == first[:-1] + "2"
    # Another entity of the same content (one source, two entities) is another job.
    assert entity_build.client_id({**props, "repository": "shop/basket"}) != first
    long_tag = {**props, "contentTag": "t" * 128}
    assert len(entity_build.client_id(long_tag, entity_build.MAX_ATTEMPTS)) <= fake_armada.CLIENT_ID_MAX
    # Another builder is another job (issue 19 defect 3), even where a tag would not say so.
    other_builder = {**props, "builder": {**props["builder"], "image": "builder@sha256:" + "b" * 64}}
    assert entity_build.client_id(other_builder) != first
    assert entity_build.client_id({**props, "builder": dict(reversed(list(props["builder"].items())))}) == first


def test_a_job_of_an_interrupted_up_is_waited_for_not_built_again(registry, tmp_path, logged, earlier_ids):
    context = make_context(tmp_path / "cart", extra="// reattach\n")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        earlier_ids["n"] = 1
        original = submit_earlier(armada, props)
        assert job_id_time(original) < time.time() - 3000

        def finish():  # the original job runs on and pushes, as the executor would
            deadline = time.monotonic() + 10
            while len(sent(armada, "/v1/job/submit")) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            for state in ("LEASED", "PENDING", "RUNNING"):
                armada.advance(original, state)
            push_image(registry, tmp_path, "shop/cart", props["contentTag"])
            armada.advance(original, "SUCCEEDED")

        runner = threading.Thread(target=finish, daemon=True)
        runner.start()
        result = EntityBuildProvider().create(props)
        runner.join(10)
        assert list(armada.jobs) == [original]  # no second job
        [_, again] = sent(armada, "/v1/job/submit")
        assert again["jobRequestItems"][0]["clientId"] == entity_build.client_id(props, 1)
    assert result.outs["jobId"] == original
    assert any("of an earlier `pulumi up` builds it" in m for m in logged)


def test_an_unchanged_build_whose_earlier_job_failed_is_built_again(registry, tmp_path, logged, monkeypatch):
    # The re-run comes seconds later here, not minutes: no margin for clocks (one clock here).
    monkeypatch.setattr(entity_build, "EARLIER_MARGIN_SECONDS", 0.0)
    context = make_context(tmp_path / "cart", extra="// rebuild\n")
    push = lambda item: push_image(registry, tmp_path, "shop/cart", item["labels"]["cloudstation.io/content-tag"])  # noqa: E731
    with armada_with(failing("not ok 1 - flaky")) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        with pytest.raises(BuildFailed, match="flaky"):  # a fresh job that fails fails the build: no retry
            EntityBuildProvider().create(props)
        [failed] = armada.jobs
        assert len(sent(armada, "/v1/job/submit")) == 1
        time.sleep(2.1)  # the answer's Date has whole seconds
        armada.executor = lambda job: succeeding(push)(armada, job)
        result = EntityBuildProvider().create(props)  # the re-run of the unchanged entity
        [_, rebuilt] = armada.jobs
        client_ids = [b["jobRequestItems"][0]["clientId"] for b in sent(armada, "/v1/job/submit")]
    assert client_ids == [entity_build.client_id(props, 1), entity_build.client_id(props, 1), entity_build.client_id(props, 2)]
    assert result.outs["jobId"] == rebuilt != failed
    assert any(f"job {failed} of an earlier `pulumi up` ended FAILED" in m for m in logged)


def test_an_earlier_succeeded_job_whose_image_was_cleaned_up_is_built_again(registry, tmp_path, logged, earlier_ids):
    """Issue 20 finding 11: an earlier `pulumi up`'s job SUCCEEDED, but its image has since been
    removed (image clean-up, docs/builds.md): the clientId would hand back that job, which pushes
    nothing ever again. The build goes on to the next attempt and builds, instead of waiting on it."""
    context = make_context(tmp_path / "cart", extra="// cleaned up\n")
    with armada_with() as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        earlier_ids["n"] = 1
        original = submit_earlier(armada, props)
        for state in ("LEASED", "PENDING", "RUNNING", "SUCCEEDED"):
            armada.advance(original, state)  # it pushed once; the tag is gone since (never pushed here)
        push = lambda item: push_image(registry, tmp_path, "shop/cart", item["labels"]["cloudstation.io/content-tag"])  # noqa: E731
        armada.executor = lambda job: succeeding(push)(armada, job)
        result = EntityBuildProvider().create(props)
        client_ids = [b["jobRequestItems"][0]["clientId"] for b in sent(armada, "/v1/job/submit")]
        [_, rebuilt] = armada.jobs
    assert client_ids == [entity_build.client_id(props, 1), entity_build.client_id(props, 1), entity_build.client_id(props, 2)]
    assert result.outs["jobId"] == rebuilt != original
    assert result.outs["digest"] == registry.digest_of("shop/cart", props["contentTag"])
    assert any(f"job {original} of an earlier `pulumi up` ended SUCCEEDED without the image" in m for m in logged)


def test_a_fixed_entity_after_a_failed_test_is_a_new_job_at_its_first_attempt(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// broken\n")
    with armada_with(failing("not ok")) as armada:
        props = props_for(context, registry.url, basic(registry), armada.url)
        with pytest.raises(BuildFailed):
            EntityBuildProvider().create(props)
        make_context(context, extra="// fixed\n")
        fixed = props_for(context, registry.url, basic(registry), armada.url)
        assert fixed["contentTag"] != props["contentTag"]
        armada.executor = lambda job: succeeding(
            lambda item: push_image(registry, tmp_path, "shop/cart", fixed["contentTag"]))(armada, job)
        EntityBuildProvider().create(fixed)
        client_ids = [b["jobRequestItems"][0]["clientId"] for b in sent(armada, "/v1/job/submit")]
    assert client_ids == [entity_build.client_id(props, 1), entity_build.client_id(fixed, 1)]
    assert len(armada.jobs) == 2


def test_earlier_means_stamped_well_before_the_request_reached_the_server():
    now = time.time()
    fresh = fake_armada.new_job_id()
    assert not entity_build.is_earlier_job(fresh, float(int(now)), 0.2)
    assert not entity_build.is_earlier_job(fresh, None, 0.2)  # no Date: taken as new
    assert not entity_build.is_earlier_job("not-a-ulid", now, 0.2)
    old = job_id_from(now - 600)
    assert entity_build.is_earlier_job(old, float(int(now)), 0.2)
    assert not entity_build.is_earlier_job(job_id_from(now - 10), float(int(now)), 0.2)  # within the margin


def job_id_from(seconds: float) -> str:
    millis = int(seconds * 1000)
    return "".join(fake_armada.CROCKFORD[(millis >> shift) & 31] for shift in range(45, -5, -5)) + "0" * 16


# --- issue 19 defect 2: a job rejected before the scheduler's snapshot shows the executor ---------------


def test_a_job_rejected_before_any_executor_reported_is_submitted_again_and_builds(registry, tmp_path, logged):
    """A fresh install: the executor reports just after the scheduler started, so until the
    snapshot's next refresh (executorUpdateFrequency) every pool is empty and the build's job is
    REJECTED (tests/fake_armada.py SubmitCheck, v0.22.7 submitcheck.go). The provider submits
    again, as the next attempt, until a job is accepted, within the build's timeout."""
    context = make_context(tmp_path / "cart", extra="// fresh install\n")
    push = lambda item: push_image(registry, tmp_path, "shop/cart", item["labels"]["cloudstation.io/content-tag"])  # noqa: E731
    with armada_with(succeeding(push)) as armada:
        check = armada.submit_check = fake_armada.SubmitCheck(update_frequency=0.5)
        check.report("default")
        props = props_for(context, registry.url, basic(registry), armada.url, pollSeconds=0.2)
        result = EntityBuildProvider().create(props)
        client_ids = [b["jobRequestItems"][0]["clientId"] for b in sent(armada, "/v1/job/submit")]
        states = [armada.jobs[j].state for j in armada.jobs]
    assert len(client_ids) >= 2 and client_ids == [entity_build.client_id(props, n) for n in range(1, len(client_ids) + 1)]
    assert states == ["REJECTED"] * (len(states) - 1) + ["SUCCEEDED"]
    assert result.outs["jobId"] == list(armada.jobs)[-1]
    assert result.outs["digest"] == registry.digest_of("shop/cart", props["contentTag"])
    assert any("rejected: no executor had reported a node to Armada's scheduler yet" in m for m in logged)


def test_a_rejection_for_another_reason_fails_at_once_with_armadas_text(registry, tmp_path, logged):
    """Nodes reported, none big enough: that is no wait for an executor, the build fails with the
    scheduler's reason, after one submission."""
    context = make_context(tmp_path / "cart", extra="// too big\n")
    with armada_with() as armada:
        check = armada.submit_check = fake_armada.SubmitCheck()
        check.report("default", allocatable={"cpu": "500m", "memory": "512Mi"}, at=check.started)
        props = props_for(context, registry.url, basic(registry), armada.url, pollSeconds=0.05)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        (job_id,) = armada.jobs
    assert len(sent(armada, "/v1/job/submit")) == 1
    assert f"Armada job {job_id} REJECTED" in str(error.value)
    assert "Number of nodes in cluster: 1\nExcluded nodes:\n 1: insufficient resources available" in str(error.value)


def test_no_executor_within_the_timeout_fails_with_the_rejection_and_what_to_check(registry, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// no executor\n")
    with armada_with() as armada:
        armada.submit_check = fake_armada.SubmitCheck(update_frequency=0.2)  # nothing ever reports
        props = props_for(context, registry.url, basic(registry), armada.url, timeoutSeconds=1, pollSeconds=0.2)
        with pytest.raises(BuildFailed) as error:
            EntityBuildProvider().create(props)
        submissions = len(sent(armada, "/v1/job/submit"))
    assert 2 <= submissions <= 6
    assert "REJECTED" in str(error.value) and "Number of nodes in cluster: 0" in str(error.value)
    assert "no executor reported a node to Armada's scheduler within 1 s" in str(error.value)
    assert "kubectl -n <armada namespace> get pods" in str(error.value)


# --- G: the fetch container's failure reaches pulumi up --------------------------------------------------


def test_both_containers_report_their_log_tail_when_they_fail(rendered_stacks):
    for build in builds_of(rendered_stacks["test"]):
        spec = job_item_of(build.inputs)["podSpec"]
        for container in [*spec["initContainers"], *spec["containers"]]:
            assert container["terminationMessagePolicy"] == "FallbackToLogsOnError", (build.name, container["name"])


# --- H: a job pod cannot run another tenant's image from a node's cache (issue 20, re-review) --------------

DIGEST = "sha256:" + "ab" * 32


def job_namespace_pod(rendered: render.Rendered, **spec) -> tuple[dict, dict]:
    """(admission request, pod) of an Armada user's job (queue `research`) in the first job namespace
    that is not the builds namespace, as the executor creates it."""
    config = config_of(rendered)
    armada = config.platform.armada
    [namespace] = [n for n in armada.job_namespaces if n != config.platform.builds_namespace][:1]
    executor = service_account_user(armada.namespace, executor_name(armada.executors[0]))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "armada-01abc-0", "namespace": namespace,
                        "labels": {"armada_job_id": "01abc", "armada_queue_id": "research"}},
           "spec": {"serviceAccountName": armada.job_service_account,
                    "containers": [{"name": "job", "image": "busybox:1.36"}], **spec}}
    return admission_request(executor, namespace), pod


def platform_registry_images(rendered: render.Rendered) -> list[str]:
    """The names the nodes cache the stack's registry's images under (and the loopback and Service forms
    of it the policy knows), and image IDs."""
    from infra.delivery import REGISTRY_NAME

    config = config_of(rendered)
    port, namespace = config.platform.registry.node_port, config.platform.namespace
    service = f"{REGISTRY_NAME}.{namespace}"
    return [
        f"localhost:{port}/shop/cart@{DIGEST}",  # what entity pods pull: the nodes hold it under this name
        f"localhost:{port}/shop/cart:0123456789abcdef0123456789abcdef@{DIGEST}",
        f"localhost:{port}/shop/cart:0123456789abcdef0123456789abcdef",  # a tag defaults to IfNotPresent
        f"LocalHost:{port}/platform/project-state@{DIGEST}",
        f"127.0.0.1:{port}/shop/cart@{DIGEST}",
        f"127.0.0.2:{port}/shop/cart@{DIGEST}",  # kube-proxy's NodePort answers on all of 127/8
        f"[::1]:{port}/shop/cart@{DIGEST}",
        f"localhost:0{port}/shop/cart@{DIGEST}",
        f"{service}:5000/shop/cart@{DIGEST}",  # the Service, where build pods push
        f"{service}.svc:5000/shop/cart@{DIGEST}",
        f"{service}.svc.cluster.local:5000/builds/shop/cart@{DIGEST}",
        f"{service}.svc.cluster.local/shop/cart@{DIGEST}",
        DIGEST,  # an image ID: the runtime runs whatever local image has it (containerd LocalResolve)
        "sha256:" + "ab" * 6,  # a prefix of one (Docker's image store resolves those)
    ]


def test_a_job_pod_cannot_name_an_image_of_the_platform_registry(rendered_stacks):
    """Issue 20 re-review: an Armada user's job names `localhost:<nodePort>/shop/cart@sha256:…` with
    imagePullPolicy IfNotPresent, and the kubelet runs the copy the node pulled for shop's entity,
    without any registry credential. No job runs the platform registry's images (build pods run the
    kaniko and busybox pins; kaniko pulls base images itself), so the policy refuses them in every
    container kind and image volume, whatever the pull policy; and image IDs, which name a local
    image whatever its registry."""
    rendered = rendered_stacks["test"]
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = job_namespace_pod(rendered)
    assert admitted(policy, request, pod)

    def with_image(kind: str, image: str, pull_policy) -> dict:
        changed = copy.deepcopy(pod)
        spec = changed["spec"]
        if kind == "volumes":
            source = {"reference": image, **({"pullPolicy": pull_policy} if pull_policy else {})}
            spec["volumes"] = [{"name": "data", "image": source}]
            return changed
        container = {"name": f"c-{kind.lower()}", "image": image, **({"imagePullPolicy": pull_policy} if pull_policy else {})}
        spec[kind] = [*spec.get(kind, []), container]
        return changed

    for image in platform_registry_images(rendered):
        for kind in ("initContainers", "containers", "ephemeralContainers", "volumes"):
            for pull_policy in ("IfNotPresent", "Never", "Always", None):
                assert not admitted(policy, request, with_image(kind, image, pull_policy)), (image, kind, pull_policy)
    # The same in the builds namespace: a build pod's own images are the pins, never the registry's.
    build_request, build = build_pod(rendered)
    assert admitted(policy, build_request, build)
    build["spec"]["containers"][0]["image"] = platform_registry_images(rendered)[0]
    assert not admitted(policy, build_request, build)
    # Other registries, other ports, tags that merely look like digests: admitted.
    port = config_of(rendered).platform.registry.node_port
    for image in ("busybox", f"docker.io/library/busybox@{DIGEST}", f"localhost:{port + 1}/shop/cart@{DIGEST}",
                  f"registry.example.com:{port}/shop/cart", f"localhost.example.com:{port}/shop/cart",
                  "shop/cart:sha256", "registry:5000/shop/cart", "cart:0123456789abcdef0123456789abcdef"):
        for kind in ("containers", "volumes"):
            assert admitted(policy, request, with_image(kind, image, "IfNotPresent")), (image, kind)


def test_the_refusal_names_the_registry_and_why():
    policy = job_policy(["system:serviceaccount:armada:armada-executor-a"], ["jobs"], "default",
                        registry_node_port=32001, registry_service_hosts=["registry.cs"])
    [rule] = [v for v in policy["spec"]["validations"] if "platform registry" in v["message"]]
    assert "localhost:32001" in rule["message"] and "registry.cs" in rule["message"]
    assert "image ID" in rule["message"] and "cache" in rule["message"]
    # Without a registry named (job_policy's defaults) image IDs are still refused.
    policy = job_policy(["system:serviceaccount:armada:armada-executor-a"], ["jobs"], "default")
    request = admission_request("system:serviceaccount:armada:armada-executor-a", "jobs")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "jobs"},
           "spec": {"containers": [{"name": "job", "image": DIGEST}]}}
    assert not admitted(policy, request, pod)
    pod["spec"]["containers"][0]["image"] = f"localhost:32000/shop/cart@{DIGEST}"
    assert admitted(policy, request, pod)


# --- I: the policy covers pods/ephemeralcontainers (issue 20, re-review) -------------------------------------


def test_the_policy_covers_ephemeral_containers_added_through_their_subresource(rendered_stacks):
    """`kubectl debug` adds an ephemeral container through the subresource pods/ephemeralcontainers
    (an UPDATE whose object is the whole Pod), which a rule on `pods` does not match: the executor
    lacks that right today, but the policy's guarantees must not hang on RBAC alone."""
    from components.registry_access import build_secret_name

    rendered = rendered_stacks["test"]
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = build_pod(rendered)
    debug = admission_request(request["userInfo"]["username"], request["namespace"], operation="UPDATE",
                              sub_resource="ephemeralcontainers")
    assert admitted(policy, debug, pod)
    project = pod["metadata"]["labels"]["cloudstation.io/project"]
    other = build_secret_name(next(p for p in builds.build_projects(config_of(rendered)) if p != project))
    stealing = copy.deepcopy(pod)
    stealing["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox",
                                                "envFrom": [{"secretRef": {"name": other}}]}]
    assert not admitted(policy, debug, stealing)
    # A job's pod: an ephemeral container with a platform registry image is refused, a plain one admitted.
    job_request, job = job_namespace_pod(rendered)
    debug = admission_request(job_request["userInfo"]["username"], job_request["namespace"], operation="UPDATE",
                              sub_resource="ephemeralcontainers")
    plain = copy.deepcopy(job)
    plain["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    assert admitted(policy, debug, plain)
    cached = copy.deepcopy(plain)
    cached["spec"]["ephemeralContainers"][0]["image"] = platform_registry_images(rendered)[0]
    assert not admitted(policy, debug, cached)
    # And the platform's labels, outside the job namespaces, as for the pod itself.
    outside = admission_request(job_request["userInfo"]["username"], config_of(rendered).platform.namespace,
                                operation="UPDATE", sub_resource="ephemeralcontainers")
    assert not admitted(policy, outside, {**plain, "metadata": {**plain["metadata"], "namespace": outside["namespace"]}})


def test_the_registry_the_policy_names_is_this_clusters():
    """Managed: this stack's Service; shared: the owner's (ownerNamespace, else the same namespace);
    external: none in the cluster (image IDs are still refused, `test_the_refusal_names_the_registry_and_why`)."""
    from types import SimpleNamespace

    from infra.armada import registry_admission

    def config(mode, owner=None, pull_host="localhost:32100", prefix=""):
        registry = SimpleNamespace(mode=mode, node_port=32100, owner_namespace=owner, pull_host=pull_host,
                                   repository_prefix=prefix)
        return SimpleNamespace(platform=SimpleNamespace(namespace="cs", registry=registry))

    assert registry_admission(config("managed")) == {
        "registry_node_port": 32100, "registry_service_hosts": ("registry.cs",), "registry_pull_prefix": "localhost:32100"}
    assert registry_admission(config("shared", "owner"))["registry_service_hosts"] == ("registry.owner",)
    assert registry_admission(config("shared"))["registry_service_hosts"] == ("registry.cs",)
    # External: not in the cluster, but the nodes cache its images under the name entity pods pull.
    assert registry_admission(config("external", pull_host="registry.example.com:5000", prefix="team/cs")) == {
        "registry_pull_prefix": "registry.example.com:5000/team/cs"}
    assert registry_admission(config("external", pull_host="registry.example.com"))["registry_pull_prefix"] == (
        "registry.example.com")


# --- J: an external registry's images, and updates that add nothing (issue 20, second re-review) ------------


def test_a_job_pod_cannot_name_an_image_of_an_external_registry():
    """An external registry (docs/armada.md, "Not replicated") is no less cached: the kubelet pulled
    `<host>/<prefix>/shop/cart@sha256:…` for shop's entities with shop's pull Secret, and a job naming the
    same reference with IfNotPresent runs that copy without any credential (1.33 checks none; 1.35+'s
    KubeletEnsureSecretPulledImages protects only images pulled with a Secret, and not on every node
    configuration). So the policy refuses the registry's pull host and repository prefix as well."""
    rendered = stacks.rendered("prod-own-cluster")
    registry = config_of(rendered).platform.registry
    assert registry.mode == "external"
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = job_namespace_pod(rendered)
    assert admitted(policy, request, pod)
    entity_images = [e.image for project in config_of(rendered).projects for e in project.entities]
    prefix = f"{registry.pull_host}/{registry.repository_prefix}"
    assert entity_images and all(image.startswith(prefix + "/") for image in entity_images)
    for image in [*entity_images, f"{prefix}/shop/cart@{DIGEST}", f"{prefix}/shop/cart:0123456789abcdef",
                  f"{prefix.upper()}/shop/cart@{DIGEST}"]:
        for kind in ("containers", "initContainers", "ephemeralContainers"):
            changed = copy.deepcopy(pod)
            changed["spec"][kind] = [*changed["spec"].get(kind, []), {"name": "c", "image": image}]
            assert not admitted(policy, request, changed), (image, kind)
        changed = copy.deepcopy(pod)
        changed["spec"]["volumes"] = [{"name": "data", "image": {"reference": image}}]
        assert not admitted(policy, request, changed), image
    # The registry's other repositories, and other registries: admitted.
    for image in (f"{registry.pull_host}/other/tool:1", f"{prefix}-other/shop/cart@{DIGEST}",
                  f"{registry.pull_host}.evil.example/{registry.repository_prefix}/shop/cart", "busybox:1.36"):
        changed = copy.deepcopy(pod)
        changed["spec"]["containers"][0]["image"] = image
        assert admitted(policy, request, changed), image


def test_an_external_registrys_port_is_part_of_the_name_the_policy_refuses():
    policy = job_policy(["system:serviceaccount:armada:armada-executor-a"], ["jobs"], "default",
                        registry_pull_prefix="Registry.Example.com:5000/team/cs")
    [rule] = [v for v in policy["spec"]["validations"] if "platform registry" in v["message"]]
    assert "registry.example.com:5000/team/cs" in rule["message"].lower()
    request = admission_request("system:serviceaccount:armada:armada-executor-a", "jobs")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "jobs"},
           "spec": {"containers": [{"name": "job", "image": f"registry.example.com:5000/team/cs/shop/cart@{DIGEST}"}]}}
    assert not admitted(policy, request, pod)
    pod["spec"]["containers"][0]["image"] = f"registry.example.com:5001/team/cs/shop/cart@{DIGEST}"
    assert admitted(policy, request, pod)


def admitted_update(policy: dict, request: dict, obj: dict, old: dict | None) -> bool:
    """`admitted`, with `oldObject` bound as the API server binds it (the object before an UPDATE, null on CREATE)."""
    import celpy

    from tests import test_armada_security as security

    def evaluate(expression: str, request: dict, obj: dict) -> bool:
        activation = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                      "oldObject": celpy.json_to_cel(old)}
        result = security.compile_cel(expression).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (expression, result)
        return bool(result)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(security, "evaluate", evaluate)
        return admitted(policy, request, obj)


def test_an_update_is_judged_on_the_images_it_adds(rendered_stacks):
    """A job pod created before the image rule may hold a platform registry image; the executor still
    patches it (annotations), so an UPDATE is refused only for an image the old pod did not have. CREATE
    and pods/ephemeralcontainers (`kubectl debug`, which could otherwise reuse the pod's image in a new
    container) are judged whole."""
    rendered = rendered_stacks["test"]
    policy = find(rendered, "ValidatingAdmissionPolicy", JOB_POLICY)
    request, pod = job_namespace_pod(rendered)
    user, namespace = request["userInfo"]["username"], request["namespace"]
    update = admission_request(user, namespace, operation="UPDATE")
    banned, other = platform_registry_images(rendered)[0], platform_registry_images(rendered)[4]
    for kind in ("initContainers", "containers", "ephemeralContainers", "volumes"):
        old = copy.deepcopy(pod)
        if kind == "volumes":
            old["spec"]["volumes"] = [{"name": "data", "image": {"reference": banned}}]
        else:
            old["spec"][kind] = [*old["spec"].get(kind, []), {"name": "old", "image": banned}]
        assert not admitted_update(policy, request, old, None), kind  # CREATE: refused
        patched = copy.deepcopy(old)
        patched["metadata"]["annotations"] = {"armada_jobset_id": "x"}
        assert admitted_update(policy, update, patched, old), kind  # the executor's patch: admitted
        # An image the old pod did not have: refused, whichever field names it.
        adds = copy.deepcopy(patched)
        adds["spec"]["containers"][0]["image"] = other
        assert not admitted_update(policy, update, adds, old), kind
        adds = copy.deepcopy(patched)
        adds["spec"].setdefault("volumes", []).append({"name": "more", "image": {"reference": other}})
        assert not admitted_update(policy, update, adds, old), kind
        # The subresource is judged whole, even for an image the pod already had.
        debug = admission_request(user, namespace, operation="UPDATE", sub_resource="ephemeralcontainers")
        assert not admitted_update(policy, debug, patched, old), kind
    # A clean pod changed to a banned image: refused.
    changed = copy.deepcopy(pod)
    changed["spec"]["containers"][0]["image"] = banned
    assert not admitted_update(policy, update, changed, pod)
    assert admitted_update(policy, update, pod, pod)
