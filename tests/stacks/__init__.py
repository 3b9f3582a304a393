"""The fixture stacks: what the suite's program-level tests render, validate and check.

The stack files at the repository's root (Pulumi.test.yaml, Pulumi.prod.yaml) are the user's: the
docs tell them to add entities and projects, switch stores and scale up there, and `cloudstation
check` judges them. The suite tests the program on the stacks of this folder instead, so none of
those edits can turn it red; tests/conftest.py fails any test that reads a root stack file and is
not marked `example_stacks` (tests/test_user_edits.py shows it). README.md (this folder) lists the
set and what each stack covers; in short:

- `test`, `prod`: the base pair, Pulumi.test.yaml and Pulumi.prod.yaml of this folder (prod as its
  first promotion writes it, `text`); every other fixture is one of them with documented edits;
- VARIANTS: prod on a cluster of its own (docs/armada.md's example, exactly), a test stack that
  shares a cluster it does not own, an owner prod stack on an external Cassandra, a replicated
  stack, a monitored one, and the executor-only worker pair of docs/armada.md.

Each is computed once per test process (functools caches); `read`, `stack_file` and `edited` give
copies a test may change.
"""
from __future__ import annotations

import copy
import functools
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from infra import config as stack_config
from cloudstation_tools import promote, render as render_module
from tests import unpinned

DIR = Path(__file__).resolve().parent
"""The folder of the fixture stack files (the program reads a stack's siblings here: its cluster
owner, the stacks it owns, a worker's main stack)."""
ROOT = DIR.parent.parent
"""The repository: entity sources and every other path of the stack config are relative to it."""
ARMADA_DOC = ROOT / "docs" / "armada.md"

BASE = ("test", "prod")
SOURCE, PROD = "test", "prod"
"""The base pair: test owns the cluster and builds; prod shares it and deploys what test built."""


# --- running the program on fixture stacks ---------------------------------------------------------


def load(values, **options) -> stack_config.StackConfig:
    """`infra.config.load` of fixture values, as the program loads them: entity sources relative to
    the repository, the other stack files from this folder."""
    return stack_config.load(values, root=options.pop("root", ROOT), stack_dir=options.pop("stack_dir", DIR),
                             **options)


def render(stack: str, stack_file: Optional[render_module.StackFile] = None, **options) -> render_module.Rendered:
    """`cloudstation_tools.render.render` of a fixture stack (`stack_file`, default this folder's
    Pulumi.<stack>.yaml), with the other stack files read from this folder."""
    return render_module.render(stack, options.pop("root", ROOT), stack_file=stack_file or read(stack),
                                stack_dir=options.pop("stack_dir", DIR), **options)


# --- the base pair ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def rendered_test() -> render_module.Rendered:
    return render_module.render(SOURCE, ROOT, stack_dir=DIR)


def images() -> dict[str, str]:
    """The test stack's `images` output: what a promotion copies."""
    return dict(rendered_test().outputs[promote.IMAGES_OUTPUT])


@functools.lru_cache(maxsize=None)
def text() -> str:
    """This folder's Pulumi.prod.yaml with every entity's image promoted from the test stack, as
    `python -m infra promote --from test --to prod` writes it (cloudstation_tools/promote.py
    `first_promotion_text`: `select`, then stack_file.py `apply` and `validate`), without the
    registry calls. The file itself has no `image:` lines and refuses to render before that."""
    return promote.first_promotion_text(DIR, images(), SOURCE, PROD)


def write(directory: Path) -> Path:
    """The promoted prod stack file as `directory`/Pulumi.prod.yaml."""
    path = Path(directory) / f"Pulumi.{PROD}.yaml"
    path.write_text(text(), encoding="utf-8")
    return path


def write_pair(directory: Path) -> Path:
    """Both base stack files into `directory` (a copy of the repository, say), prod promoted."""
    (Path(directory) / f"Pulumi.{SOURCE}.yaml").write_text((DIR / f"Pulumi.{SOURCE}.yaml").read_text(encoding="utf-8"),
                                                          encoding="utf-8")
    return write(directory)


@functools.lru_cache(maxsize=None)
def _promoted_prod() -> render_module.StackFile:
    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory))
        return render_module.StackFile.read(PROD, Path(directory))


