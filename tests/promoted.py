"""The prod stack file as its first promotion writes it, for every test that renders or validates prod.

The repository's Pulumi.prod.yaml has no `image:` lines until a promotion writes them, and refuses
to render before that (tests/test_stack_file_errors.py). The tests render prod the way a user
gets there: render the test stack, take its `images` output, and apply it to Pulumi.prod.yaml with
the promotion's own code (cloudstation_tools/promote.py `first_promotion_text`: `select`, then cloudstation_tools/stack_file.py `apply`
and `validate`), i.e. what `python -m infra promote --from test --to prod` writes, without the
registry calls. Everything is computed once per session.
"""
from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

from infra import config as stack_config
from cloudstation_tools import promote, render

ROOT = Path(__file__).resolve().parent.parent
PROD = "prod"
SOURCE = "test"


@functools.lru_cache(maxsize=None)
def rendered_test() -> render.Rendered:
    """The test stack file rendered (shared with conftest's `rendered_stacks`)."""
    return render.render(SOURCE)


def images() -> dict[str, str]:
    """The test stack's `images` output: what a promotion copies."""
    return dict(rendered_test().outputs[promote.IMAGES_OUTPUT])


@functools.lru_cache(maxsize=None)
def text() -> str:
    """Pulumi.prod.yaml with every entity's image promoted from the test stack."""
    return promote.first_promotion_text(ROOT, images(), SOURCE, PROD)


def write(directory: Path) -> Path:
    """The promoted prod stack file as `directory`/Pulumi.prod.yaml."""
    path = Path(directory) / f"Pulumi.{PROD}.yaml"
    path.write_text(text(), encoding="utf-8")
    return path


@functools.lru_cache(maxsize=None)
def _stack_file() -> render.StackFile:
    with tempfile.TemporaryDirectory() as directory:
        write(Path(directory))
        return render.StackFile.read(PROD, Path(directory))


def read(stack: str = PROD) -> render.StackFile:
    """`render.StackFile.read(stack)`, with prod promoted; a copy the caller may change."""
    return copy.deepcopy(_stack_file()) if stack == PROD else render.StackFile.read(stack)


def validate_config(stack: str = PROD) -> stack_config.StackConfig:
    """`render.validate_config(stack)`, with prod promoted."""
    if stack != PROD:
        return render.validate_config(stack)
    values = read(PROD)
    return stack_config.load(values.values, root=ROOT, source=f"Pulumi.{PROD}.yaml", secret_keys=values.secret_keys)


@functools.lru_cache(maxsize=None)
def rendered_prod() -> render.Rendered:
    """The promoted prod stack file rendered (conftest's `rendered_stacks["prod"]`)."""
    return render.render(PROD, stack_file=read(PROD))


def rendered(stack: str) -> render.Rendered:
    return rendered_test() if stack == SOURCE else rendered_prod() if stack == PROD else render.render(stack)
