"""Promotion and rollback end to end: the repository's prod stack file (copied), a real registry
with auth, test-stack state in a file:// and an S3 (moto server) backend, the Pulumi CLI path, ECR
(moto), every refusal leaving file, registry tags and history untouched, and every refusal's remedy
followed literally (the command parsed from the message and run) until the state is consistent."""
from __future__ import annotations

import functools
import gzip
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import boto3
import pytest
import yaml
from moto import mock_aws
from moto.server import ThreadedMotoServer

from cloudstation_tools import cli, promote, stack_file, state_backend
from components import registry_api
from infra.image_refs import entity_repository
from components.limits import Deadline
from cloudstation_tools.promote import PromotionRefused
from tests import stacks, unpinned
from tests.conftest import ROOT
from tests.registry_server import (
    PASSWORD, USERNAME, CountingProxy, build_oci_image, ecr_manifest, free_port,
)

REPO_PROD = stack_file.read_text(stacks.DIR / "Pulumi.prod.yaml")
"""The fixture prod file (tests/stacks/): never promoted, so every promotion here is a first one (image lines inserted)."""
NODE_HOST, PREFIX = promote.registry_of(stack_file.parse(REPO_PROD, "Pulumi.prod.yaml"))
"""The registry host of the prod file's references (how nodes reach it, e.g. localhost:32000) and the
repository prefix; the promoter reaches the test registry there through CLOUDSTATION_REGISTRY_ADDRESSES."""
ADDED = "shop/checkout"
"""An entity added to both stacks after a first promotion (in neither of the repository's files)."""
REMEDY = re.compile(r"`(python -m infra [^`]+)`")
"""A command a refusal names as its remedy."""
SECURE_LINE = "  cloudstation:someToken:\n    secure: v1:3b6XxQ1c9Do8r7Wh:sC8mEOz5zQ4t+uJzGBYvVj7Qqg2aUQ==\n"
PROMOTE = ["promote", "--from", "test", "--to", "prod"]
SALT_LINE = "encryptionsalt: v1:Xx4bW0xbx1Y=:v1:fd8Fv3/k0d8b7Nbx:bqPw2r3ZmzvF5Zp6kQH6YQ==\n"


@pytest.fixture(scope="module")
def all_pushed(registry, tmp_path_factory) -> dict[str, dict[str, str]]:  # noqa: F811
    """For every entity of the repository's prod file and ADDED: an `old` (in prod) and a `new` (in
    test) image, digest-pinned refs in the test registry; `repository` is the image repository."""
    layout = tmp_path_factory.mktemp("oci")
    jobs = []
    for key in [*stack_file.image_slots(REPO_PROD), ADDED]:
        repository = entity_repository(PREFIX, *key.split("/", 1))
        for version in ("old", "new"):
            image = build_oci_image(layout, f"{key.replace('/', '-')}-{version}", f"{key} {version}".encode())
            jobs.append((key, version, repository, image))
    with ThreadPoolExecutor(4) as pool:
        digests = list(pool.map(lambda job: registry.push(job[3], job[2], f"test-{job[1]}"), jobs))
    refs: dict[str, dict[str, str]] = {}
    for (key, version, repository, _), digest in zip(jobs, digests):
        ref = f"{NODE_HOST}/{repository}:test-{version}@{digest}"
        refs.setdefault(key, {"repository": repository})[version] = ref
    return refs


@pytest.fixture(scope="module")
def pushed(all_pushed) -> dict[str, dict[str, str]]:
    """The images of the repository's prod file's entities."""
    return {key: refs for key, refs in all_pushed.items() if key != ADDED}


@pytest.fixture(scope="module")
def added(all_pushed) -> dict[str, str]:
    """ADDED's images."""
    return all_pushed[ADDED]


@pytest.fixture
def env(monkeypatch, tmp_path, registry):  # noqa: F811
    monkeypatch.setenv(registry_api.USERNAME_ENV, USERNAME)
    monkeypatch.setenv(registry_api.PASSWORD_ENV, PASSWORD)
    monkeypatch.setenv(registry_api.HOST_ENV, NODE_HOST)
    monkeypatch.setenv(registry_api.ADDRESSES_ENV, f"{NODE_HOST}={registry.host}")
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-pulumi-here"))  # the direct state-backend path


@pytest.fixture
def root(tmp_path, pushed) -> Path:
    """A project directory whose Pulumi.prod.yaml is the repository's, with the `old` images,
    a secure value and an encryption salt."""
    directory = tmp_path / "project"
    directory.mkdir()
    text = stack_file.edit(REPO_PROD, {key: refs["old"] for key, refs in pushed.items()})
    text = SALT_LINE + text.replace("config:\n", "config:\n" + SECURE_LINE, 1)
    (directory / "Pulumi.prod.yaml").write_text(text)
    # The stack that owns the shared cluster, which prod's validation reads (infra/cluster_sharing.py).
    shutil.copy(stacks.DIR / "Pulumi.test.yaml", directory / "Pulumi.test.yaml")
    return directory


def checkpoint(outputs: dict) -> dict:
    """A version 3 checkpoint as the Pulumi CLI writes it, trimmed to what promotion reads."""
    stack_urn = "urn:pulumi:test::cloudstation::pulumi:pulumi:Stack::cloudstation-test"
    return {
        "version": 3,
        "checkpoint": {
            "stack": "organization/cloudstation/test",
            "latest": {
                "manifest": {"time": "2026-01-01T00:00:00Z", "magic": "", "version": "v3.272.0"},
                "resources": [
                    {"urn": stack_urn, "custom": False, "type": "pulumi:pulumi:Stack", "outputs": outputs},
                    {"urn": "urn:pulumi:test::cloudstation::pulumi:providers:kubernetes::kubernetes",
                     "custom": True, "type": "pulumi:providers:kubernetes", "outputs": {}},
                ],
            },
        },
    }


def file_backend(tmp_path: Path, images: dict, name: str = "test.json") -> str:
    path = tmp_path / "state" / ".pulumi" / "stacks" / "cloudstation" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(checkpoint({"images": images})).encode()
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return f"file://{tmp_path / 'state'}"


def new_images(pushed) -> dict[str, str]:
    return {key: refs["new"] for key, refs in pushed.items()}


def tags(registry, pushed) -> dict[str, dict[str, str]]:  # noqa: F811
    """Every tag of every test repository and the digest it points at."""
    result = {}
    for repository in sorted({refs["repository"] for refs in pushed.values()}):
        listed = registry.session.get(f"{registry.url}/v2/{repository}/tags/list", auth=registry.auth, timeout=5).json()
        result[repository] = {tag: registry.digest_of(repository, tag) for tag in listed["tags"]}
    return result


def image_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines()) if line.lstrip().startswith("image:")]


def assert_untouched(root: Path, before: bytes, registry, pushed, tags_before) -> None:  # noqa: F811
    assert (root / "Pulumi.prod.yaml").read_bytes() == before
    assert not (root / "promotions.prod.jsonl").exists()
    assert tags(registry, pushed) == tags_before
    assert sorted(p.name for p in root.iterdir()) == ["Pulumi.prod.yaml", "Pulumi.test.yaml"]


def image_of(root: Path, key: str):
    return stack_file.image_slots(stack_file.read_text(root / "Pulumi.prod.yaml"))[key].value


def remedies(message: str) -> list[list[str]]:
    """The argv of every `python -m infra ...` command a refusal names as its remedy."""
    return [shlex.split(found)[3:] for found in REMEDY.findall(message)]


def run_remedy(message: str, root: Path, index: int = 0) -> list[str]:
    """Run the refusal's remedy command exactly as printed (plus the project directory, which a
    user runs it in) and require it to succeed."""
    commands = remedies(message)
    assert len(commands) > index, f"no remedy command in:\n{message}"
    argv = commands[index]
    cli.parser().parse_args(argv)  # a valid command line as printed
    assert cli.main([*argv, "--root", str(root)]) == 0, f"the remedy `{shlex.join(argv)}` failed"
    return argv


def assert_consistent(root: Path, expected: dict | None = None, history_matches: bool = True) -> None:
    """A state to deploy from: the prod file is valid prod config (every entity has an image), the
    history is valid and settled, and the file holds what the history says it wrote."""
    text = stack_file.read_text(root / "Pulumi.prod.yaml")
    stack_file.validate(text, root, "Pulumi.prod.yaml")
    history = promote.read_history(root, "prod")
    assert all(promote.state_of(r) != "pending" for r in history)
    slots = {key: slot.value for key, slot in stack_file.image_slots(text).items()}
    if history_matches:
        recorded = promote.recorded(history)
        assert {k: slots[k] for k in recorded if k in slots} == {k: v for k, v in recorded.items() if k in slots}
    if expected is not None:
        assert {k: slots.get(k) for k in expected} == expected


