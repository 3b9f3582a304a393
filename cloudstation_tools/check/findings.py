"""What `cloudstation check` found, and its three ways of saying it: text for people, JSON for tools,
GitHub workflow commands for annotations on a pull request's files.

A finding is an `error` (the stack cannot deploy as written, or deploys something broken: exit 1), a
`warning` (it deploys, with a consequence to know about, e.g. data left behind: exit 0) or a `notice`
(a step of the flow still to do, e.g. a promotion: exit 0). Each names its file and, where a config
key is at fault, the key, the line it is written on, the value found and the fix.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Iterable, Optional

from infra.stack_yaml import KeyLines

ERROR, WARNING, NOTICE = "error", "warning", "notice"
SEVERITIES = (ERROR, WARNING, NOTICE)

_LOCATED = re.compile(r"^line (?P<line>\d+)(?:, column \d+)?: (?P<rest>.*)$", re.S)
_KEYED = re.compile(r"^(?P<key>[A-Za-z][\w.-]*:[^\s:]*(?: \([^)]*\))?): (?P<rest>.*)$", re.S)
DASH = " — "


@dataclass(frozen=True)
class Finding:
    severity: str
    file: str
    """The stack file, e.g. `Pulumi.test.yaml`."""
    message: str
    """What is wrong and what to do; for a keyed finding, what follows `key: value — `."""
    check: str
    """Which check found it: config, stack-file, promotion, clusters, budget, schemas, policy:<rule>, data."""
    key: Optional[str] = None
    value: Optional[str] = None
    """The value found at `key`, as the config's messages show it ('text', 3, (not set))."""
    line: Optional[int] = None
    related: tuple[str, ...] = ()
    """Other stack files the finding is about (a collision names both)."""

    def text(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        said = self.message if self.value is None else f"{self.value}{DASH}{self.message}"
        said = f"{self.key}: {said}" if self.key else said
        return f"{where}: {self.severity}: {said} [{self.check}]"


def from_problem(problem: str, file: str, lines: Optional[KeyLines], check: str = "config",
                 severity: str = ERROR, related: Iterable[str] = ()) -> Finding:
    """A finding from one line of a ConfigError (`key: value — what is allowed`, or `line N: ...` from
    the YAML reading), with the key's line looked up in the file."""
    located = _LOCATED.match(problem)
    if located:
        return Finding(severity, file, located["rest"], check, line=int(located["line"]), related=tuple(related))
    keyed = _KEYED.match(problem)
    if not keyed:
        return Finding(severity, file, problem, check, related=tuple(related))
    key, rest = keyed["key"], keyed["rest"]
    value, dash, message = rest.partition(DASH)
    if not dash:
        value, message = None, rest
    return Finding(severity, file, message, check, key=key, value=value,
                   line=lines.line(key) if lines is not None else None, related=tuple(related))


def keyed(severity: str, file: str, lines: Optional[KeyLines], key: Optional[str], value: Optional[str],
          message: str, check: str, related: Iterable[str] = ()) -> Finding:
    """A finding about `key` (a full key path, e.g. cloudstation:platform.namespace), located in the file."""
    line = lines.line(key) if (lines is not None and key) else None
    return Finding(severity, file, message, check, key=key, value=value, line=line, related=tuple(related))


def show(value) -> str:
    """A value as the config's messages show it."""
    if value is None:
        return "(not set)"
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Report:
    stacks: list[str]
    """The stack files checked (`--stack` narrows the findings to one)."""
    findings: list[Finding] = field(default_factory=list)
    timings: list[tuple[str, str, float]] = field(default_factory=list)
    """(stack or `*`, check, seconds): bench/check.py prints them."""
    could_not_run: Optional[str] = None

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for f in self.findings)

    @property
    def exit_code(self) -> int:
        if self.could_not_run:
            return 2
        return 1 if self.count(ERROR) else 0

    def sorted(self) -> list[Finding]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return sorted(self.findings, key=lambda f: (self.stacks.index(f.file) if f.file in self.stacks else len(self.stacks),
                                                    order[f.severity], f.line or 0))

    def summary(self, seconds: Optional[float] = None) -> str:
        if self.could_not_run:
            return f"cloudstation check could not run: {self.could_not_run}"
        counts = ", ".join(f"{self.count(s)} {s}{'' if self.count(s) == 1 else 's'}" for s in SEVERITIES)
        took = f" in {seconds:.1f} s" if seconds is not None else ""
        files = ", ".join(self.stacks)
        verdict = "clean" if not self.findings else ("problems" if self.exit_code else "no errors")
        return f"cloudstation check: {len(self.stacks)} stack file(s) ({files}): {counts}{took} — {verdict}"


def as_text(report: Report, seconds: Optional[float] = None) -> str:
    return "".join(f"{f.text()}\n" for f in report.sorted()) + report.summary(seconds) + "\n"


def as_json(report: Report, seconds: Optional[float] = None) -> str:
    return json.dumps({
        "version": 1,
        "stacks": report.stacks,
        "exitCode": report.exit_code,
        "couldNotRun": report.could_not_run,
        "summary": {s: report.count(s) for s in SEVERITIES},
        "seconds": None if seconds is None else round(seconds, 3),
        "findings": [{**asdict(f), "related": list(f.related)} for f in report.sorted()],
    }, indent=2) + "\n"


def _escape(text: str, property_value: bool = False) -> str:
    # GitHub's workflow command encoding (actions/toolkit packages/core/src/command.ts escapeData/escapeProperty).
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property_value else text


def as_github(report: Report, seconds: Optional[float] = None) -> str:
    """`::error file=…,line=…,title=…::message` per finding (annotations on the pull request), then the summary."""
    out = []
    for f in report.sorted():
        properties = [f"file={_escape(f.file, True)}"] + ([f"line={f.line}"] if f.line else []) + \
            [f"title={_escape(f'cloudstation check ({f.check})', True)}"]
        said = f.message if f.value is None else f"{f.value}{DASH}{f.message}"
        said = f"{f.key}: {said}" if f.key else said
        out.append(f"::{f.severity} {','.join(properties)}::{_escape(said)}\n")
    return "".join(out) + report.summary(seconds) + "\n"


FORMATS = {"text": as_text, "json": as_json, "github": as_github}
