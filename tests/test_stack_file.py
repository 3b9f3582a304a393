"""cloudstation_tools/stack_file.py: exact image edits of a stack file, validation and the atomic write."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from infra import config as stack_config
from cloudstation_tools import stack_file
from cloudstation_tools.stack_file import StackFileError
from tests import stacks, unpinned
from tests.conftest import ROOT


def digest(n: int) -> str:
    """64 hex digits that are not a placeholder (all zeros but the last digits are refused as such)."""
    return (f"{n:x}" * 64)[:64]


def ref(n: int, name: str = "shop/cart", tag: str = "") -> str:
    return f"localhost:32000/{name}{tag}@sha256:{digest(n)}"


# Everything a hand-kept stack file may carry: comments everywhere, a secure value, the
# encryption salt, quoted scalars, a trailing comment on an image line, a flow mapping.
SAMPLE = f"""\
# prod: promoted images only
encryptionsalt: v1:Xx4bW0xbx1Y=:v1:fd8Fv3/k0d8b7Nbx:bqPw2r3ZmzvF5Zp6kQH6YQ==
config:
  cloudstation:environment: prod   # never builds
  cloudstation:registryPassword:
    secure: v1:3b6XxQ1c9Do8r7Wh:sC8mEOz5zQ4t+uJzGBYvVj7Qqg2aUQ==
  cloudstation:platform:
    namespace: cloudstation
    # This stack owns its cluster: a lab cluster's opt-out of the pins without a digest record.
    images: {{allowUnpinned: {json.dumps(unpinned.unrecorded())}}}
    projectState:
      image: "{ref(4, 'platform/project-state')}"
  cloudstation:projects:
    - name: shop
      entities:
        - name: cart
          kind: event-sourced   # journal in postgres
          language: javascript
          source: entities/shop/cart
          image: {ref(1)}  # promoted 2026-01-01
        - name: likes
          kind: replicated
          language: javascript
          source: entities/shop/likes
          image: '{ref(2, 'shop/likes', ':v7')}'
        - {{name: add-item, kind: action, language: javascript, source: entities/shop/add-item,
           image: {ref(3, 'shop/add-item')}}}