def bare_root(tmp_path: Path, name: str = "bare") -> Path:
    """A project directory with the repository's prod file as it ships (never promoted)."""
    directory = tmp_path / name
    directory.mkdir()
    shutil.copy(stacks.DIR / "Pulumi.prod.yaml", directory / "Pulumi.prod.yaml")
    shutil.copy(stacks.DIR / "Pulumi.test.yaml", directory / "Pulumi.test.yaml")
    return directory


def add_entity(path: Path, key: str = ADDED) -> None:
    """Add an entity to a stack file's project the way a person does: a new list item after the
    project's last entity (text appended at the right place, nothing else touched)."""
    project, entity = key.split("/")
    text = path.read_text()
    document = yaml.safe_load(text)
    names = [p["name"] for p in document["config"]["cloudstation:projects"]]
    last = document["config"]["cloudstation:projects"][names.index(project)]["entities"][-1]["name"]
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- name: {last}")
    indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
    end = start + 1
    while end < len(lines) and lines[end].startswith(indent + "  ") and lines[end].strip():
        end += 1
    block = [f"{indent}- name: {entity}\n", f"{indent}  kind: action\n", f"{indent}  language: javascript\n",
             f"{indent}  source: entities/{project}/{entity}\n"]
    path.write_text("".join(lines[:end] + block + lines[end:]))
    assert key in stack_file.image_slots(path.read_text())


def test_promote_command_copies_every_reference_exactly(env, root, tmp_path, registry, pushed, capsys):  # noqa: F811
    before = (root / "Pulumi.prod.yaml").read_text()
    backend = file_backend(tmp_path, new_images(pushed))
    assert cli.main(["promote", "--from", "test", "--to", "prod", "--backend", backend, "--root", str(root)]) == 0
    after = (root / "Pulumi.prod.yaml").read_text()

    # Only the image lines differ, and each now holds the test reference.
    old_lines, new_lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines)
    differing = [i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b]
    assert differing == image_lines(before) and len(differing) == len(pushed)
    assert SALT_LINE in after and SECURE_LINE in after
    assert {k: s.value for k, s in stack_file.image_slots(after).items()} == new_images(pushed)
    stack_file.validate(after, root, "Pulumi.prod.yaml")

    # The registry marks each promoted manifest, inside the registry.
    # The registry marks each promoted manifest, inside the registry, with one timestamp tag only:
    # no moving `prod` tag unless asked for (--moving-tag).
    [record] = promote.read_history(root, "prod")
    [stamp_tag] = record["tags"]
    assert re.fullmatch(r"prod-\d{8}T\d{6}Z", stamp_tag)
    for key, refs in pushed.items():
        digest = refs["new"].split("@")[1]
        assert registry.digest_of(refs["repository"], stamp_tag) == digest
        assert registry.digest_of(refs["repository"], "prod") is None

    assert record["action"] == "promote" and (record["from"], record["to"]) == ("test", "prod")
    assert record["references"] == new_images(pushed)
    assert record["previous"] == {key: refs["old"] for key, refs in pushed.items()}
    assert datetime.strptime(record["when"], "%Y-%m-%dT%H:%M:%SZ")

    out = capsys.readouterr()
    assert f"promoted {len(pushed)} image(s) in Pulumi.prod.yaml, tagged {stamp_tag}, recorded as #1" in out.out
    assert PASSWORD not in out.out + out.err


def test_registry_cost_is_one_get_and_one_put_per_tag_written(env, root, registry, pushed, monkeypatch):  # noqa: F811
    # Counted on the wire, by a proxy in front of the registry, with images handled in parallel.
    with CountingProxy(registry.url) as proxy:
        monkeypatch.setenv(registry_api.ADDRESSES_ENV, f"{NODE_HOST}={proxy.host}")
        result = promote.promote(root=root, images=new_images(pushed), parallel=8)
        seen, _ = proxy.reset()
    assert len(result.changes) == len(pushed) > 1
    # One 401 challenge for the registry, however many requests start at once ...
    assert [(s.method, s.status) for s in seen if s.status == 401] == [("GET", 401)]
    # ... then per image exactly one GET of the manifest by digest and one PUT per tag.
    answered = [s for s in seen if s.status != 401]
    for refs in pushed.values():
        image = registry_api.ImageRef.parse(refs["new"])
        mine = sorted((s.method, s.path) for s in answered if s.path.startswith(f"/v2/{image.repository}/manifests/"))
        assert mine == sorted([("GET", f"/v2/{image.repository}/manifests/{image.digest}")] + [
            ("PUT", f"/v2/{image.repository}/manifests/{tag}") for tag in result.tags
        ])
    assert len(seen) == 1 + len(pushed) * (1 + len(result.tags)) == result.stats.requests
    assert result.stats.bytes_sent < 1000 * 2 * len(pushed)  # manifests only


def test_dry_run_prints_the_change_and_writes_nothing(env, root, tmp_path, registry, pushed, capsys):  # noqa: F811
    before = (root / "Pulumi.prod.yaml").read_bytes()
    tags_before = tags(registry, pushed)
    backend = file_backend(tmp_path, new_images(pushed))
    argv = ["promote", "--from", "test", "--to", "prod", "--dry-run", "--backend", backend, "--root", str(root)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for refs in pushed.values():
        assert [line for line in lines if line.endswith(f"image: {refs['old']}")][0].startswith("-")
        assert [line for line in lines if line.endswith(f"image: {refs['new']}")][0].startswith("+")
    assert f"dry run: would promote {len(pushed)} image(s)" in out
    assert_untouched(root, before, registry, pushed, tags_before)


@pytest.mark.parametrize("argv, changed", [
    (["--entity", "shop/cart"], ["shop/cart"]),
    (["--entity", "shop/cart", "--entity", "platform/project-state"], ["platform/project-state", "shop/cart"]),
    (["--project", "platform"], ["platform/project-state"]),
    (["--project", "shop"], "shop/"),  # every entity of the project, however many the prod file has
])
def test_promote_only_selected_projects_or_entities(env, root, tmp_path, pushed, argv, changed):
    if isinstance(changed, str):
        changed = sorted(key for key in pushed if key.startswith(changed))
        assert len(changed) > 1
    backend = file_backend(tmp_path, new_images(pushed))
    assert cli.main([*PROMOTE, "--backend", backend, "--root", str(root), *argv]) == 0
    slots = stack_file.image_slots(stack_file.read_text(root / "Pulumi.prod.yaml"))
    assert sorted(k for k, s in slots.items() if s.value == pushed[k]["new"]) == changed
    assert sorted(k for k, s in slots.items() if s.value == pushed[k]["old"]) == sorted(set(pushed) - set(changed))


def _not_pinned(images, pushed):
    images["shop/cart"] = images["shop/cart"].split("@")[0]


def _missing_in_test(images, pushed):
    del images["shop/likes"]


def _missing_in_prod(images, pushed):
    images["shop/checkout"] = pushed["shop/cart"]["new"]


def _not_in_registry(images, pushed):
    images["shop/add-item"] = images["shop/add-item"].split("@")[0] + "@sha256:" + "f" * 64  # (all zeros: a placeholder, refused earlier)


def _unknown_repository(images, pushed):
    images["shop/cart"] = images["shop/cart"].replace("/shop/cart:", "/shop/no-such-repo:")


def _other_registry(images, pushed):
    images["shop/cart"] = "registry.example/" + images["shop/cart"].split("/", 1)[1]


def _other_entity(images, pushed):
    images["shop/likes"] = images["shop/cart"]  # a real image, but another entity's repository


def _trailing_newline(images, pushed):
    images["shop/cart"] += "\n"


def _non_ascii_tag(images, pushed):
    images["shop/cart"] = images["shop/cart"].replace(":test-new@", ":t\u00e9st@")


@pytest.mark.parametrize("mutate, argv, message", [
    (_not_pinned, [], r"shop/cart: the test reference '.*shop/cart:test-new' is not pinned by digest"),
    (_missing_in_test, [], r"shop/likes: in Pulumi.prod.yaml \(cloudstation:projects\[0\].entities\[1\].image\) "
                           r"but missing from the test stack's `images` output"),
    (_missing_in_prod, [], r"shop/checkout: deployed in test but missing from Pulumi.prod.yaml"),
    (_not_in_registry, [], r"shop/add-item: sha256:f{64} is not in the registry \(localhost:\d+/shop/add-item\)"),
    (_unknown_repository, [], r"shop/cart: the test reference .*: repository 'shop/no-such-repo' is not this entity's"),
    (_other_registry, [], r"shop/cart: the test reference 'registry.example/shop/cart.*: registry host "
                          r"'registry.example' is not this stack's registry \(localhost:\d+"),
    (_other_entity, [], r"shop/likes: the test reference .*/shop/cart:.*: repository 'shop/cart' is not this "
                        r"entity's .*expected localhost:\d+/shop/likes\[:tag\]"),
    (_trailing_newline, [], r"shop/cart: the test reference '.*\\n' is not pinned by digest"),
    (_non_ascii_tag, [], r"shop/cart: the test reference '.*:t\u00e9st@sha256:.*' is not pinned by digest"),
    (None, ["--entity", "shop/nope"], r"--entity shop/nope: no such entity"),
    (None, ["--entity", "cart"], r"--entity 'cart': must be <project>/<entity>"),
    (None, ["--project", "nope"], r"--project nope: no such project"),
])
def test_refusals_leave_file_registry_and_history_untouched(
    env, root, tmp_path, registry, pushed, capsys, monkeypatch, mutate, argv, message  # noqa: F811
):
    before = (root / "Pulumi.prod.yaml").read_bytes()
    tags_before = tags(registry, pushed)
    images = new_images(pushed)
    if mutate:
        mutate(images, pushed)
    backend = file_backend(tmp_path, images)
    assert cli.main([*PROMOTE, "--backend", backend, "--root", str(root), *argv]) == 1
    err = capsys.readouterr().err
    assert "promotion refused, nothing was changed" in err
    assert re.search(message, err), err
    assert_untouched(root, before, registry, pushed, tags_before)
    # The remedy it names, run as printed, promotes what can be promoted and leaves a consistent state.
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend)
    run_remedy(err, root)
    assert_consistent(root)
    assert len(promote.read_history(root, "prod")) == 1


