"""Upgrades (issue 14 item 1): what one pin change does on `pulumi up`, and store majors.

Each pin group of infra/versions.py (tests/test_engine_replacements.py `GROUPS`: the pins a version
constant shares, else each pin alone) is bumped in turn and the stack rendered again; the engine's
diff (cloudstation_tools/engine.py: the provider's forceNew list, replaceOnChanges, ignoreChanges) of
the two renders must be EXACTLY what the pin feeds, derived from the current render:

- a Job whose pod template names the pin is replaced: batch/v1 Job `.spec.template` is in
  pulumi-kubernetes v4.34.2's forceNew list (provider/pkg/provider/diff.go, `var job`), as the API
  server refuses to change it (kubernetes pkg/apis/batch/validation ValidateJobSpecUpdate);
- every other workload whose pod template names it (Deployment, StatefulSet, DaemonSet, CronJob) is
  updated in place (a rolling update);
- a ConfigMap whose data names it is replaced (data is forceNew unless the provider runs with
  enableConfigMapMutable, diff.go `forceNewProperties`), else updated;
- a non-Kubernetes resource whose inputs name it changes (its provider decides how);
- nothing else changes, nothing is created or deleted.

And no migration can be skipped: a workload that uses a database some migration Job migrates depends
(transitively, in the registered graph) on that Job, run by the same version, awaited to completion
and re-run after a failure; a version bump replaces it (a new Job, run again).

The stacks: both example stack files, prod on a cluster of its own (tests/armada_variants.py), and
`every-pin`: the test stack with a managed Cassandra, S3 backups, monitoring and Binoculars on, so
that every pin but the entities' base images is deployed by one of them.
"""
from __future__ import annotations

import functools
import json
import re

import pulumi
import pulumi.runtime.settings
import pytest
import yaml

from cloudstation_tools import engine, render
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor
from components import postgres as postgres_component
from infra import config as stack_config
from infra import delivery, store_versions, versions
from tests import armada_variants, cloudstate_variants, promoted
from tests.conftest import ROOT
from tests.test_backups import S3_SETTINGS
from tests.test_engine_replacements import GROUPS, STACK_RENDERERS, VERSION_CONSTANTS, deployed, renders  # noqa: F401
from tests.test_stack_file_errors import _refused_before_any_resource

DOC = ROOT / "docs" / "upgrades.md"
EVERY_PIN = "every-pin"
STACKS = ["test", "prod", armada_variants.OWN_CLUSTER, EVERY_PIN]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "CronJob", "Job")


def every_pin_stack_file() -> render.StackFile:
    return cloudstate_variants.edited(
        "test",
        platform=lambda p: {
            **p,
            "monitoring": {"enabled": True},
            "stores": {**p.get("stores", {}), "backups": S3_SETTINGS},
            "armada": {**p["armada"], "binoculars": {"enabled": True}},
        },
        projects=lambda projects: [{**project, "store": "cassandra"} for project in projects],
    )


def _every_pin(stack: str) -> render.Rendered:
    """Rendered with the pins as they are at the call (the bumped renders patch them first)."""
    if versions.IMAGES == _CURRENT_IMAGES:
        return _every_pin_now()
    return render.render("test", stack_file=every_pin_stack_file())


_CURRENT_IMAGES = dict(versions.IMAGES)


@functools.lru_cache(maxsize=None)
def _every_pin_now() -> render.Rendered:
    return render.render("test", stack_file=every_pin_stack_file())


STACK_RENDERERS[EVERY_PIN] = _every_pin


def _graph(rendered: render.Rendered) -> engine.Graph:
    return engine.Graph(rendered.resources())


def _refs(group: str) -> list[str]:
    """The group's references as the graph holds them, mirror or not: `library/postgres:16.15-…`."""
    return [versions.IMAGES[key].split("/", 1)[1] for key in GROUPS[group]]


def _names(value, refs: list[str]) -> bool:
    text = json.dumps(value)
    return any(ref in text for ref in refs)


