"""The base class of every settings model: component args and the stack config compose these.

Keys are camelCase in stack files (Pulumi's convention) and snake_case in Python. Unknown keys are
rejected, so a typo in a stack file is an error, not a silently ignored setting.
"""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError


class ConfigModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        use_attribute_docstrings=True,
    )


def problem(allowed: str, subpath: str = "", value: object = None) -> PydanticCustomError:
    """A validation error whose message says what is allowed.

    `subpath` (e.g. "[2].name") points below the location pydantic reports, for checks that a
    model or list validator makes about one of its members; `value` is the bad value there.
    """
    return PydanticCustomError(
        "cloudstation", "{allowed}", {"allowed": allowed, "subpath": subpath, "value": value}
    )


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
