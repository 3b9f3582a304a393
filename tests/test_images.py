"""Platform images: every pin is an exact tag, digests are recorded per exact tag with their source
(infra/image-digests.yaml), pods and Dockerfiles run `repository:tag@sha256:…` (a mirror keeps the
digest), docs/security.md lists exactly the pins still deployed by tag, and `python -m infra
pin-images` records the digest a real registry serves (Debian's docker-registry + skopeo)."""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
import re
import subprocess

import pytest
import yaml

from components import cloudstate_operator as operator
from components import registry as registry_component
from infra import cluster_sharing, image_pins, stack_images, versions
from infra import config as stack_config
from cloudstation_tools import checks, cli, pin_images, render
from tests import stacks
from tests.conftest import ROOT, STACKS, find, objects, pod_spec
from tests.registry_server import build_oci_image

SECURITY_DOC = ROOT / "docs" / "security.md"
REPOSITORIES = {versions.split(ref)[0]: name for name, ref in versions.TAGS.items()}
"""Pinned repository (docker.io/library/redis) -> pin name."""
COMMIT = re.compile(r"\bat [0-9a-f]{40}\b")


# --- the pins and their digest records -----------------------------------------------------------


@pytest.mark.parametrize("name", list(versions.TAGS))
def test_every_pin_is_an_exact_version_tag_on_a_named_registry(name):
    ref = versions.TAGS[name]
    repository, tag, digest = versions.split(ref)
    assert digest is None, f"{name}: digests go in infra/image-digests.yaml, not in TAGS"
    assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {ref} is not an exact version tag"
    assert "." in repository.split("/", 1)[0], f"{name}: {ref} must name its registry host"


def test_every_digest_record_is_for_a_current_pin_and_names_its_source():
    records = versions.load_digests()
    assert records, "infra/image-digests.yaml has no record"
    today = datetime.datetime.now(datetime.timezone.utc).date()
    for name, record in records.items():
        assert versions.TAGS.get(name) == record.ref, f"{name}: record for {record.ref}, pin is {versions.TAGS.get(name)}"
        assert datetime.date.fromisoformat(record.recorded) <= today, name
        # A public record names repository, file and commit; pin-images names the registry call.
        assert COMMIT.search(record.source) or record.source.startswith("registry: skopeo inspect"), name
        assert versions.IMAGES[name] == f"{record.ref}@{record.digest}"


def test_the_file_is_exactly_what_pin_images_writes():
    text = versions.DIGESTS_FILE.read_text(encoding="utf-8")
    assert text == pin_images.render(versions.load_digests(), list(versions.TAGS))


def test_a_record_applies_only_to_its_own_tag():
    digest = "sha256:" + "a" * 64
    record = versions.DigestRecord("docker.io/library/redis:7.4.10", digest, "test", "2026-01-01")
    assert versions.pinned("redis", {"redis": "docker.io/library/redis:7.4.10"}, {"redis": record}).endswith(digest)
    # Bumping the tag without re-pinning must never run the old digest under the new tag.
    assert versions.pinned("redis", {"redis": "docker.io/library/redis:7.4.11"}, {"redis": record}) == (
        "docker.io/library/redis:7.4.11"
    )


@pytest.mark.parametrize("entry, message", [
    ({"ref": "docker.io/library/redis:1", "digest": "sha256:" + "A" * 64, "source": "s", "recorded": "2026-01-01"},
     "is not sha256:<64 lowercase hex>"),
    ({"ref": "docker.io/library/redis", "digest": "sha256:" + "a" * 64, "source": "s", "recorded": "2026-01-01"},
     "must be repository:tag without a digest"),
    ({"ref": "docker.io/library/redis:1", "digest": "sha256:" + "a" * 64, "source": "s"}, "expected exactly the keys"),
])
def test_a_malformed_record_is_an_error_naming_the_entry(tmp_path, entry, message):
    path = tmp_path / "image-digests.yaml"
    path.write_text(yaml.safe_dump({"redis": entry}))
    with pytest.raises(ValueError, match=f"image-digests.yaml: redis: .*{re.escape(message)}"):
        versions.load_digests(path)