def _template(obj: engine.Resource) -> dict | None:
    if obj.kind == "CronJob":
        return ((obj.spec.get("jobTemplate") or {}).get("spec") or {}).get("template")
    return engine.pod_template(obj)



def expected_changes(before: engine.Graph, group: str) -> dict[str, set[str]]:
    """What bumping `group` must change, from what names its references in the current render."""
    refs = _refs(group)
    mutable_config = engine._flag(before.provider_config(), "enableConfigMapMutable")
    found: dict[str, set[str]] = {"replace": set(), "update": set(), "other": set()}
    for resource in before.resources:
        if not resource.is_object:
            # An in-cluster build's dockerfileText is the entity's own Dockerfile (its source), not a pin.
            inputs = {k: v for k, v in resource.inputs.items()
                      if k != "dockerfileText" or str(v).startswith("# Generated by CloudStation")}
            if resource.custom and _names(inputs, refs):
                found["other"].add(resource.urn)
            continue
        template = _template(resource)
        if template is not None and resource.kind in WORKLOADS:
            if _names(template, refs):
                found["replace" if resource.kind == "Job" else "update"].add(resource.urn)
        elif resource.kind == "ConfigMap" and _names({"data": resource.inputs.get("data"),
                                                      "binaryData": resource.inputs.get("binaryData")}, refs):
            found["update" if mutable_config and resource.inputs.get("immutable") is not True else "replace"].add(resource.urn)
        elif _names(resource.inputs, refs):
            found.setdefault("unclassified", set()).add(resource.urn)
    # An in-cluster build the pin feeds is built again (its `builder` is a rebuild key, a generated
    # Dockerfile changes the content tag: components/entity_build.py), under a new digest, so each
    # StatefulService deploying that image updates, and its project's deploy gate, the ConfigMap
    # listing the project's images (components/project_environment.py), changes as ConfigMaps do.
    for build in before.resources:
        if build.type == "pulumi-python:dynamic/builds:EntityBuild" and build.urn in found["other"]:
            image = f"{build.inputs['pullHost']}/{build.inputs['repository']}:{build.inputs['contentTag']}@"
            for resource in before.resources:
                if resource.is_object and resource.kind == "StatefulService" and image in json.dumps(resource.inputs):
                    found["update"].add(resource.urn)
                elif resource.is_object and resource.kind == "ConfigMap" and image in json.dumps(resource.inputs.get("data")):
                    found["update" if mutable_config and resource.inputs.get("immutable") is not True else "replace"].add(resource.urn)
    return found


def actual_changes(before: engine.Graph, after: engine.Graph) -> dict[str, set[str]]:
    """What the engine does: Kubernetes objects by the provider's diff, other resources by inputs."""
    found: dict[str, set[str]] = {"replace": set(), "update": set(), "other": set()}
    for change in engine.changes(before, after):
        found["replace" if change.replaced else "update"].add(change.new.urn)
    for resource in after.resources:
        old = before.by_urn.get(resource.urn)
        if old is not None and not resource.is_object and resource.custom and old.inputs != resource.inputs:
            found["other"].add(resource.urn)
    return found


def _labels(graph: engine.Graph, urns: set[str]) -> list[str]:
    return sorted(graph.by_urn[u].label() if graph.by_urn[u].is_object else u for u in urns)


@pytest.mark.parametrize("stack", STACKS)
def test_every_pin_change_replaces_and_updates_exactly_what_the_pin_feeds(renders, stack):
    before = _graph(renders(stack))
    groups = deployed(renders(stack))
    assert groups
    for group in groups:
        after = _graph(renders(stack, (group,)))
        assert set(before.by_urn) == set(after.by_urn), f"{group}: a pin change creates or deletes resources"
        expected, actual = expected_changes(before, group), actual_changes(before, after)
        assert not expected.get("unclassified"), (
            f"{group}: named by objects of a kind this test does not classify: "
            f"{_labels(before, expected['unclassified'])}")
        assert not (expected["replace"] | expected["update"] | expected["other"]) or actual != {}, group
        for what in ("replace", "update", "other"):
            assert _labels(after, actual[what]) == _labels(before, expected[what]), f"{group}: {what}"


