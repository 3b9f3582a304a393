"""An entity's build context as one deterministic tar, and the OCI artifact that carries it.

The in-cluster build (components/entity_build.py) ships exactly the files the content tag covers
(components/entity_image.py `context_files`: the .dockerignore rules applied) plus the Dockerfile
text, so the job builds what the tag names and nothing else. The tar is deterministic, so the
program (which names its digest in the job's pod spec) and the provider (which uploads it) agree
byte for byte on any machine:

- uncompressed (gzip output differs between zlib versions), PAX format as Python writes it;
- entries sorted by path, no directory entries (tar creates parents on extraction);
- mtime 0, uid/gid 0, uname/gname "", mode 0644, or 0755 when any exec bit is set (for a symlink,
  whose own mode is always 0777 on Linux, that is 0755), so neither umask, owner nor checkout time
  changes the bytes;
- symlinks stay symlinks (their target, as the content tag hashes them);
- `Dockerfile` at the root is the given Dockerfile text (an entity's own, or the generated one),
  replacing a kept file of that name.

Pure: no Pulumi, standard library only.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

from components.entity_image import DOCKERFILE, context_files

CONTEXT_ARTIFACT_TYPE = "application/vnd.cloudstation.build-context.v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
TAR_LAYER = "application/vnd.oci.image.layer.v1.tar"
EMPTY_CONFIG = b"{}"
"""The OCI 1.1 empty descriptor's content (image-spec manifest.md, "Guidance for an Empty Descriptor")."""
CONTEXT_REPOSITORY_PART = "builds"


def _entry(name: str, size: int = 0, *, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode, info.linkname = size, kind, mode, link
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    return info


def context_tar(context: Path, dockerfile_text: str) -> bytes:
    """The build context of `context` (exactly `context_files(context)`) plus `Dockerfile`, as
    deterministic uncompressed tar bytes."""
    context = Path(context)
    names = sorted({*(n for n in context_files(context) if n != DOCKERFILE), DOCKERFILE})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            if name == DOCKERFILE:
                data = dockerfile_text.encode()
                tar.addfile(_entry(name, len(data)), io.BytesIO(data))
                continue
            path = context / name
            info = path.lstat()
            mode = 0o755 if info.st_mode & 0o111 else 0o644
            if stat.S_ISLNK(info.st_mode):
                tar.addfile(_entry(name, kind=tarfile.SYMTYPE, mode=mode, link=os.readlink(path)))
            elif stat.S_ISREG(info.st_mode):
                data = path.read_bytes()
                tar.addfile(_entry(name, len(data), mode=mode), io.BytesIO(data))
            else:
                raise ValueError(f"{path}: only files and symlinks can be in a build context")
    return buffer.getvalue()


def context_digest(tar: bytes) -> str:
    """`sha256:<hex>` of the tar bytes: the blob's digest in the registry."""
    return "sha256:" + hashlib.sha256(tar).hexdigest()


def context_repository(prefix: str, project: str, entity: str) -> str:
    """Where an entity's contexts are uploaded: `[<prefix>/]builds/<project>/<entity>`."""
    return "/".join(part for part in (prefix.strip("/"), CONTEXT_REPOSITORY_PART, project, entity) if part)


def descriptor(media_type: str, data: bytes) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def context_manifest(tar_digest: str, tar_size: int) -> bytes:
    """The OCI 1.1 artifact manifest of one context: artifactType CONTEXT_ARTIFACT_TYPE, the empty
    config, one uncompressed tar layer. Canonical JSON (sorted keys, no spaces): same bytes, same
    digest, wherever it is made."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": CONTEXT_ARTIFACT_TYPE,
        "config": descriptor(OCI_EMPTY, EMPTY_CONFIG),
        "layers": [{"mediaType": TAR_LAYER, "digest": tar_digest, "size": tar_size}],
    }
    return json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