def test_the_policy_helpers_agree_with_the_pins():
    assert set(versions.missing_digests()) == {n for n in versions.TAGS if n not in versions.load_digests()}
    for name in versions.TAGS:
        assert versions.has_digest(name) == (versions.digest_of(versions.image(name)) is not None)
    assert versions.digest_of("mirror:5000/hub/library/redis:7@sha256:" + "b" * 64) == "sha256:" + "b" * 64
    assert versions.tag_of("localhost:5000/a/b:v1@sha256:" + "b" * 64) == "v1"


def security_doc_pins() -> dict[str, list[str]]:
    """docs/security.md "Images": the table rows, pin name -> cells."""
    text = SECURITY_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Images\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 3:
            rows[cells[0].strip("`")] = cells
    return rows


def test_docs_list_every_pin_and_exactly_the_ones_still_deployed_by_tag():
    rows = security_doc_pins()
    assert set(rows) == set(versions.TAGS)
    for name, cells in rows.items():
        assert cells[1] == f"`{versions.tag_of(versions.TAGS[name])}`", f"docs/security.md: {name} tag is {cells[1]}"
    by_tag = {name for name, cells in rows.items() if "pin-images" in cells[2]}
    assert by_tag == set(versions.missing_digests())


# --- what runs ------------------------------------------------------------------------------------


def platform_images(rendered: render.Rendered) -> list[tuple[str, str]]:
    """(where, image) of every container of every workload, the proxy images the operator's
    ConfigMap names, the proxy each StatefulService's pods run (its annotation: the operator
    creates those pods, so no rendered pod shows it) and the build pods' containers (in each
    EntityBuild's Armada job item)."""
    found = [(f"{where} container {c['name']}", c["image"])
             for where, spec in checks.workloads(rendered.manifests()) for c in checks.containers(spec)]
    for config_map in objects(rendered, "ConfigMap"):
        if config_map["metadata"]["name"] == "cloudstate-operator-config":
            for key, image in operator.parse_operator_config(config_map["data"]["config"])["proxy.image"].items():
                found.append((f"operator proxy.image.{key}", image))
    for service in objects(rendered, "StatefulService"):
        meta = service["metadata"]
        where = f"StatefulService {meta['namespace']}/{meta['name']}"
        assert image_pins.PROXY_ANNOTATION in meta.get("annotations", {}), f"{where} names no proxy image"
        found.append((f"{where} proxy", meta["annotations"][image_pins.PROXY_ANNOTATION]))
    for build in rendered.of_type("pulumi-python:dynamic/builds:EntityBuild"):
        spec = json.loads(build.inputs["jobItem"])["podSpec"]
        found += [(f"EntityBuild {build.name} container {c['name']}", c["image"]) for c in checks.containers(spec)]
    return found


def render_pins(rendered: render.Rendered, mirror: str | None = None) -> dict[str, set[str]]:
    """Pin name -> the references of it the render runs (platform_images), read from the render only."""
    found: dict[str, set[str]] = {}
    for _, image in platform_images(rendered):
        name = pin_of(image, mirror)
        if name is not None:
            found.setdefault(name, set()).add(image)
    return found


def pin_of(image: str, mirror: str | None) -> str | None:
    repository = versions.split(image)[0]
    if mirror:
        if not repository.startswith(mirror.rstrip("/") + "/"):
            return None
        repository = "docker.io/" + repository[len(mirror.rstrip("/")) + 1:]
    return REPOSITORIES.get(repository)


def check_platform_images(rendered: render.Rendered, mirror: str | None) -> set[str]:
    seen = set()
    for where, image in platform_images(rendered):
        name = pin_of(image, mirror)
        if name is None:
            assert versions.split(image)[0].rsplit("/", 1)[-1] not in {r.rsplit("/", 1)[-1] for r in REPOSITORIES}, (
                f"{where}: {image} looks like a platform image but is not its pin")
            continue
        assert image == expected_ref(name, mirror), f"{where}: {image} is not the pin {expected_ref(name, mirror)}"
        seen.add(name)
    return seen


