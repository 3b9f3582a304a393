"""The stack-config reference (docs/config-reference.md), generated from the pydantic models.

`python -m infra config-reference` writes it; tests/test_docs.py fails when the committed file
differs from what the models say. Every key is listed with its path as stack files and error
messages spell it (camelCase), its type, its default (the value the program really uses: defaults
of nested sections come from the enclosing default, e.g. Armada's PostgreSQL database) and the
attribute docstring of its field.
"""
from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
import types
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Optional

import annotated_types
from pydantic import BaseModel, TypeAdapter
from pydantic.networks import IPvAnyNetwork

from components.model import DnsLabel, ShortDnsLabel
from infra.config import PROJECT, SECRET_KEYS, StackConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "config-reference.md"
"""Where the reference is committed."""

REQUIRED = "**required**"
SECTION = "(section)"
"""Default column of a key whose value is a section with keys of its own, listed below it."""

_DNS_LABELS = {
    id(typing.get_args(DnsLabel)[1]): "DNS label (at most 63 characters)",
    id(typing.get_args(ShortDnsLabel)[1]): "DNS label (at most 40 characters)",
}


@dataclass(frozen=True)
class Row:
    key: str
    """Path below `cloudstation:`, e.g. `platform.registry.nodePort`; `[]` stands for any list item."""
    type: str
    default: str
    description: str


def rows(model: type[BaseModel] = StackConfig, prefix: str = "", instance: Optional[BaseModel] = None) -> list[Row]:
    """Every key of `model` and of the sections below it, depth first, in declaration order.

    `instance` is the default value of this section when it has one, so that nested defaults are
    the effective ones; list items and required sections use the model's own defaults."""
    out: list[Row] = []
    dumped = instance.model_dump(mode="json", by_alias=True) if instance is not None else None
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        annotation = _strip_optional(info.annotation)
        nested, below = _nested(annotation)
        if dumped is not None:
            value: Any = dumped[info.alias or name]
            default_value = getattr(instance, name)
        elif info.is_required():
            value = default_value = _REQUIRED_MARK
        else:
            default_value = info.get_default(call_default_factory=True)
            value = TypeAdapter(info.annotation).dump_python(
                _validated(info.annotation, default_value), mode="json", by_alias=True
            )
        if below == "" and nested is not None:
            shown = REQUIRED if value is _REQUIRED_MARK else ("unset" if value is None else SECTION)
        else:
            shown = _show_default(value)
        description = _description(model, name) or _model_summary(nested) or ""
        out.append(Row(key, _type_name(info.annotation, info.metadata), shown, _one_line(description)))
        if nested is not None:
            section = None
            if below == "" and value is not _REQUIRED_MARK and default_value is not None:
                section = default_value if isinstance(default_value, BaseModel) else nested.model_validate(default_value)
            out.extend(rows(nested, key + below + ".", section))
    return out


_REQUIRED_MARK = object()


def _validated(annotation: Any, value: Any) -> Any:
    # `Field(default={}, validate_default=True)` stores the raw dict; dump what validation makes of it.
    return TypeAdapter(annotation).validate_python(value) if isinstance(value, dict) and value == {} else value


def _nested(annotation: Any) -> tuple[Optional[type[BaseModel]], str]:
    """The model below a key and how its keys continue the path: `.` for a section, `[].` for a
    list of sections, `.<name>.` for a map of sections; (None, "") for a plain value."""
    if _is_model(annotation):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args and _is_model(args[0]):
        return args[0], "[]"
    if origin is dict and len(args) == 2 and _is_model(args[1]):
        return args[1], ".<name>"
    return None, ""


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _type_name(annotation: Any, metadata: list = ()) -> str:
    """A reader's name for a field type, with its constraints."""
    base = _plain_type(annotation)
    constraints = []
    for item in metadata:
        if id(item) in _DNS_LABELS:
            base = _DNS_LABELS[id(item)]
        elif isinstance(item, annotated_types.Ge):
            constraints.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            constraints.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            constraints.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            constraints.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen):
            constraints.append(f"at least {item.min_length} item{'s' if item.min_length != 1 else ''}")
        elif isinstance(item, annotated_types.MaxLen):
            constraints.append(f"at most {item.max_length}")
    return base + (f" ({', '.join(constraints)})" if constraints else "")