def read(stack: str = PROD) -> render_module.StackFile:
    """A base stack file as the engine passes its config (prod promoted); a copy the caller may change."""
    if stack == PROD:
        return copy.deepcopy(_promoted_prod())
    return render_module.StackFile.read(stack, DIR)


def validate_config(stack: str = PROD) -> stack_config.StackConfig:
    """A base stack's validated config (prod promoted)."""
    values = read(stack)
    return load(values.values, source=f"Pulumi.{stack}.yaml", secret_keys=values.secret_keys)


def edited(stack: str, **edits: Callable[[object], object]) -> render_module.StackFile:
    """A base stack file with `cloudstation:<key>` values replaced by `edit(old value)` (prod as promoted)."""
    stack_file = read(stack)
    for key, edit in edits.items():
        full = f"cloudstation:{key}"
        old = json.loads(stack_file.values[full]) if full in stack_file.values else {}
        stack_file.values[full] = json.dumps(edit(old))
    return stack_file


# --- the variants ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    stack: str
    """The stack name it renders as (Pulumi.<stack>.yaml)."""
    covers: str
    make: Callable[[], render_module.StackFile]


def _platform(**changes) -> Callable[[dict], dict]:
    return lambda platform: {**platform, **changes}


def sharing(platform: dict, **changes) -> dict:
    """The base test stack's `platform` for a stack that does not own its cluster: without the
    owner's settings (`clusterBudget`), with `changes`."""
    return {**{k: v for k, v in platform.items() if k != "clusterBudget"}, "ownsClusterResources": False, **changes}


def _store(kind: str) -> Callable[[list], list]:
    return lambda projects: [{**project, "store": kind} for project in projects]


OWN_CLUSTER = "prod-own-cluster"
OWN_CLUSTER_EXAMPLE = "# Pulumi.prod.yaml, with prod on a cluster of its own"
"""The first line of docs/armada.md's example YAML block."""