def expected_ref(name: str, mirror: str | None) -> str:
    """Derived from the pin and the digest file directly, not through versions.image()."""
    tag_ref = versions.TAGS[name]
    record = versions.load_digests().get(name)
    ref = f"{tag_ref}@{record.digest}" if record and record.ref == tag_ref else tag_ref
    return f"{mirror.rstrip('/')}/{ref.split('/', 1)[1]}" if mirror else ref


@pytest.mark.parametrize("stack", STACKS)
def test_every_platform_container_runs_its_pin_with_the_recorded_digest(rendered_stacks, stack):
    seen = check_platform_images(rendered_stacks[stack], None)
    if stack == "test":  # the stack that owns the cluster's registry, operator, stores and Armada
        assert {"registry", "postgres", "redis", "cloudstate-operator", "armada-server", "kaniko"} <= seen
    else:  # prod's entity pods run the proxies the owner's operator names (their annotation)
        assert {"postgres", "cloudstate-proxy-postgres", "cloudstate-proxy-no-store"} <= seen
    assert any(versions.digest_of(expected_ref(name, None)) for name in seen), "no platform image runs by digest"


def test_a_mirror_keeps_the_tag_and_the_digest():
    ref = versions.image("redis", "mirror.example:5000/hub/")
    record = versions.RECORDS["redis"]
    assert ref == "mirror.example:5000/hub/library/redis:" + versions.tag_of(record.ref) + "@" + record.digest


def test_a_mirrored_stack_runs_every_platform_image_from_the_mirror_by_digest():
    mirror = "mirror.example:5000/hub"
    stack_file = stacks.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    stack_file.values["cloudstation:platform"] = json.dumps({**platform, "imageMirror": mirror})
    rendered = stacks.render("test", stack_file=stack_file)
    seen = check_platform_images(rendered, mirror)
    assert {"registry", "postgres", "redis", "pulsar", "armada-server"} <= seen
    assert all(versions.digest_of(expected_ref(n, mirror)) for n in seen if n in versions.load_digests())
    assert not any(image.startswith("docker.io/") for _, image in platform_images(rendered))


def test_the_registry_serves_the_config_it_mounts(rendered_stacks):
    # distribution 3.x's image reads /etc/distribution/config.yml by default, 2.x's
    # /etc/docker/registry/config.yml; the pod names its file, so no image default (which has no
    # auth of ours) can be the one that runs.
    registry = find(rendered_stacks["test"], "Deployment", "registry")
    spec = pod_spec(registry)
    container, gate = spec["containers"]
    assert container["image"] == versions.image("registry")
    assert gate["image"] == versions.image(registry_component.GATE_IMAGE)  # the gate in front (docs/registry.md)
    assert container["args"] == [f"{registry_component.CONFIG_DIR}/config.yml"]
    assert {"name": "config", "mountPath": registry_component.CONFIG_DIR, "readOnly": True} in container["volumeMounts"]
    major = int(versions.tag_of(versions.TAGS["registry"]).split(".")[0])
    assert registry_component.CONFIG_DIR == {2: "/etc/docker/registry", 3: "/etc/distribution"}[major]


# --- no platform image by tag unless the stack names it (issue 20 finding 6) ----------------------


def with_opt_out(stack: str, names) -> render.StackFile:
    """The stack file (prod as promoted) with `platform.images.allowUnpinned` set to `names`
    (None: the key removed)."""
    stack_file = stacks.read(stack)
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform.pop("images", None)
    if names is not None:
        platform["images"] = {"allowUnpinned": list(names)}
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    return stack_file


def load_file(stack: str, stack_file: render.StackFile) -> stack_config.StackConfig:
    return stacks.load(stack_file.values, source=f"Pulumi.{stack}.yaml",
                             secret_keys=stack_file.secret_keys)


def unpinned(rendered: render.Rendered) -> list[str]:
    """The pins a render runs that have no digest record for their tag."""
    return sorted(n for n in render_pins(rendered) if n not in versions.load_digests()
                  or versions.load_digests()[n].ref != versions.TAGS[n])


def named(problem: str, name: str) -> bool:
    """Whether the refusal names the pin `name` as `name (reference`."""
    return re.search(rf"(?<![\w-]){re.escape(name)} \(", problem) is not None


