"""In-cluster builds (issue 13), the whole program: __main__.py of a repository copy under the mocks,
its EntityBuild (and Queue) resources running their real providers as the engine would
(cloudstation_tools/mocks.py DynamicProviderHost; tests/builds_program.py) against the fake Armada
(tests/fake_armada.py), the fake executor (tests/fake_executor.py: strict pod validation, Pod Security,
the context checked against the entity's hashed files, the entity's real `node --test`) and a real
docker-registry standing in for the in-cluster one. Entities and projects come from the stack files.

What the engine decides is modelled, not assumed: the checkpoint between runs (`state`) makes Diff
decide (pulumi/pulumi step_generator.go: no change -> same step, no Create), and a fresh stack creates
every build, whose provider then asks the registry first. Offline render (no opt-in) stays made-up and
fast: test_render_stays_offline."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from cloudstation_tools import render as render_module
from cloudstation_tools.mocks import MOCK_DIGEST_PREFIX, kept_value
from components.armada.auth import BUILDS_USER
from components.armada.queue import OWNER_VERBS, SUBMITTER_VERBS
from components.registry_access import BUILD_SECRET_PREFIX, build_user, gate_policy
from infra import builds, delivery
from tests.builds_program import ENTITY_BUILD, STATEFUL_SERVICE, run
from tests.conftest import ROOT, objects
from tests.fake_armada import FakeArmada
from tests.fake_executor import FakeExecutor
from tests.test_job_network_order import created_before
from tests.registry_server import RegistryServer
from tests import stacks

STACK = "test"
REGISTRY_PASSWORD = kept_value("registry-auth-values", "password", 32)
"""The managed registry's password as the mocks make it up (components/registry.py: KeptSecret `<name>-auth-values`)."""


def registry_users(config) -> dict[str, str]:
    """The managed registry's other users (components/registry_access.py) with the passwords the mocks
    make up: each project's kept pull credential (KeptSecret `registry-pull-<project>-values`) and
    build credential (RandomPassword `registry-build-<project>-password`)."""
    from cloudstation_tools.mocks import _random_password, unwrap_secrets
    from components.registry_access import build_user, pull_user

    users = {}
    for project in builds.build_projects(config):
        users[pull_user(project)] = kept_value(f"registry-pull-{project}-values", "password", 32)
        made_up = _random_password(f"registry-build-{project}-password")({"length": 32})
        users[build_user(project)] = unwrap_secrets(made_up)["result"]
    return users


def config_of(root: Path, stack: str = STACK):
    """The stack's config: the fixture's (tests/stacks/) for the repository itself, else the copy's own file."""
    return stacks.validate_config(stack) if root == ROOT else render_module.validate_config(stack, root)


def entities(root: Path, stack: str = STACK) -> dict[tuple[str, str], tuple[Path, str]]:
    """(project, entity) -> (its source directory, the Dockerfile text it builds with), from the stack file."""
    config = config_of(root, stack)
    return {
        (project, entity.name): (root / entity.source,
                                 delivery.entity_dockerfile(root, project, entity, config.platform.image_mirror)[1])
        for project, entity in delivery.all_entities(config) if entity.image is None
    }


def service_name(project: str, entity: str) -> str:
    """The StatefulService of an entity (infra/cloudstation.py): `<project>-<entity>`, project-state's own name."""
    return entity if project == delivery.PLATFORM_PROJECT else f"{project}-{entity}"