def doc_example(first_line: str) -> dict:
    """The docs/armada.md YAML block that starts with `first_line`: stack-file keys and values."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", ARMADA_DOC.read_text(encoding="utf-8"), flags=re.S | re.M)
    [block] = [b for b in blocks if b.startswith(first_line)]
    return yaml.safe_load(block)


def own_cluster_example() -> dict:
    return doc_example(OWN_CLUSTER_EXAMPLE)


def write_stack_file(name: str, directory: Path) -> Path:
    """prod-own-cluster as `directory`/Pulumi.prod.yaml: the promoted prod file with docs/armada.md's
    example applied as the docs mean it (each section the example names replaces that section, so
    `platform.armada` as a whole; `secure:` values as written)."""
    assert name == OWN_CLUSTER, name
    document = yaml.safe_load(text())
    config = document["config"]
    for key, value in own_cluster_example().items():
        old = config.get(key)
        config[key] = {**old, **value} if isinstance(old, dict) else value
    images_in_stack_registry(config)
    opt_out_of_unpinned(config)
    path = Path(directory) / "Pulumi.prod.yaml"
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


def _own_cluster() -> render_module.StackFile:
    with tempfile.TemporaryDirectory() as directory:
        write_stack_file(OWN_CLUSTER, Path(directory))
        return render_module.StackFile.read(PROD, Path(directory))


SHARED_OWNER_WATCH = ["cloudstation-state", "shop-test", "warehouse-test"]
"""The other (test) stack's project-state and project namespaces, on the prod owner's cluster."""


def _non_owner() -> render_module.StackFile:
    return edited(
        "test",
        platform=lambda platform: sharing(
            platform,
            cloudstate={},
            armada={"enabled": False},  # one Armada per cluster: the owner's (docs/armada.md)
            stores={"postgres": {"mode": "external", "host": "pg.example.internal", "port": 6432,
                                 "cidrs": ["10.20.30.40/32"],
                                 "credentialsSecret": {"namespace": "ops", "name": "pg-login"}},
                    "cassandra": {"mode": "managed"}},
        ),
        projects=_store("cassandra"),
    )


def _owner_external_cassandra() -> render_module.StackFile:
    return edited(
        "prod",
        platform=_platform(
            ownsClusterResources=True,
            cloudstate={"extraWatchedNamespaces": SHARED_OWNER_WATCH},
            # The operator and its ConfigMap's proxies have no digest yet: as a lab cluster runs
            # them (platform.images.allowUnpinned; infra/stack_images.py).
            images={"allowUnpinned": [name for name in unpinned.unrecorded() if name.startswith("cloudstate-")]},
            stores={"cassandra": {"mode": "external", "host": "cassandra-a.example.internal,cassandra-b.example.internal",
                                  "cidrs": ["10.20.30.0/24", "fd00:20:30::/64"],
                                  "credentialsSecret": {"namespace": "ops", "name": "cassandra-login"}}},
        ),
        projects=_store("cassandra"),
    )


REPLICATED = "replicated"
REPLICATED_SERVICES = ("server", "scheduler", "schedulerIngester", "lookout", "lookoutIngester", "eventIngester",
                       "binoculars")
"""The keys of `platform.armada` whose `replicas` scale a service (every one but `executors`)."""
REPLICATED_ENTITY = "cart"


def _replicated() -> render_module.StackFile:
    def platform(platform: dict) -> dict:
        armada = dict(platform["armada"])
        for key in REPLICATED_SERVICES:
            armada[key] = {**armada.get(key, {}), "replicas": 2}
        armada["binoculars"]["enabled"] = True
        stores = {**platform.get("stores", {}), "cassandra": {"mode": "managed", "replicas": 2}}
        return unpinned.opt_out({**platform, "armada": armada, "stores": stores})  # Binoculars: no digest recorded

    def projects(projects: list) -> list:
        return [
            {**project, "store": "cassandra",
             "entities": [{**e, "replicas": 2} if e["name"] == REPLICATED_ENTITY else e for e in project["entities"]]}
            for project in projects
        ]

    return edited("test", platform=platform, projects=projects)


MONITORED = "test-monitored"


def with_monitoring(monitoring: dict) -> render_module.StackFile:
    """The base test stack with `platform.monitoring`; its exporters have no digest record yet, so the
    stack names them in its opt-out as a lab cluster does (tests/unpinned.py)."""
    return edited("test", platform=lambda p: unpinned.opt_out({**p, "monitoring": monitoring}))


def _monitored() -> render_module.StackFile:
    return with_monitoring({"enabled": True})


WORKERS_MAIN, WORKER = "workers-main", "gpu"
MAIN_EXAMPLE = "# Pulumi.test.yaml, the main stack of a worker cluster"
WORKER_EXAMPLE = "# Pulumi.gpu.yaml, an Armada worker stack"
PLATFORM = "cloudstation:platform"


def _workers_main() -> render_module.StackFile:
    """The test stack with docs/armada.md's main-stack keys added to its `platform.armada`, as the docs say."""
    stack_file = read("test")
    platform = json.loads(stack_file.values[PLATFORM])
    platform["armada"] = {**platform["armada"], **doc_example(MAIN_EXAMPLE)[PLATFORM]["armada"]}
    stack_file.values[PLATFORM] = json.dumps(platform)
    return stack_file


def as_stack_file(document: dict) -> render_module.StackFile:
    """Stack-file keys and values (a docs example) as the engine passes them (fake secure values)."""
    values, secret_keys = {}, []
    for key, value in document.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            values[key] = f"fake-secret-for-{key}"
            secret_keys.append(key)
        else:
            values[key] = value if isinstance(value, str) else json.dumps(value)
    return render_module.StackFile(values, secret_keys)


def _worker() -> render_module.StackFile:
    return as_stack_file(worker_document(doc_example(WORKER_EXAMPLE)))


def worker_document(document: dict) -> dict:
    """A worker stack's keys with the opt-out a lab cluster sets: the executor's pin has no digest record yet."""
    if isinstance(document.get(PLATFORM), dict):
        document = {**document, PLATFORM: unpinned.opt_out(document[PLATFORM])}
    return document