def test_a_registry_lying_about_a_manifest_refuses_the_promotion(
    env, root, tmp_path, registry, pushed, capsys, monkeypatch  # noqa: F811
):
    """Issue 20 finding 11: a registry that answers the test stack's digest with another image's
    manifest (its own old one) must not get that image promoted: the bytes are hashed, and a
    mismatch refuses the whole promotion before any tag or line is written."""
    before = (root / "Pulumi.prod.yaml").read_bytes()
    tags_before = tags(registry, pushed)
    new, old = (registry_api.ImageRef.parse(pushed["shop/cart"][v]) for v in ("new", "old"))
    old_manifest = registry.session.get(f"{registry.url}/v2/{old.repository}/manifests/{old.digest}",
                                        headers={"Accept": registry_api.ACCEPT}, auth=registry.auth, timeout=5).content

    def lie(seen, _content):
        return old_manifest if (seen.method, seen.path) == ("GET", f"/v2/{new.repository}/manifests/{new.digest}") else None

    with CountingProxy(registry.url, lie=lie) as liar:
        monkeypatch.setenv(registry_api.ADDRESSES_ENV, f"{NODE_HOST}={liar.host}")
        backend = file_backend(tmp_path, new_images(pushed))
        assert cli.main([*PROMOTE, "--backend", backend, "--root", str(root)]) == 1
        assert any(s.path == f"/v2/{new.repository}/manifests/{new.digest}" for s in liar.seen)
    err = capsys.readouterr().err
    assert "promotion refused, nothing was changed" in err
    assert re.search(rf"shop/cart: .*the registry returned a manifest whose digest is {old.digest}", err), err
    assert_untouched(root, before, registry, pushed, tags_before)


def test_refusal_lists_every_problem_at_once(env, root, pushed):
    images = new_images(pushed)
    _not_pinned(images, pushed)
    _missing_in_test(images, pushed)
    with pytest.raises(PromotionRefused) as refused:
        promote.promote(root=root, images=images)
    *problems, remedy = refused.value.problems
    assert [p.split(":")[0] for p in problems] == ["shop/cart", "shop/likes"]
    others = sorted(set(pushed) - {"shop/cart", "shop/likes"})
    assert remedy == "or promote only the others: " + promote.promote_command("test", "prod", others)


def test_refuses_without_registry_credentials(env, root, registry, pushed, monkeypatch):  # noqa: F811
    before = (root / "Pulumi.prod.yaml").read_bytes()
    tags_before = tags(registry, pushed)
    monkeypatch.delenv(registry_api.PASSWORD_ENV)
    monkeypatch.setenv("DOCKER_CONFIG", str(root / "no-docker-config"))
    with pytest.raises(PromotionRefused, match="requires authentication") as refused:
        promote.promote(root=root, images=new_images(pushed))
    assert_untouched(root, before, registry, pushed, tags_before)
    assert promote.ACCESS_REMEDY in refused.value.problems
    monkeypatch.setenv(registry_api.PASSWORD_ENV, PASSWORD)  # the remedy: the registry's credentials
    promote.promote(root=root, images=new_images(pushed))
    assert_consistent(root, new_images(pushed))


def test_registry_refusing_the_tag_leaves_the_file_and_history(env, root, pushed):
    def read_only(host):
        client = registry_api.connect(host)

        def deny(ref, manifest, tag):
            raise registry_api.RegistryError(f"{ref}: PUT tag {tag!r} answered HTTP 403: denied")

        client.tag = deny
        return client

    before = (root / "Pulumi.prod.yaml").read_bytes()
    with pytest.raises(PromotionRefused, match=r"PUT tag 'prod-\d{8}T\d{6}Z' answered HTTP 403") as refused:
        promote.promote(root=root, images=new_images(pushed), connect=read_only)
    assert (root / "Pulumi.prod.yaml").read_bytes() == before
    assert not (root / "promotions.prod.jsonl").exists()
    # The remedy: once the registry accepts the tags, run it again.
    assert "once the registry accepts tags from these credentials (push rights), run it again" in str(refused.value)
    promote.promote(root=root, images=new_images(pushed))
    assert_consistent(root, new_images(pushed))