@pytest.mark.parametrize("stack", STACKS)
def test_a_stack_refuses_every_image_it_would_pull_by_tag_at_once_naming_the_command(rendered_stacks, stack):
    """Without the opt-out, config validation (before any resource) refuses the stack, naming every
    pin its pods would run by tag, the reference, and `python -m infra pin-images --missing`. For
    prod that is the proxies its entity pods run, which the owner's operator names."""
    expected = unpinned(rendered_stacks[stack])
    assert expected  # the operator, proxies, Armada, kaniko; prod: the proxies of its entities
    if stack == "prod":  # the proxy of each store its entities use (project-state's too), and the store-less one
        config = stacks.validate_config("prod")
        stores = {p.store for p in config.projects} | {config.platform.project_state_store}
        assert stores == {"postgres", "cassandra"}
        assert expected == sorted({"cloudstate-proxy-no-store", *(f"cloudstate-proxy-{store}" for store in stores)})
    for names in (None, []):
        with pytest.raises(stack_config.ConfigError) as caught:
            load_file(stack, with_opt_out(stack, names))
        [problem] = caught.value.problems
        assert problem.startswith(f"cloudstation:platform.images.allowUnpinned: {'(not set)' if names is None else '[]'} — ")
        assert "`python -m infra pin-images --missing`" in problem and "infra/image-digests.yaml" in problem
        assert [n for n in versions.TAGS if named(problem, n)] == [n for n in versions.TAGS if n in expected]
        for name in expected:
            assert f"{name} ({versions.image(name)}" in problem
    if stack == "prod":
        assert "the operator of stack 'test'" in problem


def test_the_program_refuses_before_any_resource(mocked, monkeypatch):
    import runpy
    import pulumi
    from infra import context

    monkeypatch.setattr(context, "STACK_DIR", stacks.DIR)  # the stack files beside it: the fixtures'

    stack_file = with_opt_out("test", ["kaniko"])
    pulumi.runtime.set_all_config(stack_file.values, stack_file.secret_keys)

    @pulumi.runtime.test
    def run():
        runpy.run_path(str(ROOT), run_name="__main__")  # ./__main__.py, as the engine runs it

    with pytest.raises(pulumi.RunError, match=r'platform\.images\.allowUnpinned: \["kaniko"\] — .*cloudstate-operator \('):
        run()
    assert mocked.registrations == []


@pytest.mark.parametrize("pair", ["rendered_stacks", pytest.param("example_rendered", marks=pytest.mark.example_stacks)])
@pytest.mark.parametrize("stack", STACKS)
def test_the_example_stacks_opt_out_of_exactly_the_pins_they_run_by_tag(request, pair, stack):
    """The base fixture pair, and the example stack files as shipped (prod as promoted, both)."""
    rendered = request.getfixturevalue(pair)[stack]
    if pair == "rendered_stacks":
        config = stacks.validate_config(stack)
    else:
        config = render.validate_config(stack, ROOT, require_images=False)
    assert sorted(config.platform.images.allow_unpinned) == unpinned(rendered)


def test_the_opt_out_covers_only_the_pins_it_names():
    listed = stacks.validate_config("test").platform.images.allow_unpinned
    with pytest.raises(stack_config.ConfigError) as caught:
        load_file("test", with_opt_out("test", [n for n in listed if n != "kaniko"]))
    [problem] = caught.value.problems
    assert [n for n in versions.TAGS if named(problem, n)] == ["kaniko"]
    assert "in-cluster builds" in problem
    # A builder the stack names itself (platform.builds.image) runs in kaniko's place: by tag, it needs the name too.
    stack_file = with_opt_out("test", [n for n in listed if n != "kaniko"])
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["builds"]["image"] = "docker.io/martizih/kaniko:v1.28.2"
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    with pytest.raises(stack_config.ConfigError, match=r"kaniko \(docker\.io/martizih/kaniko:v1\.28\.2: in-cluster builds "
                                                       r"\(platform\.builds\.image\)\)"):
        load_file("test", stack_file)
    platform["builds"]["image"] = "docker.io/martizih/kaniko:v1.28.2@sha256:" + "8" * 64
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    load_file("test", stack_file)


