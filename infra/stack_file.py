"""Exact edits of the entity image references in a stack file.

A stack file carries comments, a chosen key order and `secure:` values encrypted for that stack,
so it is never re-serialised. ruamel.yaml only *locates* each image scalar (line and column); the
edit replaces exactly those characters of the original text and nothing else. The result is
checked (same YAML data apart from the edited images, valid stack config) before it is written
atomically: a temp file in the same directory, fsync, os.replace.

Image slots are keyed like the test stack's `images` output:

    "<project>/<entity>"        cloudstation:projects[i].entities[j].image
    "platform/<name>"           cloudstation:platform.projectState.image (name: project-state)
"""
from __future__ import annotations

import copy
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from infra import config as stack_config

PROJECTS = f"{stack_config.PROJECT}:projects"
PLATFORM = f"{stack_config.PROJECT}:platform"
PLATFORM_PROJECT = "platform"
DEFAULT_PROJECT_STATE = "project-state"


class StackFileError(Exception):
    """The stack file cannot be edited as asked; str() names the file, the key and why."""


@dataclass(frozen=True)
class ImageSlot:
    """Where one entity's image reference is (or would go) in the stack file text."""

    key: str
    """`<project>/<entity>`."""
    path: str
    """The config key path, e.g. `cloudstation:projects[0].entities[1].image`."""
    value: Optional[str]
    """The current reference; None when the entity has no `image:` key yet."""
    start: int
    """Offset of the scalar (including any quote) in the text; for a missing key, where a new line goes."""
    end: int
    indent: str = ""
    """For a missing key: the indentation of the entity's keys."""


def read_text(path: Path) -> str:
    """The file's exact text (line endings kept)."""
    return path.read_bytes().decode("utf-8")


def image_slots(text: str, source: str = "stack file") -> dict[str, ImageSlot]:
    """Every entity image slot of a stack file's text."""
    try:
        document = YAML().load(text)
    except Exception as error:  # ruamel raises many error types; all mean "not YAML"
        raise StackFileError(f"{source}: not valid YAML: {error}") from None
    config = document.get("config") if isinstance(document, CommentedMap) else None
    if not isinstance(config, CommentedMap):
        raise StackFileError(f"{source}: no `config:` mapping")
    lines = _line_offsets(text)
    slots: dict[str, ImageSlot] = {}

    platform = config.get(PLATFORM)
    project_state = platform.get("projectState") if isinstance(platform, CommentedMap) else None
    if isinstance(project_state, CommentedMap):
        key = f"{PLATFORM_PROJECT}/{project_state.get('name', DEFAULT_PROJECT_STATE)}"
        slots[key] = _slot(text, lines, project_state, key, f"{PLATFORM}.projectState.image", source)

    projects = config.get(PROJECTS)
    if projects is not None and not isinstance(projects, list):
        raise StackFileError(f"{source}: {PROJECTS} must be a YAML list to be edited")
    for i, project in enumerate(projects or []):
        for j, entity in enumerate((project or {}).get("entities") or []):
            if not isinstance(entity, CommentedMap) or "name" not in entity:
                continue  # config validation reports it
            key = f"{project.get('name')}/{entity['name']}"
            slots[key] = _slot(text, lines, entity, key, f"{PROJECTS}[{i}].entities[{j}].image", source)
    return slots


def _line_offsets(text: str) -> list[int]:
    offsets, position = [], 0
    for line in text.splitlines(keepends=True):
        offsets.append(position)
        position += len(line)
    return offsets + [position]


def _slot(text: str, lines: list[int], mapping: CommentedMap, key: str, path: str, source: str) -> ImageSlot:
    if "image" not in mapping:
        # A new `image:` line goes right below the mapping's first key, at its indentation.
        first = next(iter(mapping))
        line, column = mapping.lc.key(first)
        if mapping.fa.flow_style() or mapping.lc.value(first)[0] != line or isinstance(mapping[first], (dict, list)):
            raise StackFileError(
                f"{source}: {path} is missing and can't be inserted here; add an `image:` line by hand"
            )
        return ImageSlot(key, path, None, lines[line + 1], lines[line + 1], " " * column)
    value = mapping["image"]
    line, column = mapping.lc.value("image")
    start = lines[line] + column
    end = _scalar_end(text, start)
    if not isinstance(value, str) or yaml.safe_load(text[start:end]) != value:
        raise StackFileError(f"{source}: {path} is not a one-line string scalar; can't edit it in place")
    return ImageSlot(key, path, value, start, end)