@pytest.mark.parametrize("stack", STACKS)
def test_pins_a_stack_does_not_run_change_nothing_there(renders, stack):
    absent = tuple(g for g in GROUPS if g not in deployed(renders(stack)))
    if absent:
        before, after = _graph(renders(stack)), _graph(renders(stack, absent))
        assert actual_changes(before, after) == {"replace": set(), "update": set(), "other": set()}


def _build_pins() -> set[str]:
    """Pins that only feed entity image builds: the base images of the generated Dockerfiles and of
    the entities' own (their FROM lines), and the in-cluster builder's images
    (components/build_job.py). A bump reaches a stack only through a rebuilt entity image: the
    test stack's build resources, which the program registers only once builds are wired in (until
    then no render names them)."""
    from components import build_job
    from components.entity_image import GENERATED_LANGUAGES, generated_dockerfile

    texts = [generated_dockerfile(language, delivery.base_images(None)) for language in GENERATED_LANGUAGES]
    texts += [path.read_text(encoding="utf-8") for path in (ROOT / "entities").glob("*/*/Dockerfile")]
    text = "\n".join(texts)
    found = {group for group in GROUPS if any(ref.split(":", 1)[0] + ":" + ref.split(":", 1)[1].split("@")[0] in text
                                              for ref in _refs(group))}
    builders = {build_job.BUILDER_IMAGE, build_job.FETCH_IMAGE}
    return found | {group for group in GROUPS if builders & set(GROUPS[group])}


def test_the_checked_stacks_run_every_platform_pin(renders):
    """Coverage of the tests above: a pin no checked stack deploys would be tested only for changing
    nothing. Build images reach a stack only through a built entity image (`_build_pins`)."""
    deployed_somewhere = {g for stack in STACKS for g in deployed(renders(stack))}
    missing = set(GROUPS) - deployed_somewhere - _build_pins()
    assert not missing, f"pins no checked stack deploys: {sorted(missing)}"


# --- migrations ------------------------------------------------------------------------------------

MIGRATE = re.compile(r"(?i)migrate")
CREATE_DATABASE = re.compile(r"CREATE DATABASE (\w+)")


def _containers(template: dict) -> list[dict]:
    spec = template.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def databases_used(graph: engine.Graph, obj: engine.Resource) -> set[str]:
    """The PostgreSQL databases a workload's config names (`dbname` anywhere in the YAML of the
    ConfigMaps its pods mount: Armada's application_config.yaml)."""
    found: set[str] = set()
    for volume in ((_template(obj) or {}).get("spec") or {}).get("volumes") or []:
        name = (volume.get("configMap") or {}).get("name")
        config_map = graph.find("ConfigMap", name, obj.namespace) if name else None
        for text in ((config_map.inputs.get("data") or {}) if config_map else {}).values():
            try:
                document = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            found |= set(_values_of(document, "dbname"))
    return found