@pytest.mark.parametrize("names, message", [
    (["kanikoo"], "allowUnpinned[0]: 'kanikoo' — not a pin of infra/versions.py (did you mean 'kaniko'?); the pins: registry, "),
    (["redis"], "allowUnpinned[0]: 'redis' — has a digest recorded in infra/image-digests.yaml and runs by it; "
                "remove it from the list"),
    (["kaniko", "kaniko"], "allowUnpinned[1]: 'kaniko' — listed twice; name each pin once"),
    ("kaniko", "allowUnpinned: 'kaniko' — input should be a valid list"),
    (True, "allowUnpinned: true — input should be a valid list"),
])
def test_the_opt_out_is_a_list_of_pins_still_without_a_digest(names, message):
    with pytest.raises(stack_config.ConfigError) as caught:
        stack_config.load({"cloudstation:environment": "test", "cloudstation:projects": json.dumps(
            [{"name": "shop", "entities": [{"name": "cart", "kind": "action", "language": "javascript",
                                            "source": "entities/shop/cart"}]}]),
                           "cloudstation:platform": json.dumps({"images": {"allowUnpinned": names}})})
    assert any(p.startswith(f"cloudstation:platform.images.{message}") for p in caught.value.problems), caught.value.problems


def test_a_digest_recorded_later_runs_by_digest_and_its_opt_out_must_go(monkeypatch):
    """After pin-images records kaniko's digest (here a fake record of the registry's answer), the
    builds run it by digest, and the stack file still naming it is refused until the entry goes."""
    digest = "sha256:" + "5" * 64
    record = versions.DigestRecord(versions.TAGS["kaniko"], digest, "registry: skopeo inspect (fake)", "2026-11-30")
    monkeypatch.setitem(versions.RECORDS, "kaniko", record)
    monkeypatch.setitem(versions.IMAGES, "kaniko", versions.pinned("kaniko"))
    with pytest.raises(stack_config.ConfigError, match=r"allowUnpinned\[\d+\]: 'kaniko' — has a digest recorded"):
        load_file("test", stacks.read("test"))
    listed = json.loads(stacks.read("test").values["cloudstation:platform"])["images"]["allowUnpinned"]
    stack_file = with_opt_out("test", [n for n in listed if n != "kaniko"])
    config = load_file("test", stack_file)
    [kaniko] = [i for i in stack_images.images(config, None) if i.name == "kaniko"]
    assert kaniko.ref == f"{versions.TAGS['kaniko']}@{digest}"


BUILDER_OVERRIDE = "mirror.example:5000/hub/martizih/kaniko:v1.28.3@sha256:" + "7" * 64
"""`platform.builds.image`: a builder the stack names itself, here by digest."""


def stack_cases() -> dict[str, render.StackFile]:
    """Stack files whose images are compared with their renders: the examples, prod on a cluster of
    its own, and test with monitoring, a mirror, Binoculars, local builds, Cassandra, backups to S3
    and external stores."""
    from tests import stacks

    def platform(**changes):
        return lambda old: {**old, **changes}

    return {
        "test": stacks.read("test"),
        "prod": stacks.read("prod"),
        stacks.OWN_CLUSTER: stacks.stack_file(stacks.OWN_CLUSTER),
        "test-monitored-mirrored": stacks.edited(
            "test", platform=lambda old: {**old, "monitoring": {"enabled": True}, "imageMirror": "mirror.example:5000/hub",
                                          "armada": {**old["armada"], "binoculars": {"enabled": True}},
                                          "builds": {**old["builds"], "image": BUILDER_OVERRIDE}}),
        "test-local-cassandra-backups": stacks.edited(
            "test", platform=lambda old: {**old, "builds": {"mode": "local"}, "projectStateStore": "cassandra",
                                          "stores": {**old["stores"], "cassandra": {"mode": "managed"},
                                                     "backups": {"target": "s3", "s3": {
                                                         "endpoint": "https://s3.eu-west-1.amazonaws.com",
                                                         "bucket": "backups", "region": "eu-west-1",
                                                         "credentialsSecret": {"namespace": "ops", "name": "s3"},
                                                         "cidrs": ["52.218.0.0/17"]}}}}),
        "prod-external-postgres": stacks.edited(
            "prod", platform=platform(stores={"postgres": {
                "mode": "external", "host": "pg.example.internal", "cidrs": ["10.20.30.40/32"],
                "credentialsSecret": {"namespace": "ops", "name": "pg-login"}}})),
    }


