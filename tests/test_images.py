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
from infra import versions
from cloudstation_tools import checks, cli, pin_images, render
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
    """(where, image) of every container of every workload, and the proxy images the operator
    gives entity pods (its ConfigMap)."""
    found = [(f"{where} container {c['name']}", c["image"])
             for where, spec in checks.workloads(rendered.manifests()) for c in checks.containers(spec)]
    for config_map in objects(rendered, "ConfigMap"):
        if config_map["metadata"]["name"] == "cloudstate-operator-config":
            for key, image in operator.parse_operator_config(config_map["data"]["config"])["proxy.image"].items():
                found.append((f"operator proxy.image.{key}", image))
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
        assert {"registry", "postgres", "redis", "cloudstate-operator", "armada-server"} <= seen
    assert any(versions.digest_of(expected_ref(name, None)) for name in seen), "no platform image runs by digest"


def test_a_mirror_keeps_the_tag_and_the_digest():
    ref = versions.image("redis", "mirror.example:5000/hub/")
    record = versions.RECORDS["redis"]
    assert ref == "mirror.example:5000/hub/library/redis:" + versions.tag_of(record.ref) + "@" + record.digest


def test_a_mirrored_stack_runs_every_platform_image_from_the_mirror_by_digest():
    mirror = "mirror.example:5000/hub"
    stack_file = render.StackFile.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    stack_file.values["cloudstation:platform"] = json.dumps({**platform, "imageMirror": mirror})
    rendered = render.render("test", ROOT, stack_file=stack_file)
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
    code = cli.main(["pin-images", *args])
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