def _scalar_end(text: str, start: int) -> int:
    """End offset of the one-line scalar starting at `start` (plain, 'single' or "double" quoted)."""
    quote = text[start]
    if quote in "'\"":
        position = start + 1
        while position < len(text) and text[position] != "\n":
            if quote == '"' and text[position] == "\\":
                position += 2
                continue
            if text[position] == quote:
                if quote == "'" and text[position + 1 : position + 2] == "'":
                    position += 2
                    continue
                return position + 1
            position += 1
        return position
    end = start
    while end < len(text) and text[end] not in "\r\n,}]" and text[end : end + 2] != " #":
        end += 1
    return len(text[start:end].rstrip()) + start


def edit(text: str, changes: Mapping[str, Optional[str]], source: str = "stack file") -> str:
    """`text` with the image of each `changes` key set to its new reference; nothing else differs."""
    slots = image_slots(text, source)
    unknown = sorted(set(changes) - set(slots))
    if unknown:
        raise StackFileError(f"{source}: no entity {', '.join(unknown)}")
    edits = []
    for key, ref in changes.items():
        slot = slots[key]
        if ref is None:
            raise StackFileError(f"{source}: {slot.path}: removing an image line is not supported; edit it by hand")
        if not stack_config.DIGEST_REF.match(ref):
            raise StackFileError(f"{source}: {slot.path}: {ref!r} is not pinned by digest")
        if slot.value is None:
            newline = "\r\n" if text[: slot.start].endswith("\r\n") else "\n"
            edits.append((slot.start, slot.end, f"{slot.indent}image: {ref}{newline}"))
        else:
            quote = text[slot.start] if text[slot.start] in "'\"" else ""
            edits.append((slot.start, slot.end, f"{quote}{ref}{quote}"))
    result = text
    for start, end, replacement in sorted(edits, reverse=True):
        result = result[:start] + replacement + result[end:]
    _check_only_images_changed(text, result, changes, source)
    return result


def _check_only_images_changed(before: str, after: str, changes: Mapping[str, str], source: str) -> None:
    """The edited text must parse to the original data with just the given images replaced."""
    expected = copy.deepcopy(yaml.safe_load(before))
    config = expected["config"]
    for key, ref in changes.items():
        project, _, entity = key.partition("/")
        project_state = (config.get(PLATFORM) or {}).get("projectState") or {}
        if project == PLATFORM_PROJECT and entity == project_state.get("name", DEFAULT_PROJECT_STATE):
            config[PLATFORM]["projectState"]["image"] = ref
            continue
        for candidate in config[PROJECTS]:
            if candidate.get("name") == project:
                for item in candidate["entities"]:
                    if item.get("name") == entity:
                        item["image"] = ref
    if yaml.safe_load(after) != expected:
        raise StackFileError(f"{source}: internal error: the edit would change more than the image references")


def validate(text: str, root: Path, source: str) -> stack_config.StackConfig:
    """The text's stack config, validated exactly as the program validates it."""
    document = yaml.safe_load(text) or {}
    raw: dict[str, Any] = {
        key: value
        for key, value in (document.get("config") or {}).items()
        if not (isinstance(value, dict) and set(value) == {"secure"})
    }
    return stack_config.load(raw, root=root, source=source)


def write_atomic(path: Path, text: str, expected: Optional[str] = None) -> None:
    """Replace the file's content in one step: readers see the old file or the new one, never a mix.

    `expected` is the text the edit started from; if the file changed since, nothing is written.
    """
    path = path.resolve()
    if expected is not None and read_text(path) != expected:
        raise StackFileError(f"{path.name} changed while the promotion ran; nothing was written, run it again")
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, stat.S_IMODE(path.stat().st_mode))
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # makes the rename itself durable
    finally:
        os.close(directory)