"""


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(old) == len(new)
    return [(a, b) for a, b in zip(old, new) if a != b]


def test_slots_are_keyed_like_the_images_output():
    slots = stack_file.image_slots(SAMPLE)
    assert {k: s.value for k, s in slots.items()} == {
        "platform/project-state": ref(4, "platform/project-state"),
        "shop/cart": ref(1),
        "shop/likes": ref(2, "shop/likes", ":v7"),
        "shop/add-item": ref(3, "shop/add-item"),
    }
    assert slots["shop/likes"].path == "cloudstation:projects[0].entities[1].image"
    assert slots["platform/project-state"].path == "cloudstation:platform.projectState.image"


def test_slots_of_the_repository_prod_file_match_its_config():
    # Before its first promotion, the fixture prod file (like the example) has an empty slot for every entity.
    slots = stack_file.image_slots(stack_file.read_text(stacks.DIR / "Pulumi.prod.yaml"))
    assert slots and all(slot.value is None for slot in slots.values())
    text = stacks.text()  # as its first promotion writes it (tests/stacks/)
    config = stack_file.validate(text, ROOT, "Pulumi.prod.yaml", stack_dir=stacks.DIR)
    expected = {f"{p.name}/{e.name}": e.image for p in config.projects for e in p.entities}
    expected["platform/project-state"] = config.platform.project_state.image
    assert {k: s.value for k, s in stack_file.image_slots(text).items()} == expected


def test_edit_changes_only_the_image_scalars_and_keeps_their_style():
    changes = {
        "shop/cart": ref(11, tag=":b2"),
        "shop/likes": ref(12, "shop/likes"),
        "shop/add-item": ref(13, "shop/add-item"),
        "platform/project-state": ref(14, "platform/project-state"),
    }
    result = stack_file.edit(SAMPLE, changes)
    assert changed_lines(SAMPLE, result) == [
        (
            f'      image: "{ref(4, "platform/project-state")}"\n',
            f'      image: "{changes["platform/project-state"]}"\n',
        ),
        (
            f"          image: {ref(1)}  # promoted 2026-01-01\n",
            f"          image: {changes['shop/cart']}  # promoted 2026-01-01\n",
        ),
        (f"          image: '{ref(2, 'shop/likes', ':v7')}'\n", f"          image: '{changes['shop/likes']}'\n"),
        (f"           image: {ref(3, 'shop/add-item')}}}\n", f"           image: {changes['shop/add-item']}}}\n"),
    ]
    assert {k: s.value for k, s in stack_file.image_slots(result).items()} == changes


def test_edit_of_a_subset_leaves_every_other_byte():
    result = stack_file.edit(SAMPLE, {"shop/likes": ref(99, "shop/likes")})
    start = SAMPLE.index(ref(2, "shop/likes", ":v7"))
    assert result == SAMPLE[:start] + ref(99, "shop/likes") + SAMPLE[start + len(ref(2, "shop/likes", ":v7")):]
    assert "secure: v1:3b6XxQ1c9Do8r7Wh:sC8mEOz5zQ4t+uJzGBYvVj7Qqg2aUQ==" in result


def test_edit_keeps_crlf_line_endings():
    crlf = SAMPLE.replace("\n", "\r\n")
    result = stack_file.edit(crlf, {"shop/cart": ref(5)})
    assert result == crlf.replace(ref(1), ref(5))


def test_edit_inserts_a_missing_image_line_below_the_entity_name():
    without = SAMPLE.replace(f"          image: {ref(1)}  # promoted 2026-01-01\n", "")
    result = stack_file.edit(without, {"shop/cart": ref(6)})
    assert result == without.replace("        - name: cart\n", f"        - name: cart\n          image: {ref(6)}\n")


@pytest.mark.parametrize("changes, message", [
    ({"shop/cart": "localhost:5000/shop/cart:latest"}, "not pinned by digest"),
    ({"shop/nope": ref(1)}, "no entity shop/nope"),
    ({"shop/cart": None}, "removing an image line"),
])
def test_edit_refuses_bad_changes(changes, message):
    with pytest.raises(StackFileError, match=message):
        stack_file.edit(SAMPLE, changes)


def test_validate_runs_the_program_config_validation():
    assert stack_file.validate(SAMPLE, ROOT, "sample", stack_dir=stacks.DIR).projects[0].entities[0].image == ref(1)
    without = SAMPLE.replace(f"          image: {ref(1)}  # promoted 2026-01-01\n", "")
    with pytest.raises(stack_config.ConfigError, match=r"entities\[0\]\.image"):
        stack_file.validate(without, ROOT, "sample", stack_dir=stacks.DIR)


def test_write_atomic_replaces_content_and_keeps_mode(tmp_path):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(SAMPLE)
    path.chmod(0o640)
    stack_file.write_atomic(path, "new\n", expected=SAMPLE)
    assert path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.prod.yaml"]


def test_write_atomic_refuses_when_the_file_changed_meanwhile(tmp_path):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(SAMPLE + "# edited by someone else\n")
    with pytest.raises(StackFileError, match="changed while"):
        stack_file.write_atomic(path, "new\n", expected=SAMPLE)
    assert path.read_text() == SAMPLE + "# edited by someone else\n"


def test_failure_between_write_and_rename_leaves_the_original(tmp_path, monkeypatch):
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_bytes(SAMPLE.encode())

    def fail(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk gone"):
        stack_file.write_atomic(path, stack_file.edit(SAMPLE, {"shop/cart": ref(7)}))
    assert path.read_bytes() == SAMPLE.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Pulumi.prod.yaml"]  # temp file cleaned up


def test_process_killed_between_write_and_rename_leaves_the_original(tmp_path):
    """A real crash: the process dies (os._exit) after the temp file is written and synced."""
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_bytes(SAMPLE.encode())
    script = (
        "import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1])\n"
        "from cloudstation_tools import stack_file\n"
        "os.replace = lambda *a: os._exit(9)\n"
        "p = Path(sys.argv[2]); t = stack_file.read_text(p)\n"
        "stack_file.write_atomic(p, stack_file.edit(t, {'shop/cart': sys.argv[3]}))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, str(ROOT), str(path), ref(8)])
    assert result.returncode == 9
    assert path.read_bytes() == SAMPLE.encode()
    leftovers = [p for p in tmp_path.iterdir() if p.name != "Pulumi.prod.yaml"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".Pulumi.prod.yaml.")  # complete, never renamed
    assert ref(8) in leftovers[0].read_text()


# --- config validation of images and sources (issue 11, items 6, 10, 11) -------------------


def test_validate_refuses_images_from_another_registry_or_repository():
    bad = SAMPLE.replace(ref(1), f"registry.example/shop/cart@sha256:{digest(1)}").replace(
        f"'{ref(2, 'shop/likes', ':v7')}'", f"'{ref(2, 'shop/cart', ':v7')}'"
    )
    with pytest.raises(stack_config.ConfigError) as error:
        stack_file.validate(bad, ROOT, "sample", stack_dir=stacks.DIR)
    assert error.value.problems == [
        f"cloudstation:projects[0].entities[0].image: 'registry.example/shop/cart@sha256:{digest(1)}' — registry host "
        "'registry.example' is not this stack's registry (localhost:32000, from platform.registry); expected "
        "localhost:32000/shop/cart[:tag]@sha256:<64 hex digits>",
        f"cloudstation:projects[0].entities[1].image: '{ref(2, 'shop/cart', ':v7')}' — repository 'shop/cart' is "
        "not this entity's (<prefix>/<project>/<entity>); expected localhost:32000/shop/likes[:tag]@sha256:<64 hex "
        "digits>",
    ]


def test_validate_checks_images_against_an_external_registry_and_its_prefix():
    external = SAMPLE.replace(
        "    namespace: cloudstation\n",
        "    namespace: cloudstation\n    registry: {mode: external, url: r.example/team, username: ci}\n",
    ).replace("localhost:32000/", "r.example/team/")
    assert stack_file.validate(external, ROOT, "sample", stack_dir=stacks.DIR).projects[0].entities[0].image.startswith("r.example/team/")
    with pytest.raises(stack_config.ConfigError, match=r"repository 'shop/cart' is not this entity's"):
        stack_file.validate(external.replace("r.example/team/shop/cart@", "r.example/shop/cart@"), ROOT, "sample", stack_dir=stacks.DIR)


@pytest.mark.parametrize("image", [
    f"localhost:32000/shop/cart@sha256:{digest(1)}\n",
    f"localhost:32000/shop/cart:t\u00e9st@sha256:{digest(1)}",
])
def test_config_matches_image_references_whole_and_in_ascii(image):
    with pytest.raises(stack_config.ConfigError, match=r"entities\[0\]\.image: .* must be pinned by digest"):
        stack_config.load(_raw_test_config(image=image))


def _raw_test_config(**entity) -> dict:
    entity = {"name": "cart", "kind": "action", "language": "javascript", "source": "entities/shop/cart", **entity}
    project_state = f"localhost:32000/platform/project-state@sha256:{digest(4)}"
    return {
        "cloudstation:environment": "test",
        "cloudstation:projects": json.dumps([{"name": "shop", "entities": [entity]}]),
        "cloudstation:platform": json.dumps(unpinned.opt_out({"projectState": {"image": project_state},
                                                              "builds": {"publicEgress": {"enabled": True}}})),
    }


@pytest.mark.parametrize("source", ["../outside", "entities/../../outside", "/etc", "~/src", "", ".", "./", "C:/src"])
def test_entity_source_must_be_a_directory_inside_the_repository(source, tmp_path):
    with pytest.raises(stack_config.ConfigError, match=r"entities\[0\]\.source: .* must be a directory inside the "
                                                       r"repository"):
        stack_config.load(_raw_test_config(source=source), root=tmp_path)


def test_entity_source_symlinked_out_of_the_repository_is_refused(tmp_path):
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "entities").mkdir(parents=True)
    outside.mkdir()
    (root / "entities" / "cart").symlink_to(outside, target_is_directory=True)
    with pytest.raises(stack_config.ConfigError, match=r"entities\[0\]\.source: 'entities/cart' — resolves to .*"
                                                       r"outside, outside the repository"):
        stack_config.load(_raw_test_config(source="entities/cart"), root=root)
    (root / "entities" / "real").mkdir()
    (root / "entities" / "real" / "Dockerfile").write_text("FROM scratch\n")
    (root / "entities" / "inside").symlink_to(root / "entities" / "real", target_is_directory=True)
    assert stack_config.load(_raw_test_config(source="entities/inside"), root=root).projects[0].entities[0].source


def test_stack_file_parse_refuses_duplicate_keys_and_aliases():
    with pytest.raises(StackFileError, match="key 'image' appears more than once"):
        stack_file.parse(SAMPLE.replace("          language: javascript\n          source: entities/shop/cart\n",
                                        f"          image: {ref(9)}\n          source: entities/shop/cart\n"))
    aliased = SAMPLE.replace(f"image: {ref(1)}  # promoted", f"image: &cart {ref(1)}  # promoted").replace(
        f"'{ref(2, 'shop/likes', ':v7')}'", "*cart")
    with pytest.raises(StackFileError, match=r"entities\[0\]\.image is not a one-line string scalar"):
        stack_file.parse(aliased)
