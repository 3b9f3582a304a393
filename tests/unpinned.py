"""Stack files of tests that run pins without a digest record (Armada's, the operator's, kaniko, the
exporters: infra/image-digests.yaml has none yet) opt out of them by name, as a lab cluster does
(platform.images.allowUnpinned; docs/security.md "Images"); without it the stack is refused."""
from __future__ import annotations

import json

from infra import versions


def unrecorded() -> list[str]:
    """Pins with no digest record for their tag, read from the records (not versions.IMAGES, which
    upgrade tests patch with bumped references)."""
    return [name for name, ref in versions.TAGS.items()
            if not (name in versions.RECORDS and versions.RECORDS[name].ref == ref)]


def opt_out(platform: dict) -> dict:
    """`platform` (a `cloudstation:platform` value) naming every unrecorded pin in its opt-out."""
    return {**platform, "images": {"allowUnpinned": unrecorded()}}


def opt_out_values(values: dict[str, str]) -> dict[str, str]:
    """Stack config values (full key -> JSON text) with the opt-out set; changes `values` in place."""
    platform = json.loads(values.get("cloudstation:platform", "{}"))
    values["cloudstation:platform"] = json.dumps(opt_out(platform))
    return values
