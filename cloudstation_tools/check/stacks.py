"""The stack files of one project folder, each read as the Pulumi CLI reads it, validated by the config
model (infra/config.py, which knows everything one stack can know) and rendered under mocks for the
checks of the rendered graph.

A prod stack is validated with its images optional (a missing `image:` is a step of the flow, a
notice of `promotion`), and rendered as its next promotion would write it: each entity without an
image gets the source stack's rendered reference (`promote --from test`), or, for an entity the
source does not deploy, a made-up digest at its repository, so that the rest of the stack is checked
before anything was promoted. `diff` renders prod the same way.

A stack whose only problem is a platform image still without a digest (infra/stack_images.py) is
reported so and still rendered, as if its opt-out named every such pin, so that what the rest of
the checks find (the budget, the data a store switch leaves behind) comes in the same report.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from cloudstation_tools import promote, render, stack_file as stack_file_edits
from cloudstation_tools.check.findings import ERROR, Finding, from_problem
from infra import cluster_sharing, config as stack_config, image_pins, stack_yaml, versions
from infra.config import ConfigError, Environment
from infra.image_refs import entity_repository

SOURCE = "test"
"""The stack prod promotes from (`promote --from test`), when the folder has it."""


@dataclass
class Stack:
    name: str
    file: str
    lines: stack_yaml.KeyLines
    raw: dict[str, Any] = field(default_factory=dict)
    """Full config key -> its YAML value, as written (empty when the file does not read)."""
    values: Optional[render.StackFile] = None
    config: Optional[stack_config.StackConfig] = None
    problems: list[Finding] = field(default_factory=list)
    rendered: Optional[render.Rendered] = None
    filled: dict[str, str] = field(default_factory=dict)
    """Images given for review to entities without one: `<project>/<entity>` -> reference."""
    made_up: set[str] = field(default_factory=set)
    """Keys of `filled` whose reference is made up (the source stack does not deploy them)."""
    unpinned_for_review: bool = False
    """Its only problem is an image by tag: validated and rendered with every such pin opted out."""

    @property
    def valid(self) -> bool:
        return self.config is not None

    @property
    def is_prod(self) -> bool:
        return self.config is not None and self.config.environment is Environment.PROD


def names(root: Path) -> list[str]:
    """Every stack of the folder: `Pulumi.<stack>.yaml` beside Pulumi.yaml."""
    found = [cluster_sharing.stack_of(p.name) for p in root.glob("Pulumi.*.yaml")]
    return sorted(n for n in found if n)


def load(root: Path, name: str) -> Stack:
    """Read and validate one stack file; its problems as findings (errors), every one at once."""
    file = f"Pulumi.{name}.yaml"
    path = root / file
    text = path.read_text(encoding="utf-8", errors="replace")
    stack = Stack(name, file, stack_yaml.KeyLines(text, file))
    try:
        stack.raw = stack_yaml.read(path)
        stack.values = render.StackFile.read(name, root)
        # Images optional: a prod entity without one is a promotion still to do (a notice), not an error.
        stack.config = stack_config.load(stack.values.values, root=root, source=file,
                                         secret_keys=stack.values.secret_keys, require_images=False)
    except ConfigError as error:
        stack.problems = findings_of(error.problems, file, stack.lines)
        if all(problem.startswith(f"{image_pins.KEY}:") for problem in error.problems):
            try:
                stack.config = stack_config.load(opted_out(stack.values).values, root=root, source=file,
                                                 secret_keys=stack.values.secret_keys, require_images=False)
                stack.unpinned_for_review = True
            except ConfigError:
                pass  # its opt-out itself is wrong: reported above
    return stack


def opted_out(values: render.StackFile) -> render.StackFile:
    """The stack file with every pin still without a digest in `platform.images.allowUnpinned`."""
    platform = json.loads(values.values.get("cloudstation:platform") or "{}")
    images = platform.setdefault("images", {})
    listed = list(images.get("allowUnpinned") or [])
    listed += [name for name in versions.missing_digests() if name not in listed]
    images["allowUnpinned"] = listed
    return render.StackFile({**values.values, "cloudstation:platform": json.dumps(platform)}, values.secret_keys)


def findings_of(problems: list[str], file: str, lines: Optional[stack_yaml.KeyLines], check: str = "config") -> list[Finding]:
    """ConfigError lines as findings; an indented line continues the one above it (a problem that
    quotes another file's problems, infra/cluster_sharing.py)."""
    found: list[Finding] = []
    for problem in problems:
        if problem.startswith("  ") and found:
            last = found[-1]
            found[-1] = Finding(last.severity, last.file, f"{last.message}\n{problem}", last.check, last.key,
                                last.value, last.line, last.related)
            continue
        found.append(from_problem(problem, file, lines, "stack-file" if problem.startswith("line ") else check))
    return found


def source_of(stacks: dict[str, Stack]) -> Optional[Stack]:
    """The stack a prod stack promotes from: `test`, else the folder's only valid test stack."""
    tests = [s for s in stacks.values() if s.valid and s.config.environment is Environment.TEST]
    named = [s for s in tests if s.name == SOURCE]
    return (named or (tests if len(tests) == 1 else [None]))[0]


def made_up_reference(config: stack_config.StackConfig, key: str) -> str:
    """A reference at the entity's repository in the stack's registry, with a digest derived from
    its key: what review renders use for an entity no stack deploys yet."""
    registry = config.platform.registry
    project, _, entity = key.partition("/")
    digest = hashlib.sha256(f"cloudstation check: {key}".encode()).hexdigest()
    return f"{registry.pull_host}/{entity_repository(registry.repository_prefix, project, entity)}@sha256:{digest}"


def render_stack(stack: Stack, root: Path, source_images: Optional[dict[str, str]]) -> None:
    """Render a valid stack under mocks; a prod stack with entities without images as its next
    promotion would write it. A program failure is an error finding."""
    try:
        values = stack.values
        if stack.is_prod:
            values = _filled(stack, root, source_images or {})
        if stack.unpinned_for_review:
            values = opted_out(values)
        stack.rendered = render.render(stack.name, root, stack_file=values)
    except ConfigError as error:
        stack.problems += findings_of(error.problems, stack.file, stack.lines)
    except stack_file_edits.StackFileError as error:
        stack.problems.append(Finding(ERROR, stack.file, f"can't be rendered for review: {error}", "render"))
    except Exception as error:  # the program itself failed under mocks: say so, keep checking the others
        stack.problems.append(Finding(ERROR, stack.file, f"the program fails for this stack under mocks: "
                                      f"{type(error).__name__}: {error}", "render"))


def _filled(stack: Stack, root: Path, source_images: dict[str, str]) -> render.StackFile:
    path = root / stack.file
    parsed = stack_file_edits.parse(stack_file_edits.read_text(path), stack.file)
    missing = sorted(key for key, slot in parsed.slots.items() if slot.value is None)
    if not missing:
        return stack.values
    for key in missing:
        if key in source_images:
            stack.filled[key] = source_images[key]
        else:
            stack.filled[key] = made_up_reference(stack.config, key)
            stack.made_up.add(key)
    text = stack_file_edits.apply(parsed, stack.filled).text
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / stack.file).write_text(text, encoding="utf-8")
        return render.StackFile.read(stack.name, Path(directory))


def timed(timings: list, stack: str, check: str, work: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    try:
        return work()
    finally:
        timings.append((stack, check, time.perf_counter() - started))


IMAGES_OUTPUT = promote.IMAGES_OUTPUT


def reviewed(root: Path, name: str) -> Stack:
    """One stack loaded and rendered as `check` renders it (prod as its next promotion would write
    it, with the source stack's rendered images); ConfigError when it does not validate or render."""
    stack = load(root, name)
    images = None
    if stack.is_prod:
        source = source_of({n: load(root, n) for n in names(root) if n != name})
        if source is not None:
            render_stack(source, root, None)
            images = source.rendered.outputs.get(IMAGES_OUTPUT) if source.rendered else None
    if stack.valid:
        render_stack(stack, root, images)
    if stack.problems or stack.rendered is None:
        raise ConfigError([f.text() for f in stack.problems], stack.file)
    return stack