def _values_of(node, key: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from _values_of(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _values_of(item, key)


def migrations(graph: engine.Graph) -> dict[str, engine.Resource]:
    """database -> the Job that migrates it: a Job whose command runs a migration, on the database its
    config names."""
    found: dict[str, engine.Resource] = {}
    for job in (o for o in graph.objects if o.kind == "Job"):
        if any(MIGRATE.search(" ".join([*(c.get("command") or []), *(c.get("args") or [])]))
               for c in _containers(_template(job))):
            databases = databases_used(graph, job)
            assert databases, f"{job.label()} migrates, but its config names no database"
            for database in databases:
                assert database not in found, f"two migrations of {database}: {found[database].label()}, {job.label()}"
                found[database] = job
    return found


def _version(image: str) -> str:
    return image.rsplit("/", 1)[-1].split("@", 1)[0].partition(":")[2]


def _users(graph: engine.Graph) -> list[engine.Resource]:
    return [o for o in graph.objects if o.kind in WORKLOADS and databases_used(graph, o)]


def skipped_migrations(graph: engine.Graph) -> list[str]:
    """Every way a workload could run on a database its migration has not finished with."""
    problems = []
    migrated = migrations(graph)
    created = {}
    for job in (o for o in graph.objects if o.kind == "Job"):
        for container in _containers(_template(job)):
            for database in CREATE_DATABASE.findall(" ".join(container.get("args") or [])):
                created[(job.namespace, database)] = job
    for database, job in migrated.items():
        if engine.awaited(job) is None:
            problems.append(f"{job.label()}: not awaited (skipAwait), so its dependents do not wait for it")
        if not engine.replace_unready(job):
            problems.append(f"{job.label()}: a failed run is never re-run (no pulumi.com/replaceUnready)")
    for workload in _users(graph):
        waits = graph.waits_for(workload.urn)
        images = {_version(c["image"]) for c in _containers(_template(workload))}
        for database in sorted(databases_used(graph, workload)):
            creator = created.get((workload.namespace, database))
            if creator is not None and creator.urn not in waits and creator.urn != workload.urn:
                problems.append(f"{workload.label()}: uses {database} without waiting for {creator.label()}")
            migration = migrated.get(database)
            if migration is None or migration.urn == workload.urn:
                continue
            if migration.urn not in waits:
                problems.append(f"{workload.label()}: uses {database} without depending on {migration.label()}")
            versions_run = {_version(c["image"]) for c in _containers(_template(migration))}
            if images != versions_run:
                problems.append(f"{workload.label()}: runs {sorted(images)} on {database}, migrated by "
                                f"{sorted(versions_run)} ({migration.label()})")
    return problems


ARMADA_STACKS = ["test", armada_variants.OWN_CLUSTER, EVERY_PIN]


@pytest.mark.parametrize("stack", ARMADA_STACKS)
def test_no_migration_can_be_skipped(renders, stack):
    """Before and after an Armada bump. The engine registers a resource only once everything it
    depends on has been registered, i.e. created or updated and awaited: the Python SDK awaits each
    dependency's URN before RegisterResource (pulumi/pulumi sdk/python/lib/pulumi/runtime/resource.py
    `prepare_resource`, rpc.py `_add_dependency`), and the engine answers RegisterResource when the
    step is done (pkg/resource/deploy/source_eval.go resmon.RegisterResource). pulumi-kubernetes
    awaits a Job until Complete (provider/pkg/await/job.go), so a service rolls after its migration."""
    for graph in (_graph(renders(stack)), _graph(renders(stack, ("ARMADA",)))):
        migrated = migrations(graph)
        assert migrated, "no migration Job found"
        users = [w for w in _users(graph) if databases_used(graph, w) & set(migrated) and w.kind != "Job"]
        assert {d for w in users for d in databases_used(graph, w)} >= set(migrated), "a migration no service needs"
        assert skipped_migrations(graph) == []


@pytest.mark.parametrize("stack", ARMADA_STACKS)
def test_an_armada_bump_reruns_every_migration_then_rolls_the_services(renders, stack):
    """A migration Job keeps its name, so its identity for the engine is its inputs: the new version
    is a new pod template, which the provider can only replace (diff.go `var job`: .spec.template is
    forceNew), deleting the old Job first since the name stays (provider.go Diff: replacement of a
    named object is delete-before-replace). The engine then creates the new Job and awaits it; the
    Deployments only depend on it (dependsOn, no property of it), so they are updated, not replaced
    with it (pulumi/pulumi pkg/resource/deploy/step_generator.go `calculateDependentReplacements`)."""
    before, after = _graph(renders(stack)), _graph(renders(stack, ("ARMADA",)))
    changes = {c.new.urn: c for c in engine.changes(before, after)}
    migrated = {job.urn for job in migrations(before).values()}
    replaced = {urn for urn, c in changes.items() if c.replaced}
    assert replaced == migrated, _labels(before, replaced ^ migrated)
    for urn in migrated:
        change = changes[urn]
        assert change.same_name and change.delete_before_replace(True), change.new.label()
        assert all(path[:2] == ("spec", "template") for path in change.provider_replaces), change.provider_replaces
        assert change.problems() == []
    armada = [r for r in _refs("ARMADA")]
    runners = {o.urn for o in before.objects if o.kind in WORKLOADS and o.kind != "Job" and _names(_template(o), armada)}
    updated = {urn for urn, c in changes.items() if not c.replaced}
    assert updated == runners and runners, _labels(before, updated ^ runners)
    for urn in runners:
        users = databases_used(after, after.by_urn[urn]) & set(migrations(after))
        assert all(migrations(after)[d].urn in after.waits_for(urn) for d in users)


def test_the_migration_check_fails_on_a_service_that_does_not_wait(renders):
    """The check above can fail: drop the scheduler's dependency on its migration, give the
    migration skipAwait, or let it run another version."""
    resources = renders("test").resources()
    graph = engine.Graph(resources)
    migrated = migrations(graph)
    user = next(w for w in _users(graph) if w.kind == "Deployment" and databases_used(graph, w) & set(migrated))
    migration = migrated[sorted(databases_used(graph, user) & set(migrated))[0]]
    # The direct edge, and every path through other resources: remove the Job from its dependencies.
    edited = []
    for entry in resources:
        entry = dict(entry)
        if entry["urn"] != migration.urn:
            entry["dependsOn"] = [d for d in entry.get("dependsOn") or [] if d != migration.urn]
        edited.append(entry)
    assert any("without depending on" in p for p in skipped_migrations(engine.Graph(edited)))
    unawaited = [dict(e, inputs={**e["inputs"], "metadata": {**e["inputs"]["metadata"], "annotations": {
        **e["inputs"]["metadata"].get("annotations", {}), engine.SKIP_AWAIT: "true"}}}) if e["urn"] == migration.urn else e
        for e in resources]
    assert any("not awaited" in p for p in skipped_migrations(engine.Graph(unawaited)))
    older = json.loads(json.dumps(resources))
    for entry in older:
        if entry["urn"] == migration.urn:
            for container in entry["inputs"]["spec"]["template"]["spec"]["containers"]:
                container["image"] = container["image"].replace(versions.ARMADA, "0.22.6")
    assert any("migrated by" in p for p in skipped_migrations(engine.Graph(older)))


# --- store major versions --------------------------------------------------------------------------


def _with_major(ref: str, major: int, minor: str = "0") -> str:
    """`…/postgres:16.15-alpine3.24@sha256:…` -> `…/postgres:17.0-alpine3.24` (a new tag has no
    digest record until pin-images: versions.pinned)."""
    repository, tag, _ = versions.split(ref)
    return f"{repository}:{re.sub(r'^v?[0-9]+(?:[.][0-9]+)?', f'{major}.{minor}', tag)}"


def _store_versions(stack_file: render.StackFile, **stores: dict) -> render.StackFile:
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["storeVersions"] = stores
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    return stack_file


def _load(stack: str, stack_file: render.StackFile) -> stack_config.StackConfig:
    return stack_config.load(stack_file.values, root=ROOT, source=f"Pulumi.{stack}.yaml",
                             secret_keys=stack_file.secret_keys)


STORE_STACKS = {"postgres": ("test", every_pin_stack_file), "redis": ("test", every_pin_stack_file),
                "cassandra": ("test", every_pin_stack_file)}
"""A stack file managing each store: the every-pin variant of test runs all three."""


def _stack_file(store: str) -> render.StackFile:
    return STORE_STACKS[store][1]()


@pytest.fixture
def program_engine(monkeypatch):
    """The program run as the engine runs it (tests/test_stack_file_errors.py `engine`): config
    from PULUMI_CONFIG, fresh mocks."""

    def start(stack: str, stack_file: render.StackFile) -> ProgramMocks:
        mocks = ProgramMocks()
        pulumi.runtime.settings.ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project="cloudstation", stack=stack, preview=False,
                                 monitor=RecordingMonitor(mocks))
        pulumi.runtime.set_all_config({}, [])
        monkeypatch.setenv("PULUMI_CONFIG", json.dumps(stack_file.values))
        monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", json.dumps(stack_file.secret_keys))
        return mocks

    return start


@pytest.mark.parametrize("store", sorted(store_versions.STORES))
def test_a_store_major_change_is_refused_before_any_resource(monkeypatch, program_engine, store):
    old = versions.major(store)
    monkeypatch.setitem(versions.IMAGES, store, _with_major(versions.IMAGES[store], old + 1))
    message = _refused_before_any_resource(program_engine, "test", _stack_file(store))
    key = f"cloudstation:platform.storeVersions.{store}.dataMajor"
    line = next(line for line in message.splitlines() if key in line)
    assert f"{key}: '{old} (not set: the default)'" in line or f"{key}: {old} (not set: the default)" in line, line
    assert versions.IMAGES[store] in line and f"(major {old + 1})" in line
    assert f"{store_versions.DOC}#{store_versions.SECTIONS[store]}" in line
    assert f'majorUpgrade: "{old}->{old + 1}"' in line
    # A downgrade too, and with a recorded major.
    monkeypatch.setitem(versions.IMAGES, store, _with_major(versions.IMAGES[store], old - 1))
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"{key}: {old} —")):
        _load("test", _store_versions(_stack_file(store), **{store: {"dataMajor": old}}))


