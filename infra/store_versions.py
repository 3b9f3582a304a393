"""Store major versions: a pin of another major than a store's data was created with is refused.

A managed store keeps its data on a volume that outlives every image change. A patch or minor
release reads it as it is; a major release may not (PostgreSQL's data directory is per major and
needs a dump and restore, docs/upgrades.md), and a newer major's files cannot be read by the older
one again (Redis' RDB/AOF, Cassandra's SSTables once upgraded). So the pin (infra/versions.py) alone
must not be able to move a running store across majors.

The program cannot read the running store before it registers resources (a `get` is itself a
resource, and its answer arrives only as an Output, after the program has gone on registering), so
the version the data was created with is recorded where the program reads it first: the stack
config, `platform.storeVersions.<store>.dataMajor` (default: the major every stack ran before this
key existed, `versions.STORE_MAJORS_BEFORE_RECORDS`). A pin of another major is refused before any
resource is registered, unless `platform.storeVersions.<store>.majorUpgrade` names exactly that
change (`"16->17"`), which the documented procedure sets and then replaces by the new `dataMajor`.
Stores the stack does not manage (external, or none of that kind) are not checked: their data is
not on this stack's volumes.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from pydantic import Field, field_validator

from components.model import ConfigModel, problem
from infra import versions

DOC = "docs/upgrades.md"
STORES = {"postgres": "PostgreSQL", "cassandra": "Cassandra", "redis": "Redis"}
"""Pins of stores that keep data on this stack's volumes, and their display names."""
SECTIONS = {"postgres": "postgresql-major-version", "cassandra": "cassandra-major-version",
            "redis": "redis-major-version"}
"""The section of DOC with each store's procedure (tests/test_upgrades.py checks the anchors)."""
UPGRADE = re.compile(r"^(?P<old>\d+)->(?P<new>\d+)$")


class StoreVersion(ConfigModel):
    """The data version of one kind of managed store (every server of that kind in the stack)."""

    data_major: Optional[int] = Field(default=None, ge=1, le=1000)
    """The major version the store's data was created with (unset: the major this program deployed
    before the key existed: PostgreSQL 16, Cassandra 4, Redis 7). Set it to the new major once a
    major upgrade is done (docs/upgrades.md)."""
    major_upgrade: Optional[str] = None
    """Only during a major upgrade: `"<dataMajor>-><pinned major>"`, acknowledging the procedure of
    docs/upgrades.md (a PostgreSQL dump and restore); remove it when `dataMajor` is updated."""

    @field_validator("major_upgrade")
    @classmethod
    def _upgrade_form(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not UPGRADE.match(value):
            raise problem('must name the change as "<data major>-><pinned major>", e.g. "16->17" (docs/upgrades.md)')
        return value


class StoreVersions(ConfigModel):
    """What each kind of managed store's data was created with (stack key `platform.storeVersions`)."""

    postgres: StoreVersion = StoreVersion()
    cassandra: StoreVersion = StoreVersion()
    redis: StoreVersion = StoreVersion()


def managed_stores(config: Any) -> set[str]:
    """The store pins whose servers this stack runs on its own volumes (what the program deploys:
    components/cloudstate_store.py per project and project-state, infra/armada.py)."""
    platform = config.platform
    kinds = {project.store for project in config.projects} | {platform.project_state_store}
    found = {kind for kind in ("postgres", "cassandra")
             if kind in kinds and getattr(platform.stores, kind).mode == "managed"}
    armada = platform.armada
    if armada.enabled and getattr(armada, "mode", "full") == "full":
        found |= {kind for kind in ("postgres", "redis") if getattr(armada, kind).mode == "managed"}
    return found


def recorded_major(config: Any, store: str) -> int:
    recorded = getattr(config.platform.store_versions, store).data_major
    return versions.STORE_MAJORS_BEFORE_RECORDS[store] if recorded is None else recorded


def check(config: Any) -> list:
    """One `problem` per managed store whose pinned major differs from its data's, unacknowledged,
    or whose acknowledgement names another change."""
    found = []
    for store in sorted(managed_stores(config)):
        name, pinned = STORES[store], versions.major(store)
        setting = getattr(config.platform.store_versions, store)
        data = recorded_major(config, store)
        key = f"platform.storeVersions.{store}"
        doc = f"{DOC}#{SECTIONS[store]}"
        wanted = f"{data}->{pinned}"
        if setting.major_upgrade is not None and (pinned == data or setting.major_upgrade != wanted):
            change = "no major change (the data's major is the pinned one)" if pinned == data else f"the change {wanted!r}"
            found.append(problem(
                f"names a major upgrade, but the pin ({versions.IMAGES[store]}) and {key}.dataMajor ({data}) make "
                f"{change}; after the upgrade set {key}.dataMajor: {pinned} and remove {key}.majorUpgrade ({doc})",
                f"{key}.majorUpgrade", setting.major_upgrade))
        elif pinned != data and setting.major_upgrade is None:
            shown = data if setting.data_major is not None else f"{data} (not set: the default)"
            found.append(problem(
                f"this stack's managed {name} data was created by major {data}, but infra/versions.py pins "
                f"{versions.IMAGES[store]} (major {pinned}); a major change is not a pin edit: follow {doc} "
                f"({'dump, upgrade, restore' if store == 'postgres' else 'snapshot, upgrade, record'}), which sets "
                f"{key}.majorUpgrade: \"{wanted}\" for that `pulumi up`. A new stack with no data yet: set "
                f"{key}.dataMajor: {pinned}",
                f"{key}.dataMajor", shown))
    return found
