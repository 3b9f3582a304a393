"""Who may do what in the managed registry: its users, their rights (the policy the gate enforces,
components/registry_gate.py) and where their credentials live. Pure functions; the tenant model of
docs/security.md is this module.

Users, for every "project" (each of the stack's projects, and `platform` for the project-state
entity, whose images are `platform/<entity>`):

| user | may | credential lives in |
|---|---|---|
| `build-<project>` (in-cluster builds only) | pull and push `<project>/*` with create-only tags; pull its build contexts `builds/<project>/*` | Secret `build-registry-<project>` of the builds namespace, which only that project's build pods mount (the job admission policy) |
| `pull-<project>` | pull `<project>/*` | the pull Secret `cloudstation-registry` of the project's entity namespaces (test and prod), and the kept Secret `registry-pull-<project>` of the platform namespace |
| the deployer (`platform.registry.username`, `cloudstation`) | pull everything; push build contexts `builds/*` (create-only); create and move tags that are not content tags (`promote`'s `prod-<time>` and moving tags); with local builds also push every repository, create-only; list the repositories | `registry-auth`, the stack output `registryPassword`, the EntityBuild inputs |

Why a build may create but never move a tag, and why the deployer may not write a content tag
(`<32 hex>`, components/entity_image.py TAG_LENGTH) with in-cluster builds: then the only writer of
`<project>/<entity>:<content tag>` is a build of `<project>` itself, so an EntityBuild may take an
existing tag for the one its project's build pushed (components/entity_build.py `adoptExisting`).
"""
from __future__ import annotations

import json
from typing import Iterable

from components.build_context import CONTEXT_REPOSITORY_PART
from components.entity_image import TAG_LENGTH

BUILD_USER_PREFIX = "build-"
PULL_USER_PREFIX = "pull-"
RESERVED_USER_PREFIXES = (BUILD_USER_PREFIX, PULL_USER_PREFIX)
"""The deployer's user name may not start with these (platform.registry.username)."""
BUILD_SECRET_PREFIX = "build-registry-"
CONTENT_TAG = f"[0-9a-f]{{{TAG_LENGTH}}}"
"""A content tag (components/entity_image.py content_tag): what builds push."""
NOT_A_CONTENT_TAG = rf"(?!{CONTENT_TAG}\Z)[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}"
"""Every other tag (distribution's tag grammar): promotion tags, moving tags."""


def build_user(project: str) -> str:
    return f"{BUILD_USER_PREFIX}{project}"


def pull_user(project: str) -> str:
    return f"{PULL_USER_PREFIX}{project}"


def build_secret_name(project: str) -> str:
    """The Secret of the builds namespace with `project`'s build credential (components/builds_namespace.py)."""
    return f"{BUILD_SECRET_PREFIX}{project}"


def repositories(project: str) -> str:
    return f"{project}/*"


def contexts(project: str) -> str:
    return f"{CONTEXT_REPOSITORY_PART}/{project}/*"


def gate_policy(projects: Iterable[str], deployer: str, builds_in_cluster: bool, realm: str = "cloudstation") -> dict:
    """The gate's policy document (components/registry_gate.py `load_policy`) for `projects` (the
    platform's `platform` included), the deployer's user name and the build mode."""
    users: dict[str, dict] = {}
    for project in projects:
        users[pull_user(project)] = {"rules": [{"repositories": [repositories(project)], "actions": ["pull"]}]}
        if builds_in_cluster:
            users[build_user(project)] = {"rules": [
                {"repositories": [repositories(project)], "actions": ["pull", "push"]},
                # The build pod fetches its context; the deployer uploaded it.
                {"repositories": [contexts(project)], "actions": ["pull"]},
            ]}
    rules = [
        {"repositories": ["*"], "actions": ["pull"]},  # tag checks, promotion reads manifests
        {"repositories": [f"{CONTEXT_REPOSITORY_PART}/*"], "actions": ["push"]},  # build contexts
        # promote: `<stack>-<time>` tags and, with --moving-tag, a tag moved on every promotion.
        {"repositories": ["*"], "actions": ["push", "overwrite"], "tags": NOT_A_CONTENT_TAG},
    ]
    if not builds_in_cluster:
        rules.append({"repositories": ["*"], "actions": ["push"]})  # pulumi-docker pushes the images
    users[deployer] = {"catalog": True, "rules": rules}
    return {"realm": realm, "users": users}


def gate_policy_json(projects: Iterable[str], deployer: str, builds_in_cluster: bool) -> str:
    return json.dumps(gate_policy(projects, deployer, builds_in_cluster), indent=2, sort_keys=True) + "\n"


def usernames(projects: Iterable[str], deployer: str, builds_in_cluster: bool) -> list[str]:
    """Every user of the registry (the htpasswd file has one line each)."""
    return sorted(gate_policy(projects, deployer, builds_in_cluster)["users"])