@pytest.mark.parametrize("store", sorted(store_versions.STORES))
def test_minor_and_patch_bumps_pass(monkeypatch, store):
    major = versions.major(store)
    for minor in ("0", "99"):
        monkeypatch.setitem(versions.IMAGES, store, _with_major(versions.IMAGES[store], major, minor))
        assert store in store_versions.managed_stores(_load("test", _stack_file(store)))


@pytest.mark.parametrize("store", sorted(store_versions.STORES))
def test_a_major_upgrade_passes_only_as_acknowledged_and_then_recorded(monkeypatch, store):
    old = versions.major(store)
    new = old + 1
    upgrade = f"platform.storeVersions.{store}.majorUpgrade"
    # The pin still at the data's major: an acknowledgement names a change that is not happening.
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"cloudstation:{upgrade}: '{old}->{new}' —")):
        _load("test", _store_versions(_stack_file(store), **{store: {"majorUpgrade": f"{old}->{new}"}}))
    monkeypatch.setitem(versions.IMAGES, store, _with_major(versions.IMAGES[store], new))
    _load("test", _store_versions(_stack_file(store), **{store: {"majorUpgrade": f"{old}->{new}"}}))
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"cloudstation:{upgrade}: '{old}->{new + 1}' —")):
        _load("test", _store_versions(_stack_file(store), **{store: {"majorUpgrade": f"{old}->{new + 1}"}}))
    # Done: the new major recorded, the acknowledgement removed (left in place, it is refused).
    _load("test", _store_versions(_stack_file(store), **{store: {"dataMajor": new}}))
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"cloudstation:{upgrade}")):
        _load("test", _store_versions(_stack_file(store), **{store: {"dataMajor": new, "majorUpgrade": f"{old}->{new}"}}))
    with pytest.raises(stack_config.ConfigError, match=re.escape(f"cloudstation:{upgrade}: 'next' — must name the change as")):
        _load("test", _store_versions(_stack_file(store), **{store: {"majorUpgrade": "next"}}))