class Cluster:
    """One copy of the repository and the fake cluster its builds run on."""

    def __init__(self, copy: Path, registry: RegistryServer, armada: FakeArmada, executor: FakeExecutor):
        self.copy, self.registry, self.armada, self.executor = copy, registry, armada, executor
        config = config_of(copy)
        self.platform = {
            # pulumi up reaches the registry API at its push host, Armada at queueApi.url (infra/builds.py).
            "registry": {"pushHost": f"127.0.0.1:{registry.port}"},
            "armada": {"queueApi": {"url": armada.url, "waitSeconds": 0}},
        }
        self.namespace = config.platform.builds_namespace

    def run(self, **options):
        options.setdefault("platform", self.platform)
        return run(self.copy, STACK, **options)

    def submitted(self) -> list[str]:
        return [path for method, path, _ in self.armada.requests if path == "/v1/job/submit"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    copy = stacks.copy_repository(tmp_path_factory.mktemp("builds") / "repo")
    config = config_of(copy)
    host = builds.registry_service_host(config)
    users = registry_users(config)
    deployer = config.platform.registry.username
    # The registry as the program deploys it: distribution behind the gate, with the program's users and policy.
    policy = gate_policy(builds.build_projects(config), deployer, builds.in_armada(config))
    with RegistryServer(tmp_path_factory.mktemp("registry"), username=deployer, password=REGISTRY_PASSWORD,
                        users=users, policy=policy) as registry, FakeArmada() as armada:
        # The executor reads each entity's files at job time: the copy's, edited by the tests; each build
        # pod pushes with the credentials of the build Secret it mounts: its project's build user.
        def build_login(secret: str) -> tuple[str, str]:
            user = build_user(secret.removeprefix(BUILD_SECRET_PREFIX))
            return user, users[user]

        with FakeExecutor(armada, registry, lambda project, entity: entities(copy)[(project, entity)],
                          registry_host=host, builders=True, credentials=build_login) as executor:
            yield Cluster(copy, registry, armada, executor)


@pytest.fixture(scope="module")
def first(cluster):
    """The first `pulumi up` of the stack: queues created by the Queue provider, every entity built."""
    result = cluster.run(queues=True)
    assert result.error is None, result.error
    return result


def test_preview_submits_nothing(cluster):
    before = len(cluster.armada.requests)
    result = cluster.run(preview=True, queues=True)
    assert result.error is None, result.error
    assert {method for method, _ in result.calls} <= {"check", "diff"}  # the engine runs no Create in a preview
    assert len(cluster.armada.requests) == before
    assert len(result.of_type(ENTITY_BUILD)) == len(entities(cluster.copy))


def test_first_up_builds_every_entity_once_through_the_build_queues(cluster, first):
    expected = entities(cluster.copy)
    assert len(first.created()) == len(first.of_type(ENTITY_BUILD)) + len(first.of_type("pulumi-python:dynamic/armada:Queue"))
    jobs = [cluster.armada.jobs[job_id] for job_id in cluster.executor.jobs]
    assert sorted((j.item["labels"]["cloudstation.io/project"], j.item["labels"]["cloudstation.io/entity"]) for j in jobs) \
        == sorted(expected)
    assert all(j.state == "SUCCEEDED" for j in jobs), [(j.id, j.state, j.error) for j in jobs]
    # Each job went to its project's build queue, as the build user, in job set <project>-<stack>.
    for job in jobs:
        project = job.item["labels"]["cloudstation.io/project"]
        assert (job.queue, job.job_set_id, job.owner) == (f"{project}-builds", f"{project}-{STACK}", BUILDS_USER)
        assert job.item["namespace"] == cluster.namespace


def test_the_build_user_may_submit_cancel_and_watch_in_the_build_queues_and_nothing_else(cluster, first):
    build_queues = set(builds.build_queues(config_of(cluster.copy)))
    for name, queue in cluster.armada.queues.items():
        granted = [p for p in queue.get("permissions", []) if {"kind": "User", "name": BUILDS_USER} in p["subjects"]]
        assert BUILDS_USER not in queue.get("userOwners", [])
        if name in build_queues:
            assert [sorted(p["verbs"]) for p in granted] == [sorted(SUBMITTER_VERBS)], queue  # never preempt, reprioritize
        else:
            assert granted == [], queue
    assert set(OWNER_VERBS) > set(SUBMITTER_VERBS)


def test_images_output_keeps_its_format_and_names_the_pushed_digests(cluster, first):
    images = first.outputs["images"]
    assert set(images) == {f"{project}/{entity}" for project, entity in entities(cluster.copy)}
    access = config_of(cluster.copy).platform.registry
    for key, ref in images.items():
        project, entity = key.split("/")
        tag = ref.split(":")[-2].split("@")[0]
        assert ref == f"{access.pull_host}/{project}/{entity}:{tag}@{cluster.registry.digest_of(f'{project}/{entity}', tag)}"
        assert not ref.rsplit("@", 1)[1].startswith(MOCK_DIGEST_PREFIX)


def test_unchanged_sources_submit_no_job(cluster, first):
    before = len(cluster.submitted())
    # A deployed stack: the engine's Diff finds nothing to do.
    deployed = cluster.run(state=first.state)
    assert deployed.error is None, deployed.error
    assert deployed.created() == []
    # A fresh checkpoint (e.g. a new stack on the same registry): the provider finds every tag.
    fresh = cluster.run()
    assert fresh.error is None, fresh.error
    assert len(fresh.created()) == len(entities(cluster.copy))
    assert len(cluster.submitted()) == before
    assert fresh.outputs["images"] == first.outputs["images"]


def _edit(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _first_entity(root: Path) -> tuple[str, str]:
    config = config_of(root)
    project = config.projects[0]
    return project.name, project.entities[0].name


def _a_source_file(source: Path) -> Path:
    return next(p for p in sorted(source.rglob("*.js")) if "node_modules" not in p.parts and ".test." not in p.name)


def test_one_changed_entity_builds_one_job_and_changes_only_its_stateful_service(cluster, first):
    before = cluster.run(state=first.state)
    project, entity = _first_entity(cluster.copy)
    source = entities(cluster.copy)[(project, entity)][0]
    jobs_before = list(cluster.executor.jobs)
    _edit(_a_source_file(source), "\n// a change\n")
    after = cluster.run(state=first.state)
    assert after.error is None, after.error
    new_jobs = [cluster.armada.jobs[j] for j in cluster.executor.jobs if j not in jobs_before]
    assert [(j.item["labels"]["cloudstation.io/project"], j.item["labels"]["cloudstation.io/entity"]) for j in new_jobs] \
        == [(project, entity)]
    assert new_jobs[0].state == "SUCCEEDED"
    old, new = before.stateful_services(), after.stateful_services()
    assert set(old) == set(new)
    changed = sorted(name for name in old if old[name]["inputs"] != new[name]["inputs"])
    assert changed == [service_name(project, entity)]
    first.state.update(after.state)  # the stack is now deployed at the changed source


def test_a_failing_test_fails_up_with_its_output_and_changes_no_stateful_service(cluster, first):
    project, entity = _first_entity(cluster.copy)
    source = entities(cluster.copy)[(project, entity)][0]
    tests = sorted(p for p in source.rglob("*.test.*js") if "node_modules" not in p.parts)
    assert tests, f"{source} has no *.test.js: every entity is built with its tests (docs/builds.md)"
    original = tests[0].read_text()
    marker = "cloudstation-test-marker-the-cart-is-broken"
    tests[0].write_text(original + f"\nrequire('node:test')('broken', () => {{ throw new Error('{marker}'); }});\n")
    try:
        result = cluster.run(state=first.state)
    finally:
        tests[0].write_text(original)
    assert result.error is not None
    assert marker in result.error
    # Deploy gating: no StatefulService of that project registered (none changed), the others' are.
    registered = result.stateful_services()
    config = config_of(cluster.copy)
    mine = {service_name(p, e) for p, e in entities(cluster.copy) if p == project}
    assert not mine & set(registered), sorted(registered)
    assert config.projects


def test_unreachable_armada_names_the_url(cluster, first):
    project, entity = _first_entity(cluster.copy)
    source = entities(cluster.copy)[(project, entity)][0]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    _edit(_a_source_file(source), "\n// another change\n")
    platform = {**cluster.platform, "armada": {"queueApi": {"url": closed, "waitSeconds": 0}}}
    result = cluster.run(state=first.state, platform=platform, connect_wait=0.2)
    assert result.error is not None
    assert closed in result.error
    assert not {service_name(p, e) for p, e in entities(cluster.copy) if p == project} & set(result.stateful_services())


def test_builds_wait_for_their_queue_and_stateful_services_for_all_their_projects_builds(rendered_stacks):
    """Deploy gating from the registered graph: every StatefulService of a project depends,
    transitively, on every build of that project and on no build of another project (the SDK sends a
    registration only once its dependencies are done: components/project_environment.py). Through
    the project's gate (ConfigMap `<project>-images`): directly, a StatefulService depends on no
    build but its own image's, so the edges stay linear in the entities (render cost)."""
    rendered = rendered_stacks[STACK]
    by_urn = {r.urn: r for r in rendered.registrations}
    builds_of: dict[str, set[str]] = {}
    for build in rendered.of_type(ENTITY_BUILD):
        project = build.inputs["queue"].removesuffix("-builds")
        builds_of.setdefault(project, set()).add(build.urn)
        waits = {by_urn[d].type: by_urn[d] for d in build.dependencies if d in by_urn}
        queue = [by_urn[d] for d in build.dependencies if d in by_urn and by_urn[d].type.endswith(":Queue")]
        assert [q.inputs["name"] for q in queue] == [build.inputs["queue"]], build.name
        assert waits, build.name
    config = config_of(ROOT)
    assert set(builds_of) == {p.name for p in config.projects} | {delivery.PLATFORM_PROJECT}
    every_build = set().union(*builds_of.values())

    for project, urns in builds_of.items():
        names = {service_name(p, e) for p, e in entities(ROOT) if p == project}
        services = [r for r in rendered.of_type(STATEFUL_SERVICE) if r.inputs["metadata"]["name"] in names]
        assert len(services) == len(names)
        for service in services:
            upstream = created_before(rendered, service)
            assert urns <= upstream, (service.name, sorted(urns - upstream))
            assert not (upstream & every_build) - urns, (service.name, sorted((upstream & every_build) - urns))
            own = [d for d in service.dependencies if d in every_build]
            assert len(own) <= 1 and all(by_urn[d].inputs["repository"] in json.dumps(service.inputs) for d in own), \
                (service.name, own)



def test_every_build_waits_for_its_queue_the_executors_the_builds_namespace_and_the_registry(rendered_stacks):
    """On the registered graph (the engine starts a resource's step only once its dependencies'
    are done), every EntityBuild depends, transitively, on its project's build queue, every
    executor's Deployment and its RoleBinding in the builds namespace, the builds namespace with
    its Secret and NetworkPolicies, and the registry's Deployment. Directly, it depends on named
    custom resources only, never on a whole component's children (a dependency on a local
    component is one on each child, pulumi runtime/rpc.py `_add_dependency`; infra/builds.py
    `armada_builds`): its direct edges do not depend on the other entities."""
    rendered = rendered_stacks[STACK]
    config = config_of(ROOT)
    by_urn = {r.urn: r for r in rendered.registrations}

    def kind(r) -> str:
        """A custom resource's kind (`Deployment`, `EntityBuild`); "" for a component."""
        return r.type.rsplit(":", 1)[-1] if r.custom else ""

    def in_namespace(r, namespace: str) -> bool:
        return r.custom and (r.inputs.get("metadata") or {}).get("namespace") == namespace

    builds_ns = config.platform.builds_namespace
    executor_urns = {r.urn for r in rendered.registrations if r.type == "cloudstation:armada:Executor"}
    deployments = [r for r in rendered.registrations if kind(r) == "Deployment" and r.parent in executor_urns]
    bindings = [r for r in rendered.registrations if kind(r) == "RoleBinding" and r.parent in executor_urns
                and in_namespace(r, builds_ns)]
    namespace = [r for r in rendered.registrations if kind(r) == "Namespace"
                 and r.inputs["metadata"]["name"] == builds_ns]
    secrets = [r for r in rendered.registrations if kind(r) == "Secret" and in_namespace(r, builds_ns)]
    policies = [r for r in rendered.registrations if kind(r) == "NetworkPolicy" and in_namespace(r, builds_ns)]
    registry = [r for r in rendered.registrations if kind(r) == "Deployment" and in_namespace(r, config.platform.namespace)
                and r.inputs["metadata"]["name"] == delivery.REGISTRY_NAME]
    # One of each per executor (from the stack file), one namespace, one build Secret per project (each
    # project's own build user), its policies, one registry.
    assert len(deployments) == len(bindings) == len(config.platform.armada.executors) >= 1
    assert len(namespace) == len(registry) == 1 and len(policies) >= 4
    assert sorted(r.inputs["metadata"]["name"] for r in secrets) == sorted(
        f"build-registry-{project}" for project in builds.build_projects(config))
    shared = {r.urn for r in [*deployments, *bindings, *namespace, *secrets, *policies, *registry]}
    queues = {r.inputs["name"]: r.urn for r in rendered.of_type("pulumi-python:dynamic/armada:Queue")}

    builds_seen = rendered.of_type(ENTITY_BUILD)
    assert len(builds_seen) == len(entities(ROOT))
    direct_counts = set()
    for build in builds_seen:
        queue = queues[build.inputs["queue"]]
        upstream = created_before(rendered, build)
        missing = ({queue} | shared) - upstream
        assert not missing, (build.name, sorted(by_urn[u].name for u in missing))
        # Directly: named custom resources only (a component's other children, e.g. the executor's
        # ConfigMap or the registry's PVC, mean a component was depended on) and no other build.
        extra = {by_urn[d].name for d in build.dependencies if d in by_urn and kind(by_urn[d]) in
                 ("ConfigMap", "ServiceAccount", "ClusterRoleBinding", "PersistentVolumeClaim", "EntityBuild")}
        assert not extra, (build.name, sorted(extra))
        direct_counts.add(len(build.dependencies))
    assert len(direct_counts) == 1, direct_counts  # the same few edges for every build, whatever the project


def test_local_mode_builds_with_docker_as_before_and_prod_builds_nothing(rendered_stacks):
    stack_file = stacks.read(STACK)
    platform = json.loads(stack_file.values["cloudstation:platform"])
    stack_file.values["cloudstation:platform"] = json.dumps({**platform, "builds": {"mode": "local"}})
    local = stacks.render(STACK, stack_file)
    assert local.of_type(ENTITY_BUILD) == [] and local.of_type("cloudstation:builds:BuildsNamespace") == []
    images = local.of_type("docker:index/image:Image")
    assert len(images) == len(entities(ROOT))
    assert not [o for o in objects(local, "Namespace") if o["metadata"]["name"] == config_of(ROOT).platform.builds_namespace]
    assert set(local.outputs["images"]) == set(rendered_stacks[STACK].outputs["images"])
    prod = rendered_stacks["prod"]
    assert prod.of_type(ENTITY_BUILD) == [] and prod.of_type("docker:index/image:Image") == []
    assert prod.of_type("cloudstation:builds:BuildsNamespace") == []


def test_render_stays_offline(rendered_stacks):
    rendered = rendered_stacks[STACK]
    refs = rendered.outputs["images"].values()
    assert refs and all(ref.rsplit("@", 1)[1].startswith(MOCK_DIGEST_PREFIX) for ref in refs)
    assert all(r.rsplit("@", 1)[1] in rendered.made_up for r in refs)


def _platform_with(**changes) -> dict:
    values = stacks.read(STACK).values
    return {**values, "cloudstation:platform": json.dumps({**json.loads(values["cloudstation:platform"]), **changes})}


@pytest.mark.parametrize("changes, key, says", [
    ({"armada": {"enabled": False}, "builds": {"mode": "armada"}}, "platform.builds.mode", "platform.armada.enabled is false"),
    ({"builds": {"mode": "armada"}, "registry": {"mode": "external", "url": "registry.example.com", "username": "u"}},
     "platform.builds.mode", "platform.registry.mode is 'external'"),
    ({"registry": {"mode": "managed", "buildPlatform": "linux/arm64"}}, "platform.registry.buildPlatform",
     "only for platform.builds.mode: local"),
])
def test_armada_builds_without_what_they_need_are_refused_naming_the_keys(changes, key, says):
    from infra.config import ConfigError

    raw = {**_platform_with(**changes), "cloudstation:registryPassword": "set-as-a-secret"}
    with pytest.raises(ConfigError) as caught:
        stacks.load(raw, secret_keys=["cloudstation:registryPassword"])
    [problem] = [p for p in caught.value.problems if p.startswith(f"cloudstation:{key}")]
    assert says in problem


def test_the_default_mode_follows_armada():
    assert config_of(ROOT).platform.build_mode == "armada"
    assert stacks.load(_platform_with(armada={"enabled": False})).platform.build_mode == "local"


def test_without_a_push_host_builds_reach_the_registry_through_their_own_tunnel(cluster, first, tmp_path, monkeypatch):
    """Armada mode without `platform.registry.pushHost` (infra/builds.py `tunnels_to_registry`): the
    build provider reaches the registry API through a port-forward through the Kubernetes API
    (components/kube_tunnel.py; here tests/fake_kube_api.py, whose registry pod relays to the real
    registry), and `registryUrl` is the Service's in-cluster name, which does not resolve here: no
    port-forward on this machine, and the build still uploads its context and reads its digest."""
    from components import k8s
    from components.registry import PORT as REGISTRY_PORT
    from tests.fake_kube_api import FakeKubeApi

    config = config_of(cluster.copy)
    service_host = builds.registry_service_host(config)
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(service_host.rsplit(":", 1)[0], REGISTRY_PORT)
    project, entity = _first_entity(cluster.copy)
    jobs_before = list(cluster.executor.jobs)
    with FakeKubeApi() as api:
        api.add_pod("registry-5c8d-x1", config.platform.namespace, k8s.selector_labels(delivery.REGISTRY_NAME),
                    {REGISTRY_PORT: ("127.0.0.1", cluster.registry.port)})
        monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        _edit(_a_source_file(entities(cluster.copy)[(project, entity)][0]), "\n// built through the tunnel\n")
        platform = {key: value for key, value in cluster.platform.items() if key != "registry"}  # no pushHost
        result = cluster.run(state=first.state, platform=platform)
    assert result.error is None, result.error
    tunnel = {"namespace": config.platform.namespace, "port": REGISTRY_PORT,
              "selector": k8s.selector_labels(delivery.REGISTRY_NAME)}
    for build in result.of_type(ENTITY_BUILD):
        assert build["inputs"]["registryUrl"] == f"http://{service_host}", build["name"]
        assert build["inputs"]["registryTunnel"] == tunnel, build["name"]
    new_jobs = [cluster.armada.jobs[j] for j in cluster.executor.jobs if j not in jobs_before]
    assert (project, entity) in [(j.item["labels"]["cloudstation.io/project"], j.item["labels"]["cloudstation.io/entity"])
                                 for j in new_jobs]
    assert all(j.state == "SUCCEEDED" for j in new_jobs)
    # The tag checks, the context upload and the digest reads went through the API server's tunnels.
    assert api.tunnels and {t.pod for t in api.tunnels} == {"registry-5c8d-x1"}
    assert sum(t.sent for t in api.tunnels) > 0 and sum(t.received for t in api.tunnels) > 0
    assert result.outputs["images"][f"{project}/{entity}"].endswith(
        cluster.registry.digest_of(f"{project}/{entity}", result.outputs["images"][f"{project}/{entity}"]
                                   .split("@")[0].rsplit(":", 1)[1]))
    first.state.update(result.state)


def test_a_builder_pin_bump_builds_every_entity_again(cluster, first):
    """Issue 19 defect 3: bumping kaniko (infra/versions.py) replaces every EntityBuild; each must
    build again, under a new content tag, not find `<repo>:<contentTag>` of the old builder in the
    registry and hand back the old digest. Through the real provider, the fake Armada and executor
    and a real registry, with the copy's own versions.py bumped."""
    versions_py = cluster.copy / "infra" / "versions.py"
    original = versions_py.read_text()
    old_pin, new_pin = '"kaniko": "docker.io/martizih/kaniko:v1.28.3"', '"kaniko": "docker.io/martizih/kaniko:v1.28.4"'
    assert original.count(old_pin) == 1
    before = cluster.run(state=first.state)
    assert before.error is None, before.error
    jobs_before = list(cluster.executor.jobs)
    versions_py.write_text(original.replace(old_pin, new_pin))
    try:
        after = cluster.run(state=before.state)
    finally:
        versions_py.write_text(original)
    assert after.error is None, after.error
    new_jobs = [cluster.armada.jobs[j] for j in cluster.executor.jobs if j not in jobs_before]
    built = sorted((j.item["labels"]["cloudstation.io/project"], j.item["labels"]["cloudstation.io/entity"]) for j in new_jobs)
    assert built == sorted(entities(cluster.copy)), "every entity is built once again with the new builder"
    assert all(j.state == "SUCCEEDED" and j.pod_spec["containers"][0]["image"].endswith(":v1.28.4") for j in new_jobs)
    old_images, new_images = before.outputs["images"], after.outputs["images"]
    assert set(old_images) == set(new_images)
    for key, ref in new_images.items():
        tag = ref.split("@")[0].rsplit(":", 1)[1]
        assert ref != old_images[key] and tag not in old_images[key], key  # a new tag and digest
        assert ref.endswith("@" + cluster.registry.digest_of(key, tag)), key
    # Every StatefulService deploys its new image.
    changed = {name for name, r in after.stateful_services().items()
               if r["inputs"] != before.stateful_services()[name]["inputs"]}
    assert changed == set(before.stateful_services())
