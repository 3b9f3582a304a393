"""What `python -m infra render` writes, from the registrations the mocks recorded.

    manifests.yaml   every Kubernetes object, in apply order, each document preceded by comments:
                     `# from <URN>` (the component that registered it) and `# mock: ...` for
                     each value the mocks made up; a header comment lists every made-up value
    resources.json   every Pulumi resource: type, name, parent, provider, dependencies, engine options, inputs
    outputs.json     the stack outputs

Every secret value is "[secret]". The objects are exactly the inputs Pulumi applies (comments are
not part of any object), so they parse and validate as before. Multi-line strings are YAML block
scalars (`|`) where YAML allows one, lines are never folded, and the bytes are the same with
libyaml's emitter or PyYAML's pure-Python one (libyaml's is used when present: it is ~6x faster).

Kept light on purpose (yaml, json, the mocks): bench/render_cost.py's bare program writes through
it without importing the program.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from cloudstation_tools.mocks import MOCK_DIGEST_PREFIX, Registration, is_wrapped_secret

SECRET = "[secret]"

# Apply order by kind (after Helm's install order); kinds not listed (custom resources) go last.
KIND_ORDER = [
    "Namespace", "CustomResourceDefinition", "PriorityClass", "StorageClass", "NetworkPolicy",
    "ResourceQuota", "LimitRange", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap",
    "PersistentVolume", "PersistentVolumeClaim", "ClusterRole", "ClusterRoleBinding", "Role",
    "RoleBinding", "Service", "DaemonSet", "Pod", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler",
    "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress", "APIService",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
]
_RANK = {kind: rank for rank, kind in enumerate(KIND_ORDER)}
NOT_OBJECTS = ("kubernetes:yaml/", "kubernetes:helm.sh/", "kubernetes:kustomize")
YAML_WIDTH = 1 << 20
"""Never fold a line: both emitters fold long scalars at their width, and a folded line reads badly."""
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def apply_order(obj: dict) -> tuple:
    kind = obj.get("kind", "")
    meta = obj.get("metadata") or {}
    return (_RANK.get(kind, len(KIND_ORDER)), kind, meta.get("namespace") or "", meta.get("name") or "")


def canonical(obj: dict) -> dict:
    """apiVersion, kind, metadata first, everything else after, keys sorted below the top."""
    first = [k for k in ("apiVersion", "kind", "metadata") if k in obj]
    return {k: _sorted(obj[k]) for k in first + sorted(k for k in obj if k not in first)}


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def redact(value: Any) -> Any:
    """A secret's shape with every leaf replaced, so objects stay schema-valid (a secret map
    such as a Secret's stringData keeps its keys)."""
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return SECRET


def clean(value: Any) -> Any:
    """Mock artefacts out: secrets redacted, integral floats back to ints, unknowns marked."""
    if isinstance(value, dict):
        if is_wrapped_secret(value):
            return redact(value["value"])
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if type(value).__name__ == "Unknown":
        return "[unknown]"
    return value