def test_stores_the_stack_does_not_manage_are_not_checked(monkeypatch):
    """External stores' data is not on this stack's volumes: `non-owner` uses an external
    PostgreSQL and no Armada (cloudstate_variants), so a PostgreSQL major bump passes there."""
    monkeypatch.setitem(versions.IMAGES, "postgres", _with_major(versions.IMAGES["postgres"], 99))
    edited = cloudstate_variants.edited(
        "test", platform=lambda p: {**p, "ownsClusterResources": False, "cloudstate": {}, "armada": {"enabled": False},
                                    "stores": {"postgres": {"mode": "external", "host": "pg.example.internal",
                                                            "cidrs": ["10.20.30.40/32"],
                                                            "credentialsSecret": {"namespace": "ops", "name": "pg"}}}},
        projects=lambda projects: [{**project, "store": "cassandra"} for project in projects])
    config = stack_config.load(edited.values, source="Pulumi.test.yaml", secret_keys=edited.secret_keys)
    assert store_versions.managed_stores(config) == {"cassandra"}


@pytest.mark.parametrize("stack", STACKS)
def test_managed_stores_are_the_stores_the_stack_runs(renders, stack):
    """The check's view of a stack (from its config) against the render: each store pin that runs
    in a StatefulSet of the stack."""
    stack_file = every_pin_stack_file() if stack == EVERY_PIN else (
        armada_variants.stack_file(stack) if stack == armada_variants.OWN_CLUSTER else promoted.read(stack))
    config = stack_config.load(stack_file.values, source=stack, secret_keys=stack_file.secret_keys)
    running = {store for store in store_versions.STORES
               if any(o.kind == "StatefulSet" and _names(_template(o), [versions.IMAGES[store].split("/", 1)[1]])
                      for o in _graph(renders(stack)).objects)}
    assert store_versions.managed_stores(config) == running


