"""Exact edits of the entity image references in a stack file.

A stack file carries comments, a chosen key order and `secure:` values encrypted for that stack,
so it is never re-serialised. The file is parsed once (`parse`): one YAML composition (libyaml
when PyYAML has it) gives both the data and, from the node marks, the exact offsets of every image
scalar. The edit replaces exactly those characters of the original text and nothing else. The
result is checked (same YAML data apart from the edited images, valid stack config) before it is
written atomically: a temp file in the same directory, fsync, os.replace, fsync of the directory.

Image slots are keyed like the test stack's `images` output:

    "<project>/<entity>"        cloudstation:projects[i].entities[j].image
    "platform/<name>"           cloudstation:platform.projectState.image (name: project-state)
"""
from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from infra import config as stack_config
from infra.image_refs import is_digest_ref

PROJECTS = f"{stack_config.PROJECT}:projects"
PLATFORM = f"{stack_config.PROJECT}:platform"
PLATFORM_PROJECT = "platform"
DEFAULT_PROJECT_STATE = "project-state"
STR_TAG = "tag:yaml.org,2002:str"
PLAIN_OR_QUOTED = (None, "", "'", '"')
"""Scalar styles edited in place (libyaml reports plain as "", the Python parser as None)."""
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml composes a 100-entity stack file in ~4 ms, the pure-Python loader in ~70 ms. Both give
node marks whose `index` counts characters of the str they were given (CRLF included)."""


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


@dataclass(frozen=True)
class Parsed:
    """A stack file's text, its data and its image slots, from one parse."""

    text: str
    source: str
    data: Any = field(repr=False)
    slots: dict[str, ImageSlot] = field(repr=False)


def read_text(path: Path) -> str:
    """The file's exact text (line endings kept)."""
    return path.read_bytes().decode("utf-8")


def _compose(text: str, source: str) -> tuple[Optional[Node], Any]:
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as error:
        raise StackFileError(f"{source}: not valid YAML: {error}") from None
    finally:
        loader.dispose()
    return node, data


def parse(text: str, source: str = "stack file") -> Parsed:
    """Parse a stack file's text once: its data and every entity image slot."""
    node, data = _compose(text, source)
    shared = _check_nodes(node, source)
    if not isinstance(node, MappingNode) or not isinstance(data, dict):
        raise StackFileError(f"{source}: no `config:` mapping")
    config_node, config = _member(node, "config"), data.get("config")
    if not isinstance(config_node, MappingNode) or not isinstance(config, dict):
        raise StackFileError(f"{source}: no `config:` mapping")
    slots: dict[str, ImageSlot] = {}

    platform_node = _member(config_node, PLATFORM)
    project_state_node = _member(platform_node, "projectState") if isinstance(platform_node, MappingNode) else None
    if isinstance(project_state_node, MappingNode):
        name = (config.get(PLATFORM) or {}).get("projectState", {}).get("name", DEFAULT_PROJECT_STATE)
        key = f"{PLATFORM_PROJECT}/{name}"
        slots[key] = _slot(text, project_state_node, key, f"{PLATFORM}.projectState.image", source, shared)

    projects_node = _member(config_node, PROJECTS)
    if projects_node is not None and not isinstance(projects_node, SequenceNode):
        if not (isinstance(projects_node, ScalarNode) and config.get(PROJECTS) is None):
            raise StackFileError(f"{source}: {PROJECTS} must be a YAML list to be edited")
        projects_node = None
    for i, project_node in enumerate(projects_node.value if projects_node else []):
        project = config[PROJECTS][i]
        entities_node = _member(project_node, "entities") if isinstance(project_node, MappingNode) else None
        if not isinstance(entities_node, SequenceNode):
            continue  # config validation reports it
        for j, entity_node in enumerate(entities_node.value):
            entity = project["entities"][j]
            if not isinstance(entity_node, MappingNode) or not isinstance(entity, dict) or "name" not in entity:
                continue  # config validation reports it
            key = f"{project.get('name')}/{entity['name']}"
            slots[key] = _slot(text, entity_node, key, f"{PROJECTS}[{i}].entities[{j}].image", source, shared)
    return Parsed(text, source, data, slots)


def image_slots(text: str, source: str = "stack file") -> dict[str, ImageSlot]:
    """Every entity image slot of a stack file's text."""
    return parse(text, source).slots


def _member(mapping: Optional[Node], key: str) -> Optional[Node]:
    if not isinstance(mapping, MappingNode):
        return None
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node
    return None


def _check_nodes(root: Optional[Node], source: str) -> set[int]:
    """One walk of the node tree: refuses a mapping with a repeated key (the Pulumi CLI rejects it,
    Go yaml.v3; PyYAML would keep the last), and returns the nodes reached more than once (YAML
    aliases), which an edit in place would change everywhere they are used."""
    seen: set[int] = set()
    shared: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            shared.add(id(node))
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, ScalarNode)]
            if len(set(keys)) != len(keys):
                repeated = sorted({k for k in keys if keys.count(k) > 1})
                line = node.start_mark.line + 1
                raise StackFileError(f"{source}: line {line}: key {repeated[0]!r} appears more than once in a mapping")
            for pair in node.value:
                stack.extend(pair)
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)
    return shared