def test_rollback_restores_the_exact_previous_file(env, root, tmp_path, registry, pushed, capsys, monkeypatch):  # noqa: F811
    original = (root / "Pulumi.prod.yaml").read_bytes()
    backend = file_backend(tmp_path, new_images(pushed))
    common = ["--backend", backend, "--root", str(root)]
    assert cli.main(["promote", "--from", "test", "--to", "prod", "--entity", "shop/cart", *common]) == 0
    once = (root / "Pulumi.prod.yaml").read_bytes()
    assert cli.main(["promote", "--from", "test", "--to", "prod", *common]) == 0
    assert cli.main(["rollback", "--stack", "prod", "--dry-run", "--root", str(root)]) == 0
    assert "dry run: would roll back" in capsys.readouterr().out
    assert len(promote.read_history(root, "prod")) == 2

    assert cli.main(["rollback", "--stack", "prod", "--root", str(root)]) == 0
    assert "rolled back" in capsys.readouterr().out
    assert (root / "Pulumi.prod.yaml").read_bytes() == once
    [stamp] = promote.read_history(root, "prod")[-1]["tags"]
    assert registry.digest_of(pushed["shop/likes"]["repository"], stamp) == pushed["shop/likes"]["old"].split("@")[1]
    assert cli.main(["rollback", "--stack", "prod", "--root", str(root)]) == 0
    assert (root / "Pulumi.prod.yaml").read_bytes() == original
    [stamp] = promote.read_history(root, "prod")[-1]["tags"]
    assert registry.digest_of(pushed["shop/cart"]["repository"], stamp) == pushed["shop/cart"]["old"].split("@")[1]

    history = promote.read_history(root, "prod")
    assert [(r["id"], r["action"], r.get("undoes")) for r in history] == [
        (1, "promote", None), (2, "promote", None), (3, "rollback", [2]), (4, "rollback", [1])
    ]
    assert history[3]["references"] == {"shop/cart": pushed["shop/cart"]["old"]}
    assert history[3]["previous"] == {"shop/cart": pushed["shop/cart"]["new"]}

    capsys.readouterr()
    assert cli.main(["rollback", "--stack", "prod", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "no promotion left to roll back" in err
    assert (root / "Pulumi.prod.yaml").read_bytes() == original
    # Its remedy, run as printed: promote.
    monkeypatch.setenv("PULUMI_BACKEND_URL", backend)
    run_remedy(err, root)
    assert_consistent(root, new_images(pushed))


@pytest.mark.parametrize("remedy", ["command", "put back"])
def test_rollback_refuses_when_the_file_changed_since(env, root, pushed, capsys, remedy):
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    path = root / "Pulumi.prod.yaml"
    promoted = path.read_text()
    # Edited by hand to another image of the same repository (the registry rule holds).
    other = pushed["shop/cart"]["new"].replace(":test-new@", ":hand@")
    edited = stack_file.edit(promoted, {"shop/cart": other})
    path.write_text(edited)
    assert cli.main(["rollback", "--stack", "prod", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert re.search(r"shop/cart: Pulumi.prod.yaml has '.*:hand@.*', but the history's last record for it wrote "
                     r"'.*:test-new@.*': it was edited since", err), err
    assert path.read_text() == edited and len(promote.read_history(root, "prod")) == 1
    if remedy == "command":  # roll back anyway: the record keeps the edit as `previous`
        run_remedy(err, root)
        assert promote.read_history(root, "prod")[-1]["previous"] == {"shop/cart": other}
    else:  # put back what the history wrote, then roll back
        path.write_text(promoted)
        assert cli.main(["rollback", "--stack", "prod", "--root", str(root)]) == 0
    assert image_of(root, "shop/cart") == pushed["shop/cart"]["old"]
    assert_consistent(root)


def test_same_references_again_is_a_no_op(env, root, pushed, capsys):
    promote.promote(root=root, images=new_images(pushed))
    text = (root / "Pulumi.prod.yaml").read_bytes()
    result = promote.promote(root=root, images=new_images(pushed))
    assert result.changes == [] and result.record is None
    assert (root / "Pulumi.prod.yaml").read_bytes() == text and len(promote.read_history(root, "prod")) == 1


# --- the history file: validated first, appended safely, never lost (item 9) -------------------


def _history_line(pushed, **overrides) -> str:
    record = {"id": 1, "when": "2026-01-01T00:00:00Z", "action": "promote", "from": "test", "to": "prod",
              "references": {"shop/cart": pushed["shop/cart"]["old"]},
              "previous": {"shop/cart": pushed["shop/likes"]["old"].replace("/shop/likes:", "/shop/cart:")},
              "tags": ["prod", "prod-20260101T000000Z"], "state": "done", **overrides}
    return json.dumps(record)


@pytest.mark.parametrize("history, message", [
    (lambda p: "not json\n", r"line 1: not JSON"),
    (lambda p: _history_line(p, id=0) + "\n", r"line 1: id 0 is not a whole number above 0"),
    (lambda p: _history_line(p) + "\n" + _history_line(p, id=1) + "\n", r"line 2: id 1 is not a whole number above 1"),
    (lambda p: _history_line(p, references={"shop/cart": "localhost:32000/shop/cart:v1"}) + "\n",
     r"line 1: references must map <project>/<entity> to digest-pinned references"),
    (lambda p: _history_line(p, previous={"shop/likes": None}) + "\n", r"line 1: previous must map the same keys"),
    (lambda p: _history_line(p, state="pending") + "\n" + _history_line(p, id=2) + "\n",
     r"line 1: only the last record can be pending"),
    (lambda p: _history_line(p, action="rollback", undoes=1) + "\n", r"line 1: undoes 1, which is not an earlier"),
])
def test_a_bad_history_is_refused_before_anything_happens(env, root, registry, pushed, history, message):  # noqa: F811
    path = root / "promotions.prod.jsonl"
    path.write_text(history(pushed))
    before, history_before, tags_before = (root / "Pulumi.prod.yaml").read_bytes(), path.read_bytes(), tags(registry, pushed)
    for run in (lambda: promote.promote(root=root, images=new_images(pushed)), lambda: promote.rollback(root=root)):
        with pytest.raises(PromotionRefused, match=message):
            run()
        assert (root / "Pulumi.prod.yaml").read_bytes() == before and path.read_bytes() == history_before
        assert tags(registry, pushed) == tags_before
    remove_named_lines(run, path)


def remove_named_lines(run, path: Path) -> None:
    """The history refusal's remedy, done as it says: remove the lines it names, run it again."""
    with pytest.raises(PromotionRefused) as refused:
        run()
    found = re.search(r"remove lines? ([\d, ]+) of ", str(refused.value))
    assert found, str(refused.value)
    numbers = {int(n) for n in found.group(1).split(",")}
    lines = path.read_text().split("\n")
    path.write_text("\n".join(line for number, line in enumerate(lines, 1) if number not in numbers))
    promote.read_history(path.parent, "prod")  # valid now


def test_a_bad_line_amid_the_history_is_removed_as_told(env, root, pushed):
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    promote.promote(root=root, images=new_images(pushed), entities=["shop/likes"])
    promote.rollback(root=root)  # undoes 2
    path = root / "promotions.prod.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")  # line 2 cut short
    with pytest.raises(PromotionRefused, match=r"line 2: not JSON(.|\n)*line 3: undoes \[2\], which is not an earlier "
                                               r"promotion(.|\n)*remove lines 2, 3 of"):
        promote.rollback(root=root)
    remove_named_lines(lambda: promote.rollback(root=root), path)
    assert_consistent(root)
    promote.rollback(root=root)  # promotion 1, as the file holds what it wrote
    assert_consistent(root, {key: refs["old"] for key, refs in pushed.items()})


def test_append_adds_the_missing_final_newline(env, root, pushed):
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    path = root / "promotions.prod.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # e.g. an editor that strips it
    promote.promote(root=root, images=new_images(pushed))
    assert [(r["id"], r["state"]) for r in promote.read_history(root, "prod")] == [(1, "done"), (2, "done")]
    assert path.read_bytes().count(b"\n") == 2 and path.read_bytes().endswith(b"\n")


def test_a_concurrent_run_is_refused_while_one_holds_the_lock(env, root, registry, pushed):  # noqa: F811
    import fcntl

    before, tags_before = (root / "Pulumi.prod.yaml").read_bytes(), tags(registry, pushed)
    holder = os.open(root, os.O_RDONLY)  # what a running promote or rollback holds
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(PromotionRefused, match="another promote or rollback is running"):
            promote.promote(root=root, images=new_images(pushed))
        with pytest.raises(PromotionRefused, match="another promote or rollback is running"):
            promote.rollback(root=root)
    finally:
        os.close(holder)
    assert_untouched(root, before, registry, pushed, tags_before)
    promote.promote(root=root, images=new_images(pushed))  # released: runs


KILL_AT_RENAME = """\
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from cloudstation_tools import promote
real_replace = os.replace
def replace(source, target):
    if Path(target).name == "Pulumi.prod.yaml":
        if sys.argv[4] == "after":
            real_replace(source, target)
        os._exit(9)  # killed right after (or right before) the stack file's rename
    real_replace(source, target)
os.replace = replace
promote.promote(root=Path(sys.argv[2]), images=json.loads(sys.argv[3]))
"""


def _killed_promotion(root, pushed, when: str) -> None:
    command = [sys.executable, "-c", KILL_AT_RENAME, str(ROOT), str(root), json.dumps(new_images(pushed)), when]
    assert subprocess.run(command, capture_output=True).returncode == 9


def test_a_kill_after_the_rename_does_not_lose_the_record(env, root, pushed):
    original = (root / "Pulumi.prod.yaml").read_bytes()
    _killed_promotion(root, pushed, "after")
    assert {k: s.value for k, s in stack_file.image_slots(stack_file.read_text(root / "Pulumi.prod.yaml")).items()} \
        == new_images(pushed)
    [record] = promote.read_history(root, "prod")
    assert record["state"] == "pending" and record["references"] == new_images(pushed)
    # The next run settles it from the file (which holds its references), then rolls it back.
    promote.rollback(root=root)
    assert (root / "Pulumi.prod.yaml").read_bytes() == original
    assert [(r["id"], r["action"], r["state"]) for r in promote.read_history(root, "prod")] == [
        (1, "promote", "done"), (2, "rollback", "done")
    ]


def test_a_kill_before_the_rename_leaves_an_abandoned_record(env, root, pushed):
    original = (root / "Pulumi.prod.yaml").read_bytes()
    _killed_promotion(root, pushed, "before")
    assert (root / "Pulumi.prod.yaml").read_bytes() == original
    with pytest.raises(PromotionRefused, match="no promotion left to roll back"):
        promote.rollback(root=root)  # settles record 1 as abandoned: nothing to undo
    assert [r["state"] for r in promote.read_history(root, "prod")] == ["abandoned"]
    promote.promote(root=root, images=new_images(pushed))
    assert [(r["id"], r["state"]) for r in promote.read_history(root, "prod")] == [(1, "abandoned"), (2, "done")]


def test_rollback_replays_only_previous_references_of_this_stacks_registry(  # noqa: F811
    env, root, tmp_path, registry, pushed, monkeypatch
):
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    path = root / "promotions.prod.jsonl"
    [record] = promote.read_history(root, "prod")
    planted = "registry.example/shop/cart@" + pushed["shop/cart"]["old"].split("@")[1]
    path.write_text(json.dumps({**record, "previous": {"shop/cart": planted}}) + "\n")
    before, tags_before = (root / "Pulumi.prod.yaml").read_bytes(), tags(registry, pushed)
    with pytest.raises(PromotionRefused, match=r"shop/cart: the previous reference 'registry.example/shop/cart@.*' "
                                               r"in promotion 1: registry host 'registry.example' is not") as refused:
        promote.rollback(root=root)
    assert (root / "Pulumi.prod.yaml").read_bytes() == before and tags(registry, pushed) == tags_before
    # The remedy: promote what test runs (here test was redeployed with the previous version).
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, {k: r["old"] for k, r in pushed.items()}))
    assert run_remedy(str(refused.value), root) == [*PROMOTE, "--entity", "shop/cart"]
    assert image_of(root, "shop/cart") == pushed["shop/cart"]["old"]
    assert_consistent(root)


def test_the_deadline_bounds_the_whole_run(env, root, tmp_path, pushed, capsys):
    before = (root / "Pulumi.prod.yaml").read_bytes()
    backend = file_backend(tmp_path, new_images(pushed))
    argv = [*PROMOTE, "--backend", backend, "--root", str(root), "--timeout", "0"]
    assert cli.main(argv) == 1
    assert "deadline (--timeout)" in capsys.readouterr().err
    assert (root / "Pulumi.prod.yaml").read_bytes() == before


# --- reading the test stack's outputs --------------------------------------------------------


def test_file_backend_reads_plain_and_gzipped_checkpoints(tmp_path):
    images = {"shop/cart": "r.example/shop/cart@sha256:" + "1" * 64}
    for name in ("test.json", "test.json.gz"):
        backend = file_backend(tmp_path / name, images, name)
        assert state_backend.stack_output("test", "images", backend=backend, root=tmp_path, use_cli=False) == images


@pytest.mark.parametrize("document, message", [
    ({"version": 2, "checkpoint": {}}, "checkpoint version 2 is not supported"),
    ({"version": 3, "checkpoint": {"latest": {"resources": []}}}, "has not been deployed"),
])
def test_file_backend_refuses_unusable_checkpoints(tmp_path, document, message):
    path = tmp_path / ".pulumi" / "stacks" / "cloudstation" / "test.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    with pytest.raises(state_backend.StateError, match=message):
        state_backend.stack_output("test", "images", backend=f"file://{tmp_path}", root=tmp_path, use_cli=False)


def test_missing_stack_or_backend_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    with pytest.raises(state_backend.StateError, match="stack cloudstation/test not found"):
        state_backend.stack_output("test", "images", backend=f"file://{tmp_path}", root=tmp_path, use_cli=False)
    with pytest.raises(state_backend.StateError, match="no state backend"):
        state_backend.stack_output("test", "images", root=tmp_path, use_cli=False)
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}")
    with pytest.raises(state_backend.StateError, match="not found"):
        state_backend.stack_output("test", "images", root=tmp_path, use_cli=False)
    backend = file_backend(tmp_path, {})
    with pytest.raises(state_backend.StateError, match=r"has no output `other` \(outputs: images\)"):
        state_backend.stack_output("test", "other", backend=backend, root=tmp_path, use_cli=False)