VARIANTS: dict[str, Variant] = {
    OWN_CLUSTER: Variant("prod", "prod on a cluster of its own: docs/armada.md's example over the promoted prod, "
                                 "exactly (its own Armada with prod sizes, two server and Lookout pods, external "
                                 "Pulsar, an external registry with a secure password, monitoring on)", _own_cluster),
    "non-owner": Variant("test", "a test stack sharing a cluster it does not own (no operator, no Armada): external "
                                 "PostgreSQL for the project-state store, every project on a managed Cassandra",
                         _non_owner),
    "owner-external-cassandra": Variant("prod", "a prod stack owning its cluster and watching the test stack's "
                                                "namespaces; every project on an external Cassandra (two hosts, "
                                                "IPv4 and IPv6 CIDRs)", _owner_external_cassandra),
    REPLICATED: Variant("test", "replicas > 1: two pods of every Armada service (binoculars on), of the `cart` "
                                "entity and of a managed Cassandra every project uses", _replicated),
    MONITORED: Variant("test", "the test stack with platform.monitoring on (PodMonitors, alerts, exporters)", _monitored),
    WORKERS_MAIN: Variant("test", "the main stack of executor-only workers: the test stack with docs/armada.md's "
                                  "main-stack example (workers, executorApi)", _workers_main),
    WORKER: Variant(WORKER, "an executor-only Armada worker stack (armada.mode: executor-only): docs/armada.md's "
                            "worker example as its own stack file", _worker),
}
ARMADA_STACKS = ["test", OWN_CLUSTER]
"""The stacks that run a full Armada, one per cluster (docs/armada.md): the base test stack and prod
on a cluster of its own."""


def stack_file(name: str) -> render_module.StackFile:
    """A fixture (base or variant) as the engine would pass its config; a copy the caller may change."""
    return read(name) if name in BASE else copy.deepcopy(_variant_file(name))


@functools.lru_cache(maxsize=None)
def _variant_file(name: str) -> render_module.StackFile:
    return VARIANTS[name].make()


def stack_of(name: str) -> str:
    return name if name in BASE else VARIANTS[name].stack


_NAMES: dict[int, str] = {}


@functools.lru_cache(maxsize=None)
def rendered(name: str) -> render_module.Rendered:
    """A fixture rendered (once per process)."""
    if name == SOURCE:
        result = rendered_test()
    else:
        result = render(stack_of(name), stack_file=stack_file(name))
    _NAMES[id(result)] = name
    return result



def name_of(rendered_stack: render_module.Rendered) -> str:
    """The fixture a rendered stack of `rendered` is."""
    return _NAMES.get(id(rendered_stack), rendered_stack.stack)


@functools.lru_cache(maxsize=None)
def _config(name: str) -> stack_config.StackConfig:
    values = stack_file(name)
    return load(values.values, source=f"Pulumi.{stack_of(name)}.yaml", secret_keys=values.secret_keys)


def config(name: str) -> stack_config.StackConfig:
    """A fixture's validated config."""
    return _config(name)


def config_of(rendered_stack: render_module.Rendered) -> stack_config.StackConfig:
    """The validated config a rendered fixture was made from."""
    return config(name_of(rendered_stack))


# --- a copy of the repository ----------------------------------------------------------------------


NOT_COPIED = {".git", ".venv", "node_modules", "__pycache__", ".pytest_cache", ".cloudstation", ".pulumi-state",
              "rendered", "out", "user-function.desc"}
"""What a clone does not hold (.gitignore) or the user's own machine state."""


def copy_repository(destination: Path, also_ignored: frozenset[str] | set[str] = frozenset()) -> Path:
    """A copy of the repository (what a clone holds) whose stack files are the base pair of this
    folder, as they are here (prod never promoted), instead of the user's."""
    def ignored(directory: str, names: list[str]) -> list[str]:
        at_root = Path(directory).resolve() == ROOT
        return [n for n in names if n in NOT_COPIED or n in also_ignored or n.endswith(".pyc")
                or (at_root and re.match(r"^Pulumi\.[^/]+\.yaml$", n) is not None)]

    import shutil

    shutil.copytree(ROOT, destination, ignore=ignored)
    for stack in BASE:
        (destination / f"Pulumi.{stack}.yaml").write_text((DIR / f"Pulumi.{stack}.yaml").read_text(encoding="utf-8"),
                                                          encoding="utf-8")
    return destination
