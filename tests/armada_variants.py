"""The stacks that run an Armada, for the Armada tests.

One Armada per cluster (docs/armada.md): in the repo's stack files, test and prod share a cluster
and only the test stack runs Armada. Prod-size Armada settings are covered by `prod-own-cluster`:
Pulumi.prod.yaml with docs/armada.md's example for a stack on a cluster of its own applied over it
(rendered once per session), so that example is exactly what the tests check.
"""
from __future__ import annotations

import functools
import json
import re
import tempfile
from pathlib import Path

import yaml

from infra import config as stack_config
from cloudstation_tools import render
from tests import promoted

ROOT = Path(__file__).resolve().parent.parent
ARMADA_DOC = ROOT / "docs" / "armada.md"
OWN_CLUSTER_EXAMPLE = "# Pulumi.prod.yaml, with prod on a cluster of its own"
"""The first line of docs/armada.md's example YAML block."""

OWN_CLUSTER = "prod-own-cluster"
ARMADA_STACKS = ["test", OWN_CLUSTER]
"""The stack file that runs Armada, and prod on a cluster of its own."""


def own_cluster_example() -> dict:
    """docs/armada.md's example: stack-file keys (`cloudstation:...`) and their values."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", ARMADA_DOC.read_text(encoding="utf-8"), flags=re.S | re.M)
    [block] = [b for b in blocks if b.startswith(OWN_CLUSTER_EXAMPLE)]
    return yaml.safe_load(block)


def write_stack_file(name: str, directory: Path) -> Path:
    """The variant's stack file, `directory`/Pulumi.prod.yaml: Pulumi.prod.yaml with the example
    applied as the docs mean it (each section a key's example names replaces that section, so
    `platform.armada` as a whole; `secure:` values as written)."""
    assert name == OWN_CLUSTER, name
    document = yaml.safe_load(promoted.text())  # Pulumi.prod.yaml as its first promotion writes it
    config = document["config"]
    for key, value in own_cluster_example().items():
        old = config.get(key)
        config[key] = {**old, **value} if isinstance(old, dict) else value
    images_in_stack_registry(config)
    opt_out_of_unpinned(config)
    path = directory / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def opt_out_of_unpinned(config: dict) -> dict:
    """The example runs Armada's and the operator's images, which have no digest recorded yet, so as
    written it is refused until `python -m infra pin-images --missing` records them (docs/armada.md);
    the tests render it as a lab cluster would run it: `platform.images.allowUnpinned` naming exactly
    the pins it runs by tag (infra/stack_images.py). Changes `config` in place."""
    from infra import stack_images
    from tests import unpinned

    platform = config["cloudstation:platform"]
    platform["images"] = {"allowUnpinned": unpinned.unrecorded()}
    secure = [key for key, value in config.items() if isinstance(value, dict) and set(value) == {"secure"}]
    values = {key: "fake" if key in secure else value if isinstance(value, str) else json.dumps(value)
              for key, value in config.items()}
    parsed = stack_config.load(values, require_images=False, secret_keys=secure)
    platform["images"]["allowUnpinned"] = [i.name for i in stack_images.images(parsed, None) if stack_images.runs_by_tag(i)]
    return config


def images_in_stack_registry(config: dict) -> dict:
    """Images are promoted from the stack's own registry (infra/image_refs.py): where an example
    switches the stack file to an external registry, the file's (placeholder) digests move under
    that registry's host and path, as promote would have written them. Changes `config` in place."""
    registry = (config.get("cloudstation:platform") or {}).get("registry") or {}
    if registry.get("mode") == "external":
        base = re.sub(r"^https?://", "", registry["url"]).rstrip("/")
        platform_entity = config["cloudstation:platform"].get("projectState") or {}
        for entity in [platform_entity] + [e for p in config.get("cloudstation:projects") or [] for e in p["entities"]]:
            if "image" in entity:
                entity["image"] = f"{base}/{entity['image'].split('/', 1)[1]}"
    return config


@functools.lru_cache(maxsize=None)
def stack_file(name: str) -> render.StackFile:
    """A stack of ARMADA_STACKS as the engine would pass its config (fake secure values)."""
    if name != OWN_CLUSTER:
        return promoted.read(name)
    with tempfile.TemporaryDirectory() as directory:
        write_stack_file(name, Path(directory))
        return render.StackFile.read("prod", Path(directory))


@functools.lru_cache(maxsize=None)
def variant(name: str) -> render.Rendered:
    """A rendered stack of ARMADA_STACKS other than the repo's own stack files."""
    if name != OWN_CLUSTER:
        raise KeyError(name)
    rendered = render.render("prod", stack_file=stack_file(OWN_CLUSTER))
    _VARIANT_NAMES[id(rendered)] = name
    return rendered


_VARIANT_NAMES: dict[int, str] = {}


def config_of(rendered: render.Rendered) -> stack_config.StackConfig:
    """The validated config a rendered stack (a stack file's or a variant) was made from."""
    return stack_config.load(stack_file(_VARIANT_NAMES.get(id(rendered), rendered.stack)).values, root=ROOT)