def test_secret_images_output_is_refused(env, root, tmp_path, pushed):
    secret = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "ciphertext": "v1:abc"}
    backend = file_backend(tmp_path, secret)
    with pytest.raises(PromotionRefused, match="`images` output is not a map: \\[secret\\] — deploy test with this "
                                               "program"):
        promote.promote(root=root, backend=backend)
    backend = file_backend(tmp_path, new_images(pushed))  # what deploying test with this program writes
    promote.promote(root=root, backend=backend)
    assert_consistent(root, new_images(pushed))


def test_uses_the_pulumi_cli_when_it_is_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.json"
    fake = bin_dir / "pulumi"
    fake.write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"call = [sys.argv[1:], os.environ.get('PULUMI_BACKEND_URL'), os.getcwd()]\n"
        f"open({str(log)!r}, 'w').write(json.dumps(call))\n"
        "print(json.dumps({'shop/cart': 'from-cli'}))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    images = state_backend.stack_output("test", "images", backend="s3://state-bucket", root=tmp_path)
    assert images == {"shop/cart": "from-cli"}
    assert json.loads(log.read_text()) == [
        ["stack", "output", "images", "--json", "--stack", "test"], "s3://state-bucket", str(tmp_path)
    ]


def test_state_reads_are_bounded_in_size_and_time(tmp_path, monkeypatch):
    images = {"shop/cart": "localhost:32000/shop/cart@sha256:" + "1" * 64}
    padded = checkpoint({"images": images, "padding": "x" * 4096})
    path = tmp_path / ".pulumi" / "stacks" / "cloudstation" / "test.json.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(json.dumps(padded).encode()))  # ~300 bytes on disk, 4 KiB inflated
    monkeypatch.setattr(state_backend, "MAX_CHECKPOINT_BYTES", 2048)
    with pytest.raises(state_backend.StateError, match="expands to more than 2048 bytes"):
        state_backend.stack_output("test", "images", backend=f"file://{tmp_path}", root=tmp_path, use_cli=False)
    path.unlink()
    path.with_suffix("").write_text(json.dumps(padded))
    with pytest.raises(state_backend.StateError, match="larger than the 2048 bytes allowed"):
        state_backend.stack_output("test", "images", backend=f"file://{tmp_path}", root=tmp_path, use_cli=False)

    # A `pulumi` that never answers is given up on at the deadline.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    started = datetime.now()
    with pytest.raises(state_backend.StateError, match=r"pulumi stack output images --stack test`: gave up at the "
                                                       r"1 s deadline"):
        state_backend.stack_output("test", "images", root=tmp_path, deadline=Deadline(1))
    assert (datetime.now() - started).total_seconds() < 5


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 API on a free loopback port, always stopped (a leftover server hangs the run)."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


def test_s3_backend_promotion(env, aws_env, s3_server, root, pushed):
    s3 = boto3.client("s3", endpoint_url=f"http://{s3_server}", region_name="us-east-1")
    s3.create_bucket(Bucket="cloudstation-state")
    s3.put_object(
        Bucket="cloudstation-state", Key="team-a/.pulumi/stacks/cloudstation/test.json",
        Body=json.dumps(checkpoint({"images": new_images(pushed), "other": 1})).encode(),
    )
    query = f"endpoint={s3_server}&s3ForcePathStyle=true&disableSSL=true&region=us-east-1"
    backend = f"s3://cloudstation-state/team-a?{query}"
    assert state_backend.stack_output("test", "other", backend=backend, root=root) == 1
    assert cli.main(["promote", "--from", "test", "--to", "prod", "--backend", backend, "--root", str(root)]) == 0
    slots = stack_file.image_slots(stack_file.read_text(root / "Pulumi.prod.yaml"))
    assert {k: s.value for k, s in slots.items()} == new_images(pushed)
    with pytest.raises(state_backend.StateError, match="cloudstation/prod not found in s3://cloudstation-state/team-a"):
        state_backend.stack_output("prod", "images", backend=backend, root=root)


# --- ECR (moto) ----------------------------------------------------------------------------

ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


def ecr_prod_file(prefix: str) -> str:
    """The repository's prod file on a cluster of its own with ECR as its registry (images under
    `<ECR>/<prefix>/<project>/<entity>`), as a fresh YAML document."""
    document = yaml.safe_load(REPO_PROD)
    config = document["config"]
    platform = config["cloudstation:platform"]
    platform.pop("clusterOwnerStack", None)
    platform.update(ownsClusterResources=True, registry={"mode": "external", "url": f"{ECR}/{prefix}", "username": "AWS"})
    platform.update(unpinned.opt_out(platform))  # it runs the operator now (pins without a digest record)
    config["cloudstation:registryPassword"] = {"secure": "v1:3b6XxQ1c9Do8r7Wh:sC8mEOz5zQ4t+uJzGBYvVj7Qqg2aUQ=="}
    return yaml.safe_dump(document, sort_keys=False)


def test_ecr_promotion(aws_env, tmp_path):
    text = ecr_prod_file("cloudstation")
    with mock_aws():
        ecr = boto3.client("ecr", region_name="us-east-1")
        refs: dict[str, dict[str, str]] = {}
        for index, key in enumerate(stack_file.image_slots(text)):
            repository = f"cloudstation/{key}"  # <prefix>/<project>/<entity>
            ecr.create_repository(repositoryName=repository)
            for version, layer in (("old", f"{2 * index:x}"), ("new", f"{2 * index + 1:x}")):
                image = ecr.put_image(repositoryName=repository, imageManifest=ecr_manifest(layer), imageTag=version)
                refs.setdefault(key, {"repository": repository})[version] = (
                    f"{ECR}/{repository}:{version}@{image['image']['imageId']['imageDigest']}"
                )
        root = tmp_path / "project"
        root.mkdir()
        old = stack_file.edit(text, {k: r["old"] for k, r in refs.items()})
        (root / "Pulumi.prod.yaml").write_text(old)
        when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
        result = promote.promote(root=root, images={k: r["new"] for k, r in refs.items()}, now=when)
        assert result.tags == ["prod-20260304T050607Z"]
        for key, ref in refs.items():
            details = ecr.describe_images(repositoryName=ref["repository"],
                                          imageIds=[{"imageTag": "prod-20260304T050607Z"}])
            assert sorted(details["imageDetails"][0]["imageTags"]) == ["new", "prod-20260304T050607Z"]
        promote.rollback(root=root, now=when.replace(second=8))
        assert (root / "Pulumi.prod.yaml").read_text() == old
        before = (root / "Pulumi.prod.yaml").read_bytes()
        missing = {k: r["new"].split("@")[0] + "@sha256:" + "e" * 64 for k, r in refs.items()}
        with pytest.raises(PromotionRefused, match="is not in the registry"):
            promote.promote(root=root, images=missing)
        assert (root / "Pulumi.prod.yaml").read_bytes() == before
        # Without the prefix, the repository is another one: refused before ECR is asked.
        unprefixed = {k: r["new"].replace("/cloudstation/", "/", 1) for k, r in refs.items()}
        with pytest.raises(PromotionRefused, match=r"repository 'shop/cart' is not this entity's .*"
                                                   r"expected 123456789012\.dkr\.ecr\.us-east-1\.amazonaws\.com/"
                                                   r"cloudstation/shop/cart"):
            promote.promote(root=root, images=unprefixed)
        shutil.rmtree(root)


