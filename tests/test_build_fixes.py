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
from tests import fake_armada
from tests.armada_variants import config_of
from tests.conftest import ROOT, find
from tests.test_armada_security import admission_request, admitted
from tests.test_entity_build import (  # noqa: F401 (logged is a fixture)
    ARMADA_AUTH, JOB_SET, QUEUE, SUBMITTER, armada_with, basic, failing, hanging, logged, make_context, props_for,
    push_image, sent, succeeding,
)

PLATFORM = "cloudstation:platform"
MIRROR = "mirror.example:5000/hub"


def stack_values(change) -> tuple[dict, list[str]]:
    """Pulumi.test.yaml as the engine passes it, with `change(platform)` applied."""
    stack_file = render.StackFile.read("test")
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
    return render.render("test", ROOT, stack_file=render.StackFile(values, secret_keys))


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
    return stack_config.load(values, root=ROOT, secret_keys=secret_keys)


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
