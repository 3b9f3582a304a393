"""Reading a stack file (`Pulumi.<stack>.yaml`) as the Pulumi CLI would, or refusing it with every
problem named by file, line and what to do.

The CLI parses stack files with Go's gopkg.in/yaml.v3 (pulumi/pulumi sdk/go/common/encoding/marshal.go),
which refuses a mapping with a repeated key; PyYAML would silently keep the last one, and a whole
section (a project) would vanish. Config keys are `<namespace>:<name>` (or the old
`<namespace>:config:<name>`, the same key), anything else is refused (sdk/go/common/resource/config/key.go
`ParseKey`). Everything here runs before the config model sees a value, so a malformed file is a
`ConfigError` (exit 2 in the CLI), never a traceback.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from infra.config import ConfigError

STR_TAG = "tag:yaml.org,2002:str"
MERGE_TAG = "tag:yaml.org,2002:merge"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
MAX_DEPTH = 32
"""Nesting levels a stack file may use (the deepest real key is about 8 levels down)."""
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE):  # type: ignore[misc,valid-type]
    """Safe YAML, except that a date-like scalar stays the string it is written as: the engine
    passes config values as text, and a datetime would not survive the JSON the program gets."""


_Loader.add_constructor(TIMESTAMP_TAG, lambda loader, node: loader.construct_scalar(node))


def _at(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


def _line(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


def read_text(path: Path) -> str:
    """The file's text; refused unless it is UTF-8 (how Pulumi reads it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ConfigError([f"can't be read: {error.strerror or error}"], path.name) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ConfigError(
            [f"line {line}: byte 0x{data[error.start]:02x} is not UTF-8 — save the file as UTF-8 text "
             "(Pulumi reads stack files as UTF-8)"],
            path.name,
        ) from None


def compose(text: str, source: str) -> Optional[Node]:
    """The YAML node tree of one document; syntax errors name the line and column."""
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = ""
        if error.context and error.context_mark is not None and error.context_mark.line != getattr(mark, "line", None):
            # e.g. an unclosed `[`: the parser notices lines later; say where the construct began.
            where = f" ({error.context} that starts at {_at(error.context_mark)})"
        elif error.context:
            where = f" ({error.context})"
        raise ConfigError([f"{_at(mark)}: not valid YAML: {error.problem}{where} — fix the YAML syntax there"],
                          source) from None
    except yaml.YAMLError as error:  # e.g. a control character (ReaderError: its position, no mark)
        raise ConfigError([f"not valid YAML: {error} — fix the YAML syntax"], source) from None
    except RecursionError:  # the pure-Python parser (libyaml stops at 1000 levels by itself)
        raise ConfigError([f"nested deeper than {MAX_DEPTH} levels — not a stack file"], source) from None
    finally:
        loader.dispose()


def structure_problems(root: Optional[Node]) -> list[str]:
    """Repeated keys, keys that are not names, too deep nesting and recursive aliases, with lines."""
    problems: list[str] = []
    checked: set[int] = set()

    def walk(node: Node, depth: int, ancestors: frozenset) -> None:
        if id(node) in ancestors:
            problems.append(f"{_line(node)}: a YAML alias refers to a node that contains it — remove the recursion")
            return
        if depth > MAX_DEPTH:
            problems.append(f"{_line(node)}: nested deeper than {MAX_DEPTH} levels — not a stack file")
            return
        if id(node) in checked:
            return
        checked.add(id(node))
        inside = ancestors | {id(node)}
        if isinstance(node, MappingNode):
            first: dict[str, Node] = {}
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag == MERGE_TAG:
                    walk(value, depth + 1, inside)
                    continue
                if not isinstance(key, ScalarNode) or key.tag != STR_TAG:
                    shown = key.value if isinstance(key, ScalarNode) else "a " + type(key).__name__.replace("Node", "").lower()
                    kind = key.tag.rsplit(":", 1)[-1] if isinstance(key, ScalarNode) else "a collection"
                    problems.append(
                        f"{_line(key)}: key {shown!r} is not a name (YAML reads it as {kind or 'null'}) — "
                        "keys are strings: quote it, or remove the entry"
                    )
                elif key.value in first:
                    problems.append(
                        f"{_line(key)}: key {key.value!r} appears again in the same mapping (first at "
                        f"{_line(first[key.value])}) — the Pulumi CLI refuses repeated keys, and one of them "
                        "would be lost; keep one"
                    )
                else:
                    first[key.value] = key
                walk(value, depth + 1, inside)
        elif isinstance(node, SequenceNode):
            for item in node.value:
                walk(item, depth + 1, inside)

    if root is not None:
        walk(root, 1, frozenset())
    return problems