# --- rollback never dead-ends; every refusal's remedy works (issue 12 item 5) ---------------------


def _cli(root: Path, capsys, *argv: str) -> tuple[int, str]:
    code = cli.main([*argv, "--root", str(root)])
    out = capsys.readouterr()
    return code, out.out + out.err


def follow(step, root: Path) -> tuple[str, list[str]]:
    """Run a step; if it is refused, run the remedy its message names, exactly as printed. Returns
    the step's output and the remedies run."""
    code, out = step()
    if code == 0:
        return out, []
    return out, [shlex.join(run_remedy(out, root))]


def test_rollback_after_a_promotion_that_added_an_entity(env, tmp_path, registry, pushed, added, capsys, monkeypatch):  # noqa: F811
    """promote -> add an entity to both stacks -> promote -> rollback -> ... -> rollback to promotion 1
    -> rollback until nothing is left -> the remedy of that refusal: a consistent state at each step."""
    root = bare_root(tmp_path)
    images = {key: refs["old"] for key, refs in pushed.items()}
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, images))
    run = functools.partial(_cli, root, capsys)

    assert run(*PROMOTE)[0] == 0  # 1: every entity gets its first image
    assert_consistent(root, images)

    add_entity(root / "Pulumi.prod.yaml")  # 2: test deploys a new entity and a new cart
    images = {**images, "shop/cart": pushed["shop/cart"]["new"], ADDED: added["new"]}
    file_backend(tmp_path, images)
    code, out = run(*PROMOTE)
    assert code == 0, out
    assert_consistent(root, images)

    out, remedies_run = follow(lambda: run("rollback", "--stack", "prod"), root)  # 3
    assert remedies_run == []  # never refused: the added entity keeps its first image
    assert f"note: {ADDED}: kept at its first image {added['new']} — promotion 2 gave it" in out
    assert "rolled back 1 image(s) in Pulumi.prod.yaml" in out and "(undoes promotion 2)" in out
    assert_consistent(root, {**images, "shop/cart": pushed["shop/cart"]["old"]})

    # 4: two more promotions, then back to promotion 1 in one step.
    for key in ("shop/likes", "shop/add-item"):
        images = {**images, key: pushed[key]["new"]}
        file_backend(tmp_path, images)
        assert run(*PROMOTE, "--entity", key)[0] == 0
    code, out = run("rollback", "--stack", "prod", "--to", "1")
    assert code == 0, out
    assert "(undoes promotion 5, 4)" in out
    after_first = {**{key: refs["old"] for key, refs in pushed.items()}, ADDED: added["new"]}
    assert_consistent(root, after_first)

    # 5: promotion 1 only gave first images: undoing it keeps them all and is recorded.
    code, out = run("rollback", "--stack", "prod")
    assert code == 0, out
    assert "Pulumi.prod.yaml unchanged; recorded as #7 (undoes promotion 1)" in out
    assert_consistent(root, after_first)
    history = promote.read_history(root, "prod")
    assert [(r["id"], r["action"], r.get("undoes"), r["state"]) for r in history] == [
        (1, "promote", None, "done"), (2, "promote", None, "done"), (3, "rollback", [2], "done"),
        (4, "promote", None, "done"), (5, "promote", None, "done"), (6, "rollback", [5, 4], "done"),
        (7, "rollback", [1], "done"),
    ]
    assert promote.active_promotions(history) == []

    # 6: nothing left: refused, and the remedy it prints (promote) works.
    out, remedies_run = follow(lambda: run("rollback", "--stack", "prod"), root)
    assert remedies_run == ["promote --from test --to prod"]
    assert_consistent(root, images)


def _promoted_at(root, pushed, *keys_and_seconds):
    for key, second in keys_and_seconds:
        promote.promote(root=root, images=new_images(pushed), entities=[key],
                        now=datetime(2026, 3, 4, 5, 6, second, tzinfo=timezone.utc))


@pytest.mark.parametrize("to, undone", [
    (1, [3, 2]),
    ("2", [3]),
    ("prod-20260304T050601Z", [3, 2]),        # promotion 1's tag
    ("20260304T050602Z", [3]),
    ("2026-03-04T05:06:02Z", [3]),
    ("2026-03-04T05:06:02Z".replace("02Z", "09Z"), []),  # after the latest: nothing to undo
])
def test_rollback_to_a_promotion_by_id_time_or_tag(env, root, registry, pushed, to, undone):  # noqa: F811
    _promoted_at(root, pushed, ("shop/cart", 1), ("shop/likes", 2), ("shop/add-item", 3))
    result = promote.rollback(root=root, to=to, now=datetime(2026, 3, 4, 5, 7, tzinfo=timezone.utc))
    assert result.undoes == undone
    restored = {"shop/cart": 1, "shop/likes": 2, "shop/add-item": 3}
    for key, promotion in restored.items():
        expected = pushed[key]["old"] if promotion in undone else pushed[key]["new"]
        assert image_of(root, key) == expected
        if promotion in undone:  # the restored image is marked in the registry
            assert registry.digest_of(pushed[key]["repository"], "prod-20260304T050700Z") == expected.split("@")[1]
    assert_consistent(root)


@pytest.mark.parametrize("to, why", [
    ("9", "no such record"),
    ("4", "record 4 is a rollback"),
    ("3", "promotion 3 is not in effect (rolled back or abandoned)"),
    ("yesterday", "not a promotion id, a UTC time like 2026-03-04T05:06:07Z or a tag like prod-20260304T050607Z"),
    ("2026-03-04T05:06:00Z", "no promotion in effect at or before 2026-03-04T05:06:00Z"),
])
def test_rollback_to_something_else_names_a_promotion_in_effect(env, root, pushed, capsys, to, why):
    _promoted_at(root, pushed, ("shop/cart", 1), ("shop/likes", 2), ("shop/add-item", 3))
    promote.rollback(root=root)  # record 4 undoes 3
    before = (root / "Pulumi.prod.yaml").read_bytes()
    code, out = _cli(root, capsys, "rollback", "--stack", "prod", "--to", to)
    assert code == 1 and f"--to {to}: {why}; promotions in effect: 1 (2026-03-04T05:06:01Z), " \
                          f"2 (2026-03-04T05:06:02Z)" in out, out
    assert (root / "Pulumi.prod.yaml").read_bytes() == before
    assert run_remedy(out, root) == ["rollback", "--stack", "prod", "--to", "1"]
    assert image_of(root, "shop/likes") == pushed["shop/likes"]["old"]
    assert_consistent(root)


@pytest.mark.parametrize("when, suggested", [("after", "done"), ("before", "abandoned")])
def test_an_interrupted_record_whose_file_was_edited_since(env, root, pushed, when, suggested):
    _killed_promotion(root, pushed, when)
    path = root / "Pulumi.prod.yaml"
    # Edited by hand after the kill: shop/cart now holds neither what the record wrote nor what it replaced.
    hand = pushed["shop/cart"]["new"].replace(":test-new@", ":hand@")
    keep = {} if when == "before" else {k: r["new"] for k, r in pushed.items() if k != "shop/cart"}
    path.write_text(stack_file.edit(path.read_text(), {"shop/cart": hand, **keep}))
    with pytest.raises(PromotionRefused) as refused:
        promote.promote(root=root, images=new_images(pushed))
    found = re.search(r'set "state" to "(\w+)" on line (\d+) of (\S+), then run it again', str(refused.value))
    assert found and found.group(1) == suggested, str(refused.value)
    history = Path(found.group(3))
    lines = history.read_text().splitlines()
    number = int(found.group(2))
    lines[number - 1] = json.dumps({**json.loads(lines[number - 1]), "state": found.group(1)})
    history.write_text("\n".join(lines) + "\n")
    promote.promote(root=root, images=new_images(pushed))  # run it again
    assert_consistent(root, new_images(pushed))


