"""The base class of every settings model: component args and the stack config compose these.

Keys are camelCase in stack files (Pulumi's convention) and snake_case in Python. Unknown keys are
rejected, so a typo in a stack file is an error, not a silently ignored setting.
"""
from __future__ import annotations

import re
from typing import Annotated, Iterable, Mapping

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError


class ConfigModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )
    # Fields are documented by the docstring under each attribute; the config reference reads them
    # from the source (cloudstation_tools/config_reference.py). Not pydantic's use_attribute_docstrings:
    # it walks the import's frames and re-parses each model's source as the class is created, ~0.1 s
    # of CPU on every render for text only the reference shows (bench/render_cost.py).


def problem(allowed: str, subpath: str = "", value: object = None) -> PydanticCustomError:
    """A validation error whose message says what is allowed.

    `subpath` (e.g. "[2].name") points below the location pydantic reports, for checks that a
    model or list validator makes about one of its members; `value` is the bad value there.
    """
    return PydanticCustomError(
        "cloudstation", "{allowed}", {"allowed": allowed, "subpath": subpath, "value": value}
    )


class NotShown:
    """A problem's value that error messages never echo (a credential): infra/config.py shows
    `(value not shown)` in its place."""


NOT_SHOWN = NotShown()


def problems(found: list[PydanticCustomError]) -> PydanticCustomError:
    """Several problems a model check found, as one error that infra/config.py reports line by line:
    switching a mode reports everything the new mode needs at once, not one key per run."""
    first, *rest = found
    return PydanticCustomError("cloudstation", "{allowed}", {**first.context, "more": [e.context for e in rest]})


def unique_names(items: list, what: str) -> list:
    """For a list validator: every item's `name` once; the error points at the repeated name."""
    seen: set[str] = set()
    for index, item in enumerate(items):
        if item.name in seen:
            raise problem(f"{what} names must be unique", f"[{index}].name", item.name)
        seen.add(item.name)
    return items


def check_mode_keys(
    model: BaseModel, mode: str, only: Mapping[str, Iterable[str]], required: Mapping[str, Mapping[str, str]],
    more: Iterable[PydanticCustomError] = (),
) -> None:
    """Keys of a settings model that depend on its `mode`.

    `only` maps each mode to the fields only that mode accepts (fields listed nowhere apply to every
    mode): a field the chosen mode would ignore is a mistake in the stack file, not something to drop.
    `required` maps a mode to {field: what it is} for fields that mode needs. `more`: the model's
    other problems, reported with these at once.
    """
    found = []
    for field in sorted(model.model_fields_set):
        modes = [name for name, fields in only.items() if field in fields]
        if modes and mode not in modes:
            value = getattr(model, field)
            shown = value.model_dump(by_alias=True, mode="json") if isinstance(value, BaseModel) else value
            found.append(problem(f"only allowed when mode is {' or '.join(repr(m) for m in modes)}", "." + to_camel(field), shown))
    for field, what in required.get(mode, {}).items():
        if getattr(model, field) is None:
            found.append(problem(f"required when mode is '{mode}': {what}", "." + to_camel(field), None))
    found += list(more)
    if found:
        raise problems(found)


_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _dns_label(max_length: int):
    def check(value: str) -> str:
        if not _DNS_LABEL.match(value) or len(value) > max_length:
            raise problem(
                f"must be a DNS label: lowercase letters, digits and '-', starting with a letter, "
                f"ending with a letter or digit, at most {max_length} characters"
            )
        return value

    return AfterValidator(check)


DnsLabel = Annotated[str, _dns_label(63)]
"""A Kubernetes object name that must also be a DNS label (namespaces, services)."""

ShortDnsLabel = Annotated[str, _dns_label(40)]
"""A name that gets prefixes or suffixes (e.g. `<project>-prod`, `<project>-<entity>`)."""