def test_an_acknowledged_postgres_major_starts_on_its_own_data_directory(monkeypatch):
    """The old major's directory stays as it was on the volume (the rollback); the first major keeps
    the directory every existing store has."""
    assert postgres_component.data_directory(versions.IMAGES["postgres"]) == "/var/lib/postgresql/data/pgdata"
    old = versions.major("postgres")
    monkeypatch.setitem(versions.IMAGES, "postgres", _with_major(versions.IMAGES["postgres"], old + 1))
    stack_file = _store_versions(_stack_file("postgres"), postgres={"majorUpgrade": f"{old}->{old + 1}"})
    rendered = render.render("test", stack_file=stack_file)
    servers = [o for o in rendered.manifests() if o["kind"] == "StatefulSet"
               and "postgres:" in o["spec"]["template"]["spec"]["containers"][0]["image"]]
    assert len(servers) == 2  # Armada's and project-state's (the project is on Cassandra here)
    for server in servers:
        [env] = [e for e in server["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "PGDATA"]
        assert env["value"] == f"/var/lib/postgresql/data/pgdata-{old + 1}"


# --- the procedure document ------------------------------------------------------------------------


def test_upgrades_doc_covers_every_pin_and_store_procedure():
    text = DOC.read_text(encoding="utf-8")
    missing = [key for key in versions.TAGS if f"`{key}`" not in text]
    assert not missing, f"docs/upgrades.md names no procedure for {missing}"
    anchors = _anchors(DOC)
    assert set(store_versions.SECTIONS.values()) <= anchors
    for store in store_versions.STORES:
        assert f"platform.storeVersions.{store}" in text or "platform.storeVersions.<store>" in text


def _anchors(path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation but '-' dropped, spaces to '-'."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_upgrades_doc_links_and_the_docs_that_point_to_it_resolve():
    """Links with their anchors: the procedure points into backups.md, teardown-and-upgrades.md
    and others, and those (and operations.md) point back here."""
    for path in (DOC, ROOT / "docs" / "operations.md", ROOT / "docs" / "teardown-and-upgrades.md"):
        for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)", path.read_text(encoding="utf-8")):
            file = (path.parent / target) if target else path
            assert file.exists(), f"{path.name} links to missing {target}"
            if anchor and file.suffix == ".md":
                assert anchor in _anchors(file), f"{path.name} links to {target}#{anchor}, not a heading there"
    for path in ("operations.md", "teardown-and-upgrades.md"):
        assert "(upgrades.md)" in (ROOT / "docs" / path).read_text(encoding="utf-8"), path