def test_a_record_lost_while_the_file_was_written_is_given_back(env, root, pushed, monkeypatch):
    history = root / "promotions.prod.jsonl"
    real = stack_file.write_atomic

    def write_then_lose_the_history(path, text, expected=None):
        real(path, text, expected)
        if Path(path).name == "Pulumi.prod.yaml":
            history.write_text("")  # e.g. an editor saving an old copy of the history meanwhile

    monkeypatch.setattr(stack_file, "write_atomic", write_then_lose_the_history)
    with pytest.raises(PromotionRefused, match="record 1 is no longer there, but its change was written") as refused:
        promote.promote(root=root, images=new_images(pushed))
    monkeypatch.setattr(stack_file, "write_atomic", real)
    line = str(refused.value).split("then run it again: ", 1)[1].strip()
    with open(history, "a") as handle:
        handle.write(line + "\n")  # "add this line back at its end"
    promote.promote(root=root, images=new_images(pushed))  # run it again: nothing more to do
    assert_consistent(root, new_images(pushed))
    promote.rollback(root=root)
    assert_consistent(root, {key: refs["old"] for key, refs in pushed.items()})


def test_a_stack_file_changed_during_the_promotion_runs_again(env, root, pushed, monkeypatch):
    path = root / "Pulumi.prod.yaml"
    real = promote._append

    def append_while_someone_edits(history, record):
        real(history, record)
        path.write_text(path.read_text() + "# a comment saved meanwhile\n")

    monkeypatch.setattr(promote, "_append", append_while_someone_edits)
    with pytest.raises(stack_file.StackFileError, match="changed while the promotion ran; nothing was written, run it "
                                                       "again"):
        promote.promote(root=root, images=new_images(pushed))
    monkeypatch.setattr(promote, "_append", real)
    promote.promote(root=root, images=new_images(pushed))  # settles the pending record as abandoned, then runs
    assert [r["state"] for r in promote.read_history(root, "prod")] == ["abandoned", "done"]
    assert_consistent(root, new_images(pushed))


def test_entities_without_an_image_must_come_along(env, tmp_path, pushed, capsys, monkeypatch):
    root = bare_root(tmp_path)
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, new_images(pushed)))
    code, out = _cli(root, capsys, *PROMOTE, "--entity", "shop/cart")
    assert code == 1 and "shop/likes: has no image in Pulumi.prod.yaml yet (prod cannot deploy without one)" in out
    others = sorted(set(pushed) - {"shop/cart"})
    assert run_remedy(out, root) == [*PROMOTE, *[arg for key in ["shop/cart", *others] for arg in ("--entity", key)]]
    assert_consistent(root, new_images(pushed))


@pytest.mark.parametrize("remedy", ["deploy it to test", "remove the entity"])
def test_an_entity_without_image_missing_from_test(env, tmp_path, pushed, capsys, monkeypatch, remedy):
    root = bare_root(tmp_path)
    images = {k: v for k, v in new_images(pushed).items() if k != "shop/likes"}
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, images))
    code, out = _cli(root, capsys, *PROMOTE)
    assert code == 1 and re.search(r"shop/likes: in Pulumi.prod.yaml \(.*\) without an image, and missing from the test "
                                   r"stack's `images` output — deploy it to test first .*, or remove the entity from "
                                   r"cloudstation:projects in Pulumi.prod.yaml", out), out
    assert not remedies(out)  # promoting the others would leave likes without an image: not offered
    if remedy == "deploy it to test":
        file_backend(tmp_path, new_images(pushed))  # what deploying it to test adds to the output
        expected = new_images(pushed)
    else:
        document = yaml.safe_load((root / "Pulumi.prod.yaml").read_text())
        for project in document["config"]["cloudstation:projects"]:
            project["entities"] = [e for e in project["entities"] if f"{project['name']}/{e['name']}" != "shop/likes"]
        (root / "Pulumi.prod.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        expected = images
    assert _cli(root, capsys, *PROMOTE)[0] == 0
    assert_consistent(root, expected)


def test_an_entity_deployed_in_test_and_added_to_prod(env, root, pushed, added, capsys, tmp_path, monkeypatch):
    images = {**new_images(pushed), ADDED: added["new"]}
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, images))
    code, out = _cli(root, capsys, *PROMOTE)
    assert code == 1 and f"{ADDED}: deployed in test but missing from Pulumi.prod.yaml — add the entity to " \
                          "cloudstation:projects there first" in out
    add_entity(root / "Pulumi.prod.yaml")  # the first remedy (the other, promoting the others, runs above)
    assert _cli(root, capsys, *PROMOTE)[0] == 0
    assert_consistent(root, images)


def _immutable(tags_seen: dict):
    """A registry whose repositories have immutable tags, as ECR's (PutImage answers
    ImageTagAlreadyExistsException for a tag already on another image)."""
    def connect(host):
        client = registry_api.connect(host)
        real = client.tag

        def tag(ref, manifest, name):
            if tags_seen.setdefault((ref.repository, name), manifest.digest) != manifest.digest:
                raise registry_api.RegistryError(f"{ref}: tag {name!r} already exists on another image and "
                                                 f"{ref.repository} has immutable tags")
            real(ref, manifest, name)

        client.tag = tag
        return client
    return connect


def test_the_moving_tag_is_opt_in(env, root, registry, pushed, capsys, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, new_images(pushed)))
    code, out = _cli(root, capsys, *PROMOTE, "--moving-tag", "prod")
    assert code == 0, out
    [record] = promote.read_history(root, "prod")
    assert record["tags"][0] == "prod" and re.fullmatch(r"prod-\d{8}T\d{6}Z", record["tags"][1])
    for refs in pushed.values():
        assert registry.digest_of(refs["repository"], "prod") == refs["new"].split("@")[1]
    assert _cli(root, capsys, "rollback", "--stack", "prod", "--moving-tag", "prod")[0] == 0
    for refs in pushed.values():
        assert registry.digest_of(refs["repository"], "prod") == refs["old"].split("@")[1]
    # An invalid tag is refused with an example of a valid one.
    code, out = _cli(root, capsys, *PROMOTE, "--moving-tag", "prod/latest")
    found = re.search(r"e\.g\. --moving-tag (\S+)", out)
    assert code == 1 and found, out
    assert _cli(root, capsys, *PROMOTE, "--moving-tag", found.group(1))[0] == 0
    assert_consistent(root, new_images(pushed))


def test_a_moving_tag_on_immutable_repositories_fails_the_second_time(env, root, pushed):
    seen: dict = {}
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"], connect=_immutable(seen),
                    moving_tag="prod", now=datetime(2026, 3, 4, 5, 6, 1, tzinfo=timezone.utc))
    with pytest.raises(PromotionRefused, match="run it again without --moving-tag") as refused:
        promote.rollback(root=root, connect=_immutable(seen), moving_tag="prod",
                         now=datetime(2026, 3, 4, 5, 6, 2, tzinfo=timezone.utc))
    assert "tag 'prod' already exists on another image" in str(refused.value)
    promote.rollback(root=root, connect=_immutable(seen), now=datetime(2026, 3, 4, 5, 6, 2, tzinfo=timezone.utc))
    # The default timestamp tags are new each time: many promotions, no refusal.
    for second in (3, 4):
        promote.promote(root=root, images=new_images(pushed), connect=_immutable(seen),
                        now=datetime(2026, 3, 4, 5, 6, second, tzinfo=timezone.utc))
        promote.rollback(root=root, connect=_immutable(seen), now=datetime(2026, 3, 4, 5, 7, second, tzinfo=timezone.utc))
    assert_consistent(root)


def test_an_invalid_registry_section_is_named_with_its_fix(env, root, pushed):
    path = root / "Pulumi.prod.yaml"
    good = path.read_text()
    path.write_text(good.replace("mode: shared", "mode: sharde", 1))
    with pytest.raises(PromotionRefused, match=r"cloudstation:platform.registry is not valid(.|\n)*fix "
                                               r"cloudstation:platform.registry in Pulumi.prod.yaml"):
        promote.promote(root=root, images=new_images(pushed))
    path.write_text(good)  # fixed
    promote.promote(root=root, images=new_images(pushed))
    assert_consistent(root, new_images(pushed))


def test_an_invalid_stack_file_is_named_with_its_fix(env, root, pushed):
    path = root / "Pulumi.prod.yaml"
    good = path.read_text()
    path.write_text(good.replace("  cloudstation:environment: prod\n", "  cloudstation:environment: prod\n"
                                 "  cloudstation:enviroment: prod\n", 1))
    with pytest.raises(PromotionRefused, match=r"cloudstation:enviroment(.|\n)*fix that in Pulumi.prod.yaml, then run "
                                               r"it again"):
        promote.promote(root=root, images=new_images(pushed))
    path.write_text(good.replace("  cloudstation:environment: prod\n", "  cloudstation:environment: prod\n"
                                 "  cloudstation:environment: prod\n", 1))  # a repeated key: not even editable
    with pytest.raises(PromotionRefused, match=r"appears more than once(.|\n)*fix Pulumi.prod.yaml, then run it again"):
        promote.promote(root=root, images=new_images(pushed))
    path.write_text(good)  # fixed
    promote.promote(root=root, images=new_images(pushed))
    assert_consistent(root, new_images(pushed))