def _config_key(key: str, node: Node) -> tuple[Optional[str], Optional[str]]:
    """(full key, problem) as Pulumi's ParseKey reads a config key."""
    parts = key.split(":")
    if len(parts) == 2 and all(parts):
        return key, None
    if len(parts) == 3 and parts[1] == "config" and parts[0] and parts[2]:
        return f"{parts[0]}:{parts[2]}", None  # the old `<namespace>:config:<name>` spelling of the same key
    hint = f"; did you mean 'cloudstation:{parts[-1]}'?" if parts[-1] else ""
    return None, (f"{_line(node)}: config key {key!r} is not `<namespace>:<name>` — the Pulumi CLI refuses it; "
                  f"this program's keys are cloudstation:<name>{hint}")


def read(path: Path) -> dict[str, Any]:
    """The `config:` of a stack file: full key -> value (YAML data, not yet JSON), checked."""
    source = path.name
    root = compose(read_text(path), source)
    problems = structure_problems(root)
    if root is not None and not isinstance(root, MappingNode):
        problems.append(f"{_line(root)}: the file is a YAML {'list' if isinstance(root, SequenceNode) else 'scalar'}; "
                        "a stack file is a mapping with a `config:` key")
    if problems:
        raise ConfigError(problems, source)
    config_node = next((v for k, v in (root.value if root is not None else [])
                        if isinstance(k, ScalarNode) and k.value == "config"), None)
    if config_node is None or (isinstance(config_node, ScalarNode) and config_node.tag.endswith(":null")):
        return {}
    if not isinstance(config_node, MappingNode):
        raise ConfigError([f"{_line(config_node)}: `config:` must be a mapping of `<namespace>:<name>: value` "
                           f"(found a {'list' if isinstance(config_node, SequenceNode) else 'scalar'})"], source)
    loader = _Loader("")
    try:
        config = loader.construct_document(config_node)
    except yaml.YAMLError as error:  # an unknown tag such as !Ref
        mark = getattr(error, "problem_mark", None)
        raise ConfigError([f"{_at(mark)}: {getattr(error, 'problem', error)} — plain YAML values only"], source) from None
    finally:
        loader.dispose()
    lines = {k.value: k for k, _ in config_node.value if isinstance(k, ScalarNode) and k.tag == STR_TAG}
    values: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in config.items():  # merged keys (`<<: *anchor`) included, as yaml.v3 merges them
        node = lines.get(key, config_node)
        full, problem = _config_key(key, node)
        if problem:
            problems.append(problem)
        elif full in values:
            problems.append(f"{_line(node)}: config key {key!r} is {written[full]!r} again (`<namespace>:config:<name>` "
                            "is Pulumi's old spelling of `<namespace>:<name>`) — keep one")
        else:
            values[full], written[full] = value, key
    for full, value in values.items():
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):
            problems.append(f"{full}: holds a value that is not plain text, a number, true/false, a list or a mapping "
                            "(e.g. !!binary or .nan) — write it as a string")
    if problems:
        raise ConfigError(problems, source)
    return values


def is_secure(value: Any) -> bool:
    """A `secure:` value (`pulumi config set --secret`): an encrypted string, decrypted by the engine."""
    return isinstance(value, dict) and set(value) == {"secure"} and isinstance(value["secure"], str)


_SEGMENT = re.compile(r"\[(\d+|\*)\]|\.?([^.\[\]]+)")


class KeyLines:
    """Where a config key path is written in a stack file: the line of the key (or list item) a
    problem names, e.g. `cloudstation:projects[0].entities[1].kind`, `cloudstation:platform.registry
    (registryPassword)` or a flat key written with dots. A path that goes deeper than the file (a
    missing key, a default) answers the line of the deepest part that is written; `[*]` stops there.
    Built once per file from the same node tree the CLI's reading uses (`compose`)."""

    def __init__(self, text: str, source: str = "stack file"):
        self.top: dict[str, tuple[Node, Node]] = {}
        try:
            root = compose(text, source)
        except ConfigError:
            return  # a file that does not parse has its own problem, with its line
        config = next((v for k, v in (root.value if isinstance(root, MappingNode) else [])
                       if isinstance(k, ScalarNode) and k.value == "config"), None)
        for key, value in config.value if isinstance(config, MappingNode) else []:
            if isinstance(key, ScalarNode):
                parts = key.value.split(":")
                full = f"{parts[0]}:{parts[2]}" if len(parts) == 3 and parts[1] == "config" else key.value
                self.top.setdefault(full, (key, value))

    def line(self, key: str) -> Optional[int]:
        """1-based line of `key`, or None when nothing of it is written in the file."""
        key = key.split(" (", 1)[0]
        written = max((k for k in self.top if key == k or key.startswith((k + ".", k + "["))), key=len, default=None)
        if written is None:
            return None
        key_node, node = self.top[written]
        found = key_node.start_mark.line + 1
        for index, name in _SEGMENT.findall(key[len(written):]):
            if index == "*":
                break
            if index:
                if not isinstance(node, SequenceNode) or int(index) >= len(node.value):
                    break
                node = node.value[int(index)]
                found = node.start_mark.line + 1
                continue
            member = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == name), None) \
                if isinstance(node, MappingNode) else None
            if member is None:
                break
            found, node = member[0].start_mark.line + 1, member[1]
        return found