def _slot(text: str, mapping: MappingNode, key: str, path: str, source: str, shared: set[int]) -> ImageSlot:
    keys = [k.value for k, _ in mapping.value if isinstance(k, ScalarNode)]
    if "<<" in keys or id(mapping) in shared:
        raise StackFileError(f"{source}: {path}: the entity uses a YAML alias or merge key; can't edit it in place")
    value_node = _member(mapping, "image")
    if value_node is None:
        # A new `image:` line goes right below the mapping's first key, at its indentation.
        first_key, first_value = mapping.value[0]
        newline = text.find("\n", first_value.end_mark.index)
        if (
            mapping.flow_style or not isinstance(first_value, ScalarNode) or first_value.style not in PLAIN_OR_QUOTED
            or first_value.start_mark.line != first_key.start_mark.line
            or first_value.end_mark.line != first_key.start_mark.line or newline < 0
        ):
            raise StackFileError(
                f"{source}: {path} is missing and can't be inserted here; add an `image:` line by hand"
            )
        return ImageSlot(key, path, None, newline + 1, newline + 1, " " * first_key.start_mark.column)
    start, end = value_node.start_mark.index, value_node.end_mark.index
    one_line = (
        isinstance(value_node, ScalarNode) and value_node.tag == STR_TAG and value_node.style in PLAIN_OR_QUOTED
        and id(value_node) not in shared and "\n" not in text[start:end] and "\r" not in text[start:end]
    )
    if not one_line or yaml.load(text[start:end], Loader=_LOADER) != value_node.value:
        raise StackFileError(f"{source}: {path} is not a one-line string scalar; can't edit it in place")
    return ImageSlot(key, path, value_node.value, start, end)


def apply(parsed: Parsed, changes: Mapping[str, Optional[str]]) -> Parsed:
    """The parsed stack file with the image of each `changes` key set to its new reference;
    nothing else in the text differs (checked by parsing the result)."""
    slots, text, source = parsed.slots, parsed.text, parsed.source
    unknown = sorted(set(changes) - set(slots))
    if unknown:
        raise StackFileError(f"{source}: no entity {', '.join(unknown)}")
    edits = []
    for key, ref in changes.items():
        slot = slots[key]
        if ref is None:
            raise StackFileError(f"{source}: {slot.path}: removing an image line is not supported; edit it by hand")
        if not is_digest_ref(ref):
            raise StackFileError(f"{source}: {slot.path}: {ref!r} is not pinned by digest")
        if slot.value is None:
            newline = "\r\n" if text[: slot.start].endswith("\r\n") else "\n"
            edits.append((slot.start, slot.end, f"{slot.indent}image: {ref}{newline}"))
        else:
            quote = text[slot.start] if text[slot.start] in "'\"" else ""
            edits.append((slot.start, slot.end, f"{quote}{ref}{quote}"))
    pieces, position = [], 0
    for start, end, replacement in sorted(edits):
        pieces += [text[position:start], replacement]
        position = end
    pieces.append(text[position:])
    result = parse("".join(pieces), source)
    _check_only_images_changed(parsed, result, changes)
    return result


def edit(text: str, changes: Mapping[str, Optional[str]], source: str = "stack file") -> str:
    """`text` with the image of each `changes` key set to its new reference; nothing else differs."""
    return apply(parse(text, source), changes).text


def _check_only_images_changed(before: Parsed, after: Parsed, changes: Mapping[str, str]) -> None:
    """The edited text must parse to the original data with just the given images replaced."""
    expected = _without_images(before.data, before.slots, changes)
    if _without_images(after.data, after.slots, changes) != expected or any(
        after.slots[key].value != ref for key, ref in changes.items()
    ):
        raise StackFileError(f"{before.source}: internal error: the edit would change more than the image references")


def _without_images(data: Any, slots: Mapping[str, ImageSlot], keys) -> Any:
    """The data with the `image` of each of `keys`' entities removed (a copy of the parts it touches)."""
    config = dict(data["config"])
    for key in keys:
        path = slots[key].path
        if path.startswith(PLATFORM):
            platform = config[PLATFORM] = dict(config[PLATFORM])
            platform["projectState"] = {k: v for k, v in platform["projectState"].items() if k != "image"}
            continue
        i, j = (int(part.split("]")[0]) for part in path.split("[")[1:])
        projects = config[PROJECTS] = list(config[PROJECTS])
        project = projects[i] = dict(projects[i])
        entities = project["entities"] = list(project["entities"])
        entities[j] = {k: v for k, v in entities[j].items() if k != "image"}
    return {**data, "config": config}


def validate(text: Union[str, Parsed], root: Path, source: str,
             stack_dir: Optional[Path] = None) -> stack_config.StackConfig:
    """The stack config, validated exactly as the program validates it (from text or a parse); the
    other stack files it is checked against are in `stack_dir` (default: `root`, as the engine keeps them)."""
    document = (text.data if isinstance(text, Parsed) else _compose(text, source)[1]) or {}
    raw: dict[str, Any] = {}
    for key, value in (document.get("config") or {}).items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            # Only the names of the program's secure keys matter to validation (never their values).
            if key.partition(":")[2] in stack_config.SECRET_KEYS and key.partition(":")[0] == stack_config.PROJECT:
                raw[key] = "[secret]"
            continue
        raw[key] = value
    secure = [key for key, value in (document.get("config") or {}).items()
              if isinstance(value, dict) and set(value) == {"secure"}]  # a plain-text secret is refused
    return stack_config.load(raw, root=root, stack_dir=stack_dir, source=source, secret_keys=secure)


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
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory, which makes a rename or a new file in it durable."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