@pytest.mark.parametrize("argv", [[*PROMOTE[:-1], "nope"], ["rollback", "--stack", "nope"]])
def test_a_stack_without_a_file_names_the_stacks_there(env, root, pushed, capsys, tmp_path, monkeypatch, argv):
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, new_images(pushed)))
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    code, out = _cli(root, capsys, *argv)
    found = re.search(r"no Pulumi.nope.yaml in \S+: (--to|--stack) names the stack whose file is edited \(stack files "
                      r"here: prod, test\)", out)
    assert code == 1 and found, out
    assert _cli(root, capsys, *argv[:-1], "prod")[0] == 0
    assert_consistent(root)


def test_rollback_to_images_gone_from_the_registry(env, root, pushed, capsys, tmp_path, monkeypatch):
    promote.promote(root=root, images=new_images(pushed), entities=["shop/cart"])
    path = root / "promotions.prod.jsonl"
    [record] = promote.read_history(root, "prod")
    gone = pushed["shop/cart"]["old"].split("@")[0] + "@sha256:" + "e" * 64  # this repository, never pushed
    path.write_text(json.dumps({**record, "previous": {"shop/cart": gone}}) + "\n")
    code, out = _cli(root, capsys, "rollback", "--stack", "prod")
    assert code == 1 and "is not in the registry" in out and "those images are gone from the registry" in out, out
    monkeypatch.setenv("PULUMI_BACKEND_URL", file_backend(tmp_path, {k: r["old"] for k, r in pushed.items()}))
    run_remedy(out, root)
    assert image_of(root, "shop/cart") == pushed["shop/cart"]["old"]
    assert_consistent(root)


REMEDY_TESTS = {
    # function in cloudstation_tools/promote.py -> (how many PromotionRefused it raises, the tests that run their remedies)
    "_read_history": (1, ["test_a_bad_history_is_refused_before_anything_happens",
                          "test_a_bad_line_amid_the_history_is_removed_as_told"]),
    "_settle": (1, ["test_a_record_lost_while_the_file_was_written_is_given_back"]),
    "_settle_pending": (1, ["test_an_interrupted_record_whose_file_was_edited_since"]),
    "_locked": (1, ["test_a_concurrent_run_is_refused_while_one_holds_the_lock"]),
    "registry_of": (1, ["test_an_invalid_registry_section_is_named_with_its_fix"]),
    "select": (1, ["test_refusals_leave_file_registry_and_history_untouched", "test_refusal_lists_every_problem_at_once",
                   "test_entities_without_an_image_must_come_along", "test_an_entity_without_image_missing_from_test",
                   "test_an_entity_deployed_in_test_and_added_to_prod"]),
    "_fetch": (2, ["test_refuses_without_registry_credentials", "test_refusals_leave_file_registry_and_history_untouched",
                   "test_rollback_to_images_gone_from_the_registry"]),
    "_tag": (1, ["test_registry_refusing_the_tag_leaves_the_file_and_history",
                 "test_a_moving_tag_on_immutable_repositories_fails_the_second_time"]),
    "_tags": (1, ["test_the_moving_tag_is_opt_in"]),
    "_apply": (1, ["test_an_invalid_stack_file_is_named_with_its_fix"]),
    "_start": (2, ["test_a_stack_without_a_file_names_the_stacks_there", "test_an_invalid_stack_file_is_named_with_its_fix"]),
    "promote": (1, ["test_secret_images_output_is_refused"]),
    "_anchor": (1, ["test_rollback_to_something_else_names_a_promotion_in_effect"]),
    "rollback": (2, ["test_rollback_after_a_promotion_that_added_an_entity", "test_rollback_restores_the_exact_previous_file",
                     "test_rollback_refuses_when_the_file_changed_since",
                     "test_rollback_replays_only_previous_references_of_this_stacks_registry"]),
}
"""Every refusal in cloudstation_tools/promote.py, by function, and the tests that follow its remedy. A new
`PromotionRefused` fails test_every_refusal_has_a_test_of_its_remedy until it is listed here with
a test that runs its remedy."""


def test_every_refusal_has_a_test_of_its_remedy():
    import ast

    tree = ast.parse((ROOT / "cloudstation_tools" / "promote.py").read_text())
    raised: dict[str, int] = {}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef):
            inner = {id(n) for f in ast.walk(function) if isinstance(f, ast.FunctionDef) and f is not function
                     for n in ast.walk(f)}
            count = sum(1 for node in ast.walk(function) if id(node) not in inner and isinstance(node, ast.Call)
                        and getattr(node.func, "id", None) == "PromotionRefused")
            if count:
                raised[function.name] = count
    assert raised == {name: count for name, (count, _) in REMEDY_TESTS.items()}
    for _, tests in REMEDY_TESTS.values():
        for name in tests:
            assert callable(globals().get(name)), name


# --- through the registry's gate (issue 20, attack chain step 4) ------------------------------------


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """The managed registry as deployed: distribution behind the gate, the deployer promoting
    (components/registry_access.py: pull everything, create and move tags that are not content tags)."""
    from components.registry_access import gate_policy, usernames
    from tests.registry_server import RegistryServer

    projects = sorted({key.split("/", 1)[0] for key in stack_file.image_slots(REPO_PROD)})
    users = {user: f"pw-{user}-for-promotion" for user in usernames(projects, USERNAME, True) if user != USERNAME}
    with RegistryServer(tmp_path_factory.mktemp("gated"), users=users, policy=gate_policy(projects, USERNAME, True),
                        delete_enabled=False) as server:
        yield server


def test_promotion_carries_the_test_stacks_digest_never_what_a_tag_says_now(gated, root, tmp_path, monkeypatch):
    """Each project's build pushed its image; the test stack's `images` output pins those digests. A
    tag moved afterwards (here past the gate, as on a registry without it: through the gate a build's
    tag cannot move, tests/test_registry_gate.py) changes nothing: promotion tags and writes the test
    stack's digests, and refuses a digest the registry does not hold."""
    monkeypatch.setenv(registry_api.USERNAME_ENV, USERNAME)
    monkeypatch.setenv(registry_api.PASSWORD_ENV, PASSWORD)
    monkeypatch.setenv(registry_api.HOST_ENV, NODE_HOST)
    monkeypatch.setenv(registry_api.ADDRESSES_ENV, f"{NODE_HOST}={gated.host}")
    content_tag = "0123456789abcdef0123456789abcdef"
    images, moved = {}, {}
    for key in stack_file.image_slots(REPO_PROD):
        project = key.split("/", 1)[0]
        repository = entity_repository(PREFIX, *key.split("/", 1))
        built = gated.push(build_oci_image(tmp_path / "built", key.replace("/", "-"), f"{key} built".encode()),
                           repository, content_tag, as_user=f"build-{project}")
        images[key] = f"{NODE_HOST}/{repository}:{content_tag}@{built}"
        refused = gated.skopeo_copy(build_oci_image(tmp_path / "other", key.replace("/", "-"), f"{key} other".encode()),
                                    repository, content_tag, as_user=f"build-{project}")
        assert refused.returncode != 0 and "create-only" in refused.stderr  # the gate: its own tag cannot move
        moved[key] = gated.push(build_oci_image(tmp_path / "moved", key.replace("/", "-"), f"{key} moved".encode()),
                                repository, content_tag, direct=True)
        assert gated.digest_of(repository, content_tag) == moved[key] != built
    when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    result = promote.promote(root=root, images=images, now=when, moving_tag="prod")
    assert {change.key: change.new for change in result.changes} == images
    assert {key: image_of(root, key) for key in images} == images
    for key, ref in images.items():
        repository, digest = ref.split("/", 1)[1].split(":")[0], ref.split("@")[1]
        assert gated.digest_of(repository, "prod-20260304T050607Z") == gated.digest_of(repository, "prod") == digest
    # A digest that is not the test stack's build (not in the registry at all): refused, nothing changed.
    key = next(iter(images))
    forged = {**images, key: images[key].split("@")[0] + "@sha256:" + "e" * 64}
    before = (root / "Pulumi.prod.yaml").read_bytes()
    with pytest.raises(PromotionRefused, match=f"{key}: sha256:e{{64}} is not in the registry"):
        promote.promote(root=root, images=forged, now=when.replace(second=8))
    assert (root / "Pulumi.prod.yaml").read_bytes() == before
