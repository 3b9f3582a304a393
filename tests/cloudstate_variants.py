"""Renders of the repo's stack files with a few config changes, shared by the CloudState tests
(each variant renders once per session)."""
from __future__ import annotations

import functools
import json
from typing import Callable

from cloudstation_tools import render
from tests import promoted, unpinned


def edited(stack: str, **edits: Callable[[object], object]) -> render.StackFile:
    """The stack file with `cloudstation:<key>` values replaced by `edit(old value)` (prod: as
    promoted, tests/promoted.py)."""
    stack_file = promoted.read(stack)
    for key, edit in edits.items():
        full = f"cloudstation:{key}"
        old = json.loads(stack_file.values[full]) if full in stack_file.values else {}
        stack_file.values[full] = json.dumps(edit(old))
    return stack_file


def _platform(**changes) -> Callable[[dict], dict]:
    return lambda platform: {**platform, **changes}


def _store(kind: str) -> Callable[[list], list]:
    return lambda projects: [{**project, "store": kind} for project in projects]


SHARED_OWNER_WATCH = ["cloudstation-state", "shop-test"]
"""The other (test) stack's project-state and project namespaces, on the prod owner's cluster."""


@functools.lru_cache(maxsize=None)
def variant(name: str) -> render.Rendered:
    """
    - `non-owner`: test stack sharing a cluster it does not own; external PostgreSQL for the
      project-state store; the project on a managed Cassandra.
    - `owner-external-cassandra`: prod stack owning its cluster (unlike the repo's prod stack)
      and watching another stack's namespaces; the project on an external Cassandra.
    """
    if name == "non-owner":
        stack_file = edited(
            "test",
            platform=_platform(
                ownsClusterResources=False,
                cloudstate={},
                armada={"enabled": False},  # one Armada per cluster: the owner's (docs/armada.md)
                stores={"postgres": {"mode": "external", "host": "pg.example.internal", "port": 6432,
                                     "cidrs": ["10.20.30.40/32"],
                                     "credentialsSecret": {"namespace": "ops", "name": "pg-login"}}},
            ),
            projects=_store("cassandra"),
        )
        return render.render("test", stack_file=stack_file)
    if name == "owner-external-cassandra":
        stack_file = edited(
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
        return render.render("prod", stack_file=stack_file)
    raise KeyError(name)


def validation_problems(rendered: render.Rendered, extra_crds=()) -> list[str]:
    """Schema problems of every object (Secrets with their keys, see `manifests`)."""
    from cloudstation_tools.validate import SUPPORTED_VERSIONS, validate_all

    # The oldest and newest supported versions (every one is checked on the stack files).
    versions = [SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]]
    return validate_all(manifests(rendered.registrations), versions=versions, extra_crds=extra_crds)


def manifests(registrations) -> list[dict]:
    """The Kubernetes objects as `Rendered.manifests()` shows them, except that a Secret's
    `stringData`/`data` (pulumi-kubernetes makes each secret as a whole) keeps its keys, with
    every value redacted; so schema checks see an object and tests see which keys exist."""
    from cloudstation_tools.mocks import is_wrapped_secret
    from cloudstation_tools.render import SECRET, apply_order, canonical, clean

    result = []
    for registration in registrations:
        if not (registration.custom and registration.type.startswith("kubernetes:")) or "/" not in registration.type:
            continue
        inputs = dict(registration.inputs)
        for field in ("stringData", "data"):
            value = inputs.get(field)
            if is_wrapped_secret(value) and isinstance(value["value"], dict):
                inputs[field] = {key: SECRET for key in value["value"]}
        result.append(canonical(clean(inputs)))
    return sorted(result, key=apply_order)


def build(mocked, make) -> list[dict]:
    """Run `make()` (registers components) under mocks; the Kubernetes objects it registered."""
    from tests.conftest import run_mocked

    run_mocked(make)
    return manifests(mocked.registrations)
