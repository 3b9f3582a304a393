"""The policy pack (policy/rules.py) run offline on a rendered stack, as `pulumi preview --policy-pack
policy` would run it: each resource policy on every registration, each stack policy on all of them,
with the pack's config (policy/config.json) and the stack's config and name in the environment, where
the engine puts them (PULUMI_CONFIG, PULUMI_STACK). `cloudstation check` and tests/test_policy.py use it.

The engine hands a policy the resource's inputs with secrets decrypted and unknowns as sentinel
strings, behind pulumi_policy's unknown-checking proxy; `engine_props` builds exactly that from the
mock registrations.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Optional

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import _NotApplicableError
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from cloudstation_tools.mocks import is_wrapped_secret

PACK_CONFIG = Path(__file__).resolve().parent.parent / "policy" / "config.json"
"""The pack's config CI and scripts/up.sh callers pass (`--policy-pack-config policy/config.json`)."""


def engine_props(value: Any) -> Any:
    """Mock inputs as the engine passes them: secrets in plain text, unknowns as sentinels."""
    if is_wrapped_secret(value):
        return engine_props(value["value"])
    if isinstance(value, dict):
        return {k: engine_props(v) for k, v in value.items()}
    if isinstance(value, list):
        return [engine_props(v) for v in value]
    if type(value).__name__ == "Unknown":
        return UNKNOWN_STRING_VALUE
    return value


def options() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def check_resource(policy, type_: str, props: dict, config: Optional[dict] = None, name: str = "r") -> list[str]:
    """One resource policy on one resource: its violations' messages."""
    violations: list[str] = []
    args = ResourceValidationArgs(type_, unknown_checking_proxy(engine_props(props)), f"urn:{type_}::{name}", name,
                                  options(), None, config or {})
    policy.validate(args, lambda message, urn=None: violations.append(message))
    return violations


def check_stack(policy, resources: list[tuple[str, dict]], config: Optional[dict] = None) -> list[str]:
    """One stack policy on (type, inputs) of every resource: its violations' messages."""
    violations: list[str] = []
    policy_resources = [
        PolicyResource(type_, unknown_checking_proxy(engine_props(props)), f"urn:{type_}::{i}", str(i), options(),
                       None, None, [], {})
        for i, (type_, props) in enumerate(resources)
    ]
    policy.validate(StackValidationArgs(policy_resources, config or {}),
                    lambda message, urn=None: violations.append(message))
    return violations


@contextlib.contextmanager
def engine_environment(stack: str, values: Mapping[str, str]) -> Iterator[None]:
    """PULUMI_CONFIG and PULUMI_STACK as the engine sets them for the pack, restored afterwards."""
    saved = {name: os.environ.get(name) for name in ("PULUMI_CONFIG", "PULUMI_STACK")}
    os.environ["PULUMI_CONFIG"] = json.dumps(dict(values))
    os.environ["PULUMI_STACK"] = stack
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass(frozen=True)
class Violation:
    policy: str
    message: str
    urn: Optional[str] = None
    applicable: bool = True
    """False: the policy said it cannot judge this stack (`args.not_applicable`), and `message` says why."""


def pack_config(project_directory: Path, path: Path = PACK_CONFIG) -> dict[str, dict]:
    """Each policy's config: policy/config.json, and where the stack files are (no-secrets-in-plain-config)."""
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config.setdefault("no-secrets-in-plain-config", {})["projectDirectory"] = str(project_directory)
    return config


def run(registrations: Iterable, stack: str, values: Mapping[str, str], project_directory: Path,
        config: Optional[dict[str, dict]] = None) -> list[Violation]:
    """Every violation of every policy on one rendered stack (mock registrations with type, name,
    urn and inputs), the stack's config `values` as the engine passes them."""
    import sys

    if str(PACK_CONFIG.parent.parent) not in sys.path:  # the pack is a directory of the repository, not a package
        sys.path.insert(0, str(PACK_CONFIG.parent.parent))
    from policy import rules

    registrations = list(registrations)
    config = pack_config(project_directory) if config is None else config
    found: list[Violation] = []
    with engine_environment(stack, values):
        for policy in rules.POLICIES:
            settings = config.get(policy.name) or {}
            if isinstance(policy, StackValidationPolicy):
                resources = [(r.type, r.inputs) for r in registrations]
                try:
                    found += [Violation(policy.name, m) for m in check_stack(policy, resources, settings)]
                except _NotApplicableError as error:  # as the engine reports it: not a violation
                    found.append(Violation(policy.name, error.message, applicable=False))
                continue
            for r in registrations:
                found += [Violation(policy.name, m, r.urn)
                          for m in check_resource(policy, r.type, r.inputs, settings, name=r.name)]
    return found