@pytest.mark.parametrize("case", list(stack_cases()))
def test_the_images_config_validation_checks_are_exactly_what_the_render_runs(case, rendered_stacks):
    """infra/stack_images.py decides from the config alone (before anything is registered) which pins
    a stack runs; it must be what the program then renders, proxies and build pods included."""
    from tests import stacks

    stack = "prod" if case.startswith("prod") else "test"
    stack_file = stack_cases()[case]
    config = load_file(stack, with_opt_out_of_all(stack, stack_file))
    mirror = config.platform.image_mirror
    if case in rendered_stacks:
        rendered = rendered_stacks[case]
    elif case == stacks.OWN_CLUSTER:
        rendered = stacks.rendered(case)
    else:
        rendered = stacks.render(stack, stack_file=with_opt_out_of_all(stack, stack_file))
    owner = None if config.platform.owns_cluster_resources else cluster_sharing.owner_config(config, stacks.DIR)
    declared: dict[str, set[str]] = {}
    for image in stack_images.images(config, owner):
        declared.setdefault(image.name, set()).add(image.ref)
    assert declared == render_pins(rendered, mirror)


def with_opt_out_of_all(stack: str, stack_file: render.StackFile) -> render.StackFile:
    """`stack_file` opting out of every pin still without a digest (so that any variant renders)."""
    stack_file = render.StackFile(dict(stack_file.values), list(stack_file.secret_keys))
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["images"] = {"allowUnpinned": versions.missing_digests()}
    stack_file.values["cloudstation:platform"] = json.dumps(platform)
    return stack_file


@pytest.mark.parametrize("stack", STACKS)
def test_every_entity_pod_names_the_proxy_its_operator_gives_it(rendered_stacks, stack):
    """The annotation is the owner's operator ConfigMap's image for the entity's store (v0.6.0
    StatefulServiceOperatorFactory: no `datastore` -> proxy.image.no-store, else the store type's)."""
    config_map = find(rendered_stacks["test"], "ConfigMap", image_pins.OPERATOR_CONFIG_MAP)
    proxies = operator.parse_operator_config(config_map["data"]["config"])["proxy.image"]
    services = objects(rendered_stacks[stack], "StatefulService")
    assert services
    for service in services:
        store = service["spec"].get("datastore")
        key = "no-store" if store is None else next(
            s["spec"]["type"].lower() for s in objects(rendered_stacks[stack], "StatefulStore")
            if s["metadata"]["name"] == store["name"] and s["metadata"]["namespace"] == service["metadata"]["namespace"])
        assert service["metadata"]["annotations"][image_pins.PROXY_ANNOTATION] == proxies[key], service["metadata"]


# --- pin-images against a real registry ----------------------------------------------------------


@pytest.fixture
def authfile(tmp_path, registry):
    path = tmp_path / "auth.json"
    token = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    path.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    return str(path)


@pytest.fixture
def probe(tmp_path, registry, monkeypatch):
    """A pin `probe` pointing at an image pushed to the local registry (the other pins stay)."""
    image = build_oci_image(tmp_path / "layout", "v1", b"probe one")
    pushed = registry.push(image, "tools/probe", "1.0.0")
    ref = f"{registry.host}/tools/probe:1.0.0"
    monkeypatch.setattr(versions, "TAGS", {**versions.TAGS, "probe": ref})
    return ref, pushed


def run_pin_images(capsys, *args) -> tuple[int, str, str]:
    # The stack files whose opt-outs it names: the fixture pair's (tests/stacks/), not the user's.
    code = cli.main(["pin-images", *args, *([] if "--root" in args else ["--root", str(stacks.DIR)])])
    out, err = capsys.readouterr()
    return code, out, err