def _plain_type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = _plain_type(args[0])
        for item in args[1:]:
            if id(item) in _DNS_LABELS:
                return _DNS_LABELS[id(item)]
        return inner
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return " or ".join(_plain_type(a) for a in members)
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin is list:
        return f"list of {_plain_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_plain_type(args[0])} to {_plain_type(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{member.value}`" for member in annotation)
    if _is_model(annotation):
        return "section"
    if annotation is IPvAnyNetwork:
        return "IP network (CIDR)"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _show_default(value: Any) -> str:
    if value is _REQUIRED_MARK:
        return REQUIRED
    if value is None:
        return "unset"
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return "`" + text.replace("|", "\\|") + "`"


def _description(model: type[BaseModel], name: str) -> str:
    """The field's docstring, or that of the field it overrides (ProjectStateConfig only changes
    EntityConfig's defaults)."""
    for cls in model.__mro__:
        info = getattr(cls, "model_fields", {}).get(name) if _is_model(cls) else None
        if info is None:
            continue
        description = info.description or attribute_docstrings(cls).get(name)
        if description:
            return description
    return ""


@functools.cache
def attribute_docstrings(cls: type) -> dict[str, str]:
    """{attribute: docstring} of the string literals right under a class's annotated attributes,
    cleaned as pydantic's use_attribute_docstrings cleans them (pydantic 2.x
    pydantic/_internal/_docs_extraction.py `DocstringVisitor`: inspect.cleandoc; nested classes and
    functions not entered), which components/model.py ConfigModel leaves off for its import cost."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    if source.startswith((" ", "\t")):  # a multi-line string less indented than the class
        source = "def wrapper():\n" + textwrap.indent(source, "    ")
    node = ast.parse(source).body[0]
    body = node.body[0].body if isinstance(node, ast.FunctionDef) else node.body
    found = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def _model_summary(model: Optional[type[BaseModel]]) -> str:
    doc = model.__dict__.get("__doc__") if model is not None else None
    return doc.strip().split("\n\n")[0] if doc else ""


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The whole reference page (Markdown)."""
    lines = [
        "# Stack configuration reference",
        "",
        "<!-- Generated by `python -m infra config-reference` from the models in infra/config.py and the",
        "     args models it composes. Do not edit: change the models' attribute docstrings and regenerate",
        "     (tests/test_docs.py fails when this file is stale). -->",
        "",
        f"Every key a stack file (`Pulumi.<stack>.yaml`) may set in the `{PROJECT}:` namespace. Keys are",
        "camelCase, as in the stack files and in config error messages; `[]` stands for any item of a list,",
        "`<name>` for any key of a map. Unknown keys are errors. *Default* is the value used when the key is",
        f"not set; {SECTION} marks a key whose value is a section with the keys listed after it. Examples:",
        "`Pulumi.test.yaml`, `Pulumi.prod.yaml` and the area pages in docs/.",
        "",
    ]
    top: dict[str, list[Row]] = {}
    for row in rows():
        top.setdefault(row.key.split(".")[0].split("[")[0], []).append(row)
    for name, section in top.items():
        lines += [f"## `{PROJECT}:{name}`", "", section[0].description, ""]
        lines += ["| Key | Type | Default | Description |", "|---|---|---|---|"]
        lines += [f"| `{r.key}` | {r.type} | {r.default} | {r.description} |" for r in section]
        lines.append("")
    lines += [
        "## Secrets (`secure:` keys)",
        "",
        "Set with `pulumi config set --secret <key> <value>`: Pulumi stores them encrypted in the stack file, and",
        "the program reads them with `require_secret`, never through the models above.",
        "",
        "| Key | What it holds |",
        "|---|---|",
    ]
    lines += [f"| `{PROJECT}:{key}` | {_one_line(what)} |" for key, what in sorted(SECRET_KEYS.items())]
    lines.append("")
    return "\n".join(lines)


def write(path: Path = DOC) -> bool:
    """Write the reference to `path`; True when the file changed."""
    text = render()
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True
