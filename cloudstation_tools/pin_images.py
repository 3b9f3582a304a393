"""`python -m infra pin-images`: record the digest each pinned tag of infra/versions.py resolves to.

For each pin it asks the registry for the manifest the tag points to (`skopeo inspect --raw`: the
exact bytes, an image index for multi-platform images) and records sha256 of those bytes, which is
the digest the registry serves them under and the one a node pulls by. infra/image-digests.yaml is
rewritten atomically (a temporary file in the same directory, fsync, rename): a failed or
interrupted run leaves the previous file intact. Needs skopeo and access to the registries.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import yaml

from infra import versions

HEADER = """\
# Digests of the platform images pinned in infra/versions.py (TAGS), one record per exact tag.
# `python -m infra pin-images` writes this file; a record applies only while `ref` is the pin.
# source: where the digest came from (a public record at a commit, or the registry via skopeo).
"""
MANIFEST_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
"""Schema 2 manifests and indexes: their digest is sha256 of the bytes (schema 1's was not)."""
TIMEOUT = 120


class PinError(Exception):
    """A pin could not be resolved; str() names the image, the reference and why."""


@dataclass(frozen=True)
class Change:
    name: str
    ref: str
    old: Optional[str]
    new: str


def skopeo_command(ref: str, authfile: Optional[str] = None, insecure_hosts: Sequence[str] = ()) -> list[str]:
    """The skopeo call that fetches the manifest `ref`'s tag points to. TLS is verified unless the
    reference's registry is listed in `insecure_hosts` (a local test registry); credentials come
    from an auth file, never the command line (where other users could read them)."""
    host = ref.split("/", 1)[0]
    command = ["skopeo", "inspect", "--raw"]
    if authfile:
        command.append(f"--authfile={authfile}")
    if host in insecure_hosts:
        command.append("--tls-verify=false")
    repository, tag, _ = versions.split(ref)
    return command + [f"docker://{repository}:{tag}"]


def manifest_digest(raw: bytes, ref: str) -> str:
    """The digest of a schema 2 manifest or index exactly as the registry sent it."""
    try:
        manifest = json.loads(raw)
    except ValueError as error:
        raise PinError(f"{ref}: the registry's answer is not a JSON manifest ({error})") from None
    media_type = manifest.get("mediaType") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2 or (
        media_type is not None and media_type not in MANIFEST_TYPES
    ):
        raise PinError(f"{ref}: not a schema 2 manifest or index (mediaType {media_type!r})")
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def resolve(ref: str, authfile: Optional[str] = None, insecure_hosts: Sequence[str] = ()) -> str:
    """The digest `ref`'s tag points to now."""
    command = skopeo_command(ref, authfile, insecure_hosts)
    try:
        done = subprocess.run(command, capture_output=True, timeout=TIMEOUT)
    except FileNotFoundError:
        raise PinError("skopeo is not installed (apt-get install skopeo)") from None
    except subprocess.TimeoutExpired:
        raise PinError(f"{ref}: no answer from the registry within {TIMEOUT}s") from None
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise PinError(f"{ref}: skopeo inspect failed: {message[-1] if message else f'exit {done.returncode}'}")
    return manifest_digest(done.stdout, ref)


def render(records: dict[str, versions.DigestRecord], order: Sequence[str]) -> str:
    """The file text: records in the order of the pins, one mapping each."""
    document = {
        name: {"ref": r.ref, "digest": r.digest, "source": r.source, "recorded": r.recorded}
        for name in order if (r := records.get(name))
    }
    return HEADER + yaml.safe_dump(document, sort_keys=False, width=1000)


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` so that readers see the old file or the new one, never a part."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def pin(
    names: Sequence[str] = (),
    *,
    missing_only: bool = False,
    path: Path = versions.DIGESTS_FILE,
    tags: Optional[dict[str, str]] = None,
    authfile: Optional[str] = None,
    insecure_hosts: Sequence[str] = (),
    dry_run: bool = False,
    today: Optional[str] = None,
) -> tuple[list[Change], list[str]]:
    """Resolve the pins `names` (default: all; with `missing_only`, those without a record for
    their tag) and write their records; records of other pins are kept as they are, records of
    names that are no longer pins, or of a tag that is no longer the pin, are dropped.
    Returns (changed records, dropped names). Every pin is resolved before anything is written."""
    tags = versions.TAGS if tags is None else tags
    unknown = [n for n in names if n not in tags]
    if unknown:
        raise PinError(f"unknown image {', '.join(unknown)}; the pins are: {', '.join(tags)}")
    records = versions.load_digests(path)
    current = {n: r for n, r in records.items() if n in tags and r.ref == tags[n]}
    selected = list(names) or list(tags)
    if missing_only:
        selected = [n for n in selected if n not in current]
    today = today or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    changes = []
    for name in selected:
        ref = tags[name]
        digest = resolve(ref, authfile, insecure_hosts)
        old = current.get(name)
        if old and old.digest == digest:
            continue
        source = f"registry: skopeo inspect --raw docker://{ref} (sha256 of the manifest or index)"
        current[name] = versions.DigestRecord(ref, digest, source, today)
        changes.append(Change(name, ref, old.digest if old else None, digest))
    dropped = sorted(set(records) - set(current))
    if not dry_run and (changes or dropped or not path.exists()):
        write_atomically(path, render(current, list(tags)))
    return changes, dropped


def opt_outs_to_remove(root: Path, names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """(stack file, names) of each `Pulumi.<stack>.yaml` in `root` whose `platform.images.allowUnpinned`
    lists one of `names`, pins that now have a digest: the stack's config refuses such an entry
    (infra/stack_images.py), so it must go once the new digests are committed."""
    from infra import image_pins, stack_yaml
    from infra.config import ConfigError

    found = []
    for path in sorted(root.glob("Pulumi.*.yaml")):
        try:
            config = stack_yaml.read(path)
        except ConfigError:
            continue  # a malformed stack file: its own validation names the problem
        listed = image_pins.allowed_unpinned(config)
        stale = [name for name in names if name in listed]
        if stale:
            found.append((path.name, stale))
    return found