def test_pin_images_records_the_digest_the_registry_serves(tmp_path, registry, authfile, probe, capsys):
    ref, pushed = probe
    digests = tmp_path / "image-digests.yaml"
    digests.write_text(versions.DIGESTS_FILE.read_text())
    code, out, _ = run_pin_images(capsys, "--image", "probe", "--digests", str(digests), "--authfile", authfile,
                                  "--insecure-registry", registry.host)
    assert code == 0, out
    records = versions.load_digests(digests)
    assert records["probe"].digest == pushed == registry.digest_of("tools/probe", "1.0.0")
    assert records["probe"].ref == ref and records["probe"].source.startswith("registry: skopeo inspect --raw")
    assert f"probe: {ref} (no digest) -> {pushed}" in out
    assert versions.pinned("probe", records=records) == f"{ref}@{pushed}"
    # Every other record is kept exactly, and the file stays in pin-images' own format.
    assert {n: r for n, r in records.items() if n != "probe"} == versions.load_digests()
    assert digests.read_text() == pin_images.render(records, list(versions.TAGS))


def test_pin_images_follows_a_moved_tag_and_a_docker_manifest(tmp_path, registry, authfile, probe, capsys):
    ref, first = probe
    digests = tmp_path / "image-digests.yaml"
    args = ("--image", "probe", "--digests", str(digests), "--authfile", authfile, "--insecure-registry", registry.host)
    assert run_pin_images(capsys, *args)[0] == 0
    # The tag moves to another image, pushed as a Docker v2 schema 2 manifest this time.
    second = registry.push(build_oci_image(tmp_path / "layout2", "v2", b"probe two"), "tools/probe", "1.0.0", "v2s2")
    assert second != first
    code, out, _ = run_pin_images(capsys, *args)
    assert code == 0 and f"probe: {ref} {first} -> {second}" in out
    assert versions.load_digests(digests)["probe"].digest == second == registry.digest_of("tools/probe", "1.0.0")
    # Unchanged: nothing to write.
    before = digests.stat().st_mtime_ns
    code, out, _ = run_pin_images(capsys, *args)
    assert code == 0 and "already recorded" in out and digests.stat().st_mtime_ns == before


def test_pin_images_without_credentials_fails_naming_the_image_and_writes_nothing(tmp_path, registry, probe, capsys):
    ref, _ = probe
    digests = tmp_path / "image-digests.yaml"
    digests.write_text(versions.DIGESTS_FILE.read_text())
    before = digests.read_bytes()
    code, _, err = run_pin_images(capsys, "--image", "probe", "--digests", str(digests),
                                  "--insecure-registry", registry.host)
    assert code == 1 and err.startswith(f"error: {ref}: skopeo inspect failed:")
    assert digests.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".image-digests")] == []


def test_pin_images_resolves_every_pin_before_writing_any(tmp_path, registry, authfile, probe, monkeypatch, capsys):
    ref, _ = probe
    monkeypatch.setattr(versions, "TAGS", {"probe": ref, "gone": f"{registry.host}/tools/probe:9.9.9"})
    digests = tmp_path / "image-digests.yaml"
    code, _, err = run_pin_images(capsys, "--digests", str(digests), "--authfile", authfile,
                                  "--insecure-registry", registry.host)
    assert code == 1 and "tools/probe:9.9.9" in err
    assert not digests.exists()


def test_pin_images_missing_only_leaves_recorded_pins_alone(tmp_path, registry, authfile, probe, monkeypatch, capsys):
    ref, pushed = probe
    other = f"{registry.host}/tools/other:2.0.0"
    monkeypatch.setattr(versions, "TAGS", {"other": other, "probe": ref})
    recorded = versions.DigestRecord(other, "sha256:" + "c" * 64, "a public record at " + "0" * 40, "2026-11-30")
    digests = tmp_path / "image-digests.yaml"
    digests.write_text(pin_images.render({"other": recorded}, ["other", "probe"]))
    code, out, _ = run_pin_images(capsys, "--missing", "--digests", str(digests), "--authfile", authfile,
                                  "--insecure-registry", registry.host)
    assert code == 0, out
    records = versions.load_digests(digests)
    assert records == {"other": recorded, "probe": records["probe"]} and records["probe"].digest == pushed