def _clean_sorted(value: Any) -> Any:
    """clean() with every mapping's keys sorted, in one walk (what canonical(clean(...)) gives below
    the top level)."""
    if isinstance(value, dict):
        if is_wrapped_secret(value):
            return _sorted(redact(value["value"]))
        return {k: _clean_sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_clean_sorted(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if type(value).__name__ == "Unknown":
        return "[unknown]"
    return value


def _top_first(obj: dict) -> dict:
    """canonical()'s top level for an object whose keys are sorted already."""
    first = [k for k in ("apiVersion", "kind", "metadata") if k in obj]
    return {**{k: obj[k] for k in first}, **{k: v for k, v in obj.items() if k not in first}}


def is_object(registration: Registration) -> bool:
    """A Kubernetes object the provider applies (not a provider, component or YAML/Helm wrapper)."""
    return (
        registration.custom
        and registration.type.startswith("kubernetes:")
        and not registration.type.startswith(NOT_OBJECTS)
    )


def objects(registrations: Iterable[Registration], cleaned: Optional[dict[str, Any]] = None) -> list[tuple[Registration, dict]]:
    """Every Kubernetes object, canonical(clean(inputs)), with its registration, in apply order;
    `cleaned` (URN -> _clean_sorted(inputs)) saves cleaning them again."""
    pairs = [
        (r, _top_first(cleaned[r.urn] if cleaned is not None else _clean_sorted(r.inputs)))
        for r in registrations
        if is_object(r)
    ]
    return sorted(pairs, key=lambda pair: apply_order(pair[1]))


# --- YAML -------------------------------------------------------------------------------------------

_BASE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
_BOOL, _INT, _NULL = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:null"


def _dumper(base: type) -> type:
    class Dumper(base):  # type: ignore[misc,valid-type]
        """Safe YAML with multi-line strings as block scalars."""

    def represent_str(dumper, value: str):
        # A style hint: where YAML cannot hold the text as a block (trailing spaces on a line,
        # control characters), both emitters fall back to a quoted scalar, losslessly.
        return dumper.represent_scalar(_STR, value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, represent_str)
    return Dumper


class Dumper(_dumper(_BASE_DUMPER)):  # type: ignore[misc,valid-type]
    """The above, with the nodes of plain data built directly: the nodes SafeRepresenter builds
    for them (block collections, since dump() passes default_flow_style=False), without its
    per-node alias bookkeeping, which a tree of fresh dicts never uses; ~20% of the dump's time.
    PureDumper keeps SafeRepresenter, and tests compare the two outputs byte for byte."""

    def represent_data(self, data: Any):
        kind = type(data)
        if kind is str:
            return ScalarNode(_STR, data, style="|" if "\n" in data else None)
        if kind is dict:
            represent = self.represent_data
            return MappingNode(_MAP, [(represent(k), represent(v)) for k, v in data.items()], flow_style=False)
        if kind is list:
            represent = self.represent_data
            return SequenceNode(_SEQ, [represent(v) for v in data], flow_style=False)
        if kind is bool:
            return ScalarNode(_BOOL, "true" if data else "false")
        if kind is int:
            return ScalarNode(_INT, str(data))
        if data is None:
            return ScalarNode(_NULL, "null")
        return super().represent_data(data)


PureDumper = _dumper(yaml.SafeDumper)
"""The pure-Python emitter and PyYAML's own representer, to check that output depends on neither."""


def dump(obj: Any, dumper: type = Dumper) -> str:
    return yaml.dump(obj, Dumper=dumper, sort_keys=False, allow_unicode=True, width=YAML_WIDTH)


def mock_paths(obj: Any, made_up: dict[str, str], path: str = "") -> Iterator[tuple[str, str]]:
    """(path, what made it up) for every string in `obj` that holds a value the mocks made up."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from mock_paths(value, made_up, _key_path(path, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            yield from mock_paths(value, made_up, f"{path}[{index}]")
    elif isinstance(obj, str) and MOCK_DIGEST_PREFIX in obj:
        for digest in _DIGEST.findall(obj):
            if digest.startswith(MOCK_DIGEST_PREFIX):
                # Not made in this run: a stack file holding a reference promoted from a mock render.
                yield path, made_up.get(digest, f"{digest}, a mock digest from another render")


def _key_path(path: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def header(stack: str, made_up: dict[str, str], reads: dict[str, str]) -> list[str]:
    lines = [
        f"Every Kubernetes object of stack `{stack}`, in apply order, exactly as the program registers it,",
        "rendered offline under Pulumi's mocks (python -m infra render).",
        "`# from <URN>` above an object names the component that registered it (resources.json has it too).",
        f'"{SECRET}" stands for a secret value (a generated password, a `secure:` config value, or one read',
        "from an existing Secret); no secret value is ever written.",
        "Values the mocks made up, not what `pulumi up` produces, are marked `# mock:` above their object:",
        f"- image digests starting {MOCK_DIGEST_PREFIX} (a real sha256 digest starts so with",
        "  odds of 2^-64); `pulumi up` gets the real one from the registry. A digest without that prefix",
        "  is not the mocks' (platform pins of infra/image-digests.yaml, references in the stack file).",
        "  Made up in this render:",
    ]
    lines += [f"    {value}  {what}" for value, what in sorted(made_up.items())] or ["    (none)"]
    lines.append("- objects read from the cluster or another stack at `pulumi up` (their data here is the mock's):")
    lines += [f"    {urn}  {what}" for urn, what in sorted(reads.items())] or ["    (none)"]
    return ["# " + line for line in lines]


def manifests_yaml(
    stack: str,
    pairs: list[tuple[Registration, dict]],
    made_up: Optional[dict[str, str]] = None,
    reads: Optional[dict[str, str]] = None,
    dumper: type = Dumper,
) -> str:
    made_up, reads = made_up or {}, reads or {}
    parts = ["\n".join(header(stack, made_up, reads)) + "\n"]
    for registration, obj in pairs:
        text = dump(obj, dumper)
        comments = [f"# from {registration.parent or '(no parent)'}"]
        if MOCK_DIGEST_PREFIX in text:  # no walk for the objects that hold none
            comments += [f"# mock: {path} holds {what}" for path, what in mock_paths(obj, made_up)]
        comments += [
            f"# mock: uses {reads[urn]}, read at `pulumi up`; what it read here is the mock's"
            for urn in sorted(set(registration.dependencies) & reads.keys())
        ]
        parts.append("---\n" + "\n".join(comments) + "\n" + text)
    return "".join(parts)


def resources(registrations: Iterable[Registration], cleaned: Optional[dict[str, Any]] = None) -> list[dict]:
    return [
        {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "custom": r.custom,
            "parent": r.parent or None,
            "provider": r.provider or None,
            "dependsOn": sorted(r.dependencies),
            "options": r.options,
            "inputs": cleaned[r.urn] if cleaned is not None else clean(r.inputs),
        }
        for r in registrations
    ]


def write(
    out: Path,
    stack: str,
    registrations: list[Registration],
    outputs: dict[str, Any],
    made_up: Optional[dict[str, str]] = None,
    reads: Optional[dict[str, str]] = None,
) -> None:
    """Write manifests.yaml, resources.json and outputs.json into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    cleaned = {r.urn: _clean_sorted(r.inputs) for r in registrations}  # once for both files; neither changes it
    _atomic_write(out / "manifests.yaml", manifests_yaml(stack, objects(registrations, cleaned), made_up, reads))
    text = json.dumps(resources(registrations, cleaned), indent=2, sort_keys=True, check_circular=False)
    _atomic_write(out / "resources.json", text + "\n")
    _atomic_write(out / "outputs.json", json.dumps(outputs, indent=2, sort_keys=True) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)
