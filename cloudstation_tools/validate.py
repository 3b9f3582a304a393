"""Validate rendered objects: built-in kinds against the official Kubernetes schemas (strict,
via kubernetes-validate), custom resources against their CRD's openAPIV3Schema (jsonschema).

Used by the tests on every rendered object, and usable on any render output:
`python -m infra validate DIR/manifests.yaml`.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Iterable, Optional

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

SUPPORTED_VERSIONS = ["1.33", "1.34", "1.35", "1.36", "1.37"]
"""Kubernetes minor versions the platform supports and the tests validate against: the releases
still maintained upstream (1.29 to 1.32 reached end of life). kubernetes-validate 1.37.0
(requirements.txt) carries the schemas of each; docs state this range (tests/test_docs.py)."""

# Every call re-reads a 1.8 MB definitions file; caching makes validation ~5x faster.
if not hasattr(kubernetes_validate.utils.schema_contents, "cache_info"):
    kubernetes_validate.utils.schema_contents = functools.lru_cache(None)(kubernetes_validate.utils.schema_contents)


def builtin_errors(obj: dict, version: str) -> list[str]:
    """Problems of one built-in object under Kubernetes `version` (strict: unknown fields fail)."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{_name(obj)} @ {version}: {'.'.join(map(str, error.path))}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError as error:
        return [f"{_name(obj)} @ {version}: no schema (removed or unknown API): {error.message}"]
    return []


VENDORED_CRDS = Path(__file__).resolve().parent.parent / "components" / "crds"
"""CRDs of operators the cluster runs but the program does not install (the Prometheus Operator's
`monitoring.coreos.com`), copied verbatim with their provenance (components/crds/PROVENANCE.md)."""


@functools.lru_cache(None)
def _vendored_crds() -> tuple[dict, ...]:
    return tuple(yaml.safe_load(path.read_text(encoding="utf-8")) for path in sorted(VENDORED_CRDS.rglob("*.yaml")))


def vendored_crds() -> list[dict]:
    """The vendored CRDs (components/crds/), which every validation knows besides the rendered ones."""
    return copy.deepcopy(list(_vendored_crds()))


@functools.lru_cache(None)
def _vendored_schemas() -> dict[tuple[str, str], dict]:
    return crd_schemas(_vendored_crds())


def crd_schemas(objects: Iterable[dict]) -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> JSON schema, for every version of every CRD among `objects`."""
    schemas = {}
    for crd in objects:
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = strict_schema(version["schema"]["openAPIV3Schema"])
            schema.setdefault("properties", {}).update(
                apiVersion={"type": "string"}, kind={"type": "string"}, metadata={"type": "object"}
            )
            schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return schemas


def strict_schema(schema: dict) -> dict:
    """A structural schema as the API server applies it: unknown fields are errors (the server
    prunes them, silently losing settings), `nullable` allows null, int-or-string is either."""
    schema = copy.deepcopy(schema)

    def fix(node: dict) -> None:
        if not isinstance(node, dict):
            return
        if node.get("x-kubernetes-int-or-string"):
            node.pop("type", None)
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if node.pop("nullable", False) and "type" in node:
            node["type"] = [node["type"], "null"]
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        for child in node.get("properties", {}).values():
            fix(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                fix(node[key])
        for key in ("anyOf", "allOf", "oneOf"):
            for child in node.get(key, []):
                fix(child)

    fix(schema)
    return schema


def custom_errors(obj: dict, schemas: dict[tuple[str, str], dict]) -> list[str]:
    schema = schemas.get((obj.get("apiVersion"), obj.get("kind")))
    if schema is None:
        return [f"{_name(obj)}: no CRD among the rendered objects defines {obj.get('apiVersion')} {obj.get('kind')}"]
    validator = jsonschema.Draft4Validator(schema)
    return [
        f"{_name(obj)}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def is_builtin(obj: dict) -> bool:
    group = obj.get("apiVersion", "").rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def validate_all(objects: list[dict], versions: Optional[list[str]] = None, extra_crds: Iterable[dict] = ()) -> list[str]:
    """Every problem of every object, for every supported Kubernetes version."""
    schemas = {**_vendored_schemas(), **crd_schemas([*objects, *extra_crds])}
    problems: list[str] = []
    for obj in objects:
        if is_builtin(obj):
            for version in versions or SUPPORTED_VERSIONS:
                problems += builtin_errors(obj, version)
        else:
            problems += custom_errors(obj, schemas)
    return problems


def _name(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{obj.get('kind')} {where}{meta.get('name')}"