def test_pin_images_drops_records_of_tags_and_names_no_longer_pinned(tmp_path, registry, authfile, probe, capsys):
    ref, pushed = probe
    digests = tmp_path / "image-digests.yaml"
    stale = versions.DigestRecord(ref.replace(":1.0.0", ":0.9.0"), "sha256:" + "d" * 64, "x at " + "0" * 40, "2026-01-01")
    retired = versions.DigestRecord("docker.io/library/memcached:1.6.0", "sha256:" + "e" * 64, "x", "2026-01-01")
    digests.write_text(pin_images.render({"probe": stale, "memcached": retired}, ["probe", "memcached"]))
    code, out, _ = run_pin_images(capsys, "--image", "probe", "--digests", str(digests), "--authfile", authfile,
                                  "--insecure-registry", registry.host)
    assert code == 0 and "memcached: dropped its record" in out and "probe: dropped" not in out
    assert f"probe: {ref} (no digest) -> {pushed}" in out  # the 0.9.0 record never applied to 1.0.0
    assert set(versions.load_digests(digests)) == {"probe"}


def test_pin_images_names_the_opt_outs_that_must_go(tmp_path, monkeypatch, capsys):
    """Once pin-images records a pin's digest, a stack file still naming it in
    platform.images.allowUnpinned is refused (test above); the command says which files and names.
    The registry's answer is a fake here (no registry holds these tags offline)."""
    digest = "sha256:" + "6" * 64
    monkeypatch.setattr(pin_images, "resolve", lambda ref, *_: digest)
    (tmp_path / "Pulumi.lab.yaml").write_text(
        "config:\n  cloudstation:platform:\n    images:\n      allowUnpinned: [pulsar, kaniko]\n")
    (tmp_path / "Pulumi.other.yaml").write_text("config:\n  cloudstation:environment: test\n")
    digests = tmp_path / "image-digests.yaml"
    digests.write_text(versions.DIGESTS_FILE.read_text())
    code, out, _ = run_pin_images(capsys, "--image", "kaniko", "--digests", str(digests), "--root", str(tmp_path))
    assert code == 0 and versions.load_digests(digests)["kaniko"].digest == digest
    assert ("Pulumi.lab.yaml: remove kaniko from cloudstation:platform.images.allowUnpinned (it runs by digest now; "
            "the stack refuses the entry until it goes)") in out
    assert "pulsar" not in out and "Pulumi.other.yaml" not in out


def test_skopeo_verifies_tls_and_takes_credentials_from_a_file_only():
    command = pin_images.skopeo_command("docker.io/library/redis:7.4.11-bookworm", authfile="/run/auth.json")
    assert command == ["skopeo", "inspect", "--raw", "--authfile=/run/auth.json",
                       "docker://docker.io/library/redis:7.4.11-bookworm"]
    local = pin_images.skopeo_command("127.0.0.1:5000/a:1@sha256:" + "e" * 64, insecure_hosts=["127.0.0.1:5000"])
    assert local == ["skopeo", "inspect", "--raw", "--tls-verify=false", "docker://127.0.0.1:5000/a:1"]


def test_only_schema_2_manifests_and_indexes_are_accepted():
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": []}).encode()
    assert pin_images.manifest_digest(index, "r") == "sha256:" + hashlib.sha256(index).hexdigest()
    # The digest is of the bytes as served, whitespace and key order included (never re-serialized).
    pretty = b'{\n   "mediaType": "application/vnd.oci.image.index.v1+json",\n   "schemaVersion": 2,\n   "manifests": []\n}'
    assert pin_images.manifest_digest(pretty, "r") == "sha256:" + hashlib.sha256(pretty).hexdigest()
    with pytest.raises(pin_images.PinError, match="not a schema 2"):
        pin_images.manifest_digest(json.dumps({"schemaVersion": 1, "signatures": []}).encode(), "r")
    with pytest.raises(pin_images.PinError, match="not a JSON manifest"):
        pin_images.manifest_digest(b"<html>", "r")


def test_an_unknown_pin_is_an_error_listing_the_pins(capsys):
    code, _, err = run_pin_images(capsys, "--image", "redis-typo", "--dry-run")
    assert code == 1 and "unknown image redis-typo; the pins are: registry," in err


def test_skopeo_is_installed():
    assert subprocess.run(["skopeo", "--version"], capture_output=True).returncode == 0
