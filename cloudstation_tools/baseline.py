"""What a stack's working-tree render is compared with, for `cloudstation diff` (what `pulumi up` would
change) and `cloudstation check` (data a store switch or removal leaves behind).

`against` is one of
- a directory holding `resources.json` (a `python -m infra render` output, e.g. rendered/before/test), or
  one holding such a directory per stack (rendered/before, with test/ and prod/ in it);
- a git ref (a commit, branch or tag, e.g. HEAD, origin/main, ORIG_HEAD): the repository at that ref,
  program and stack files together, exported to a temporary directory and rendered there;
- unset: the last deployment from this checkout, `.cloudstation/deployed/<stack>/` (scripts/up.sh
  writes the render it deployed there after every successful `pulumi up`), else git HEAD.

Why a render and not the stack's state: the state needs the backend's credentials and the passphrase,
which a reviewer or a pull request's CI does not have, while a render is offline and reproducible; a
render of what was deployed equals its state for every input the program sets. Changes made outside
the program (kubectl edits, a `pulumi up` from another checkout) are `pulumi preview`'s to show.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import yaml

DEPLOYED = Path(".cloudstation") / "deployed"
"""Under the project folder: `<stack>/` is the render of the last successful `pulumi up` (scripts/up.sh)."""


class BaselineError(Exception):
    """The baseline asked for cannot be had; str() says why and what to do."""


@dataclass(frozen=True)
class Baseline:
    resources: list[dict]
    """resources.json entries (cloudstation_tools/render_output.py)."""
    described: str
    """What it is, for messages: `the last deployment from this checkout (.cloudstation/deployed/test)`."""


def deployed_dir(root: Path, stack: str) -> Path:
    return root / DEPLOYED / stack


def resolve(root: Path, stack: str, against: Optional[str], *, needs_change: bool = False) -> Optional[Baseline]:
    """The baseline of `stack`. Unset `against`: the last deployment, else HEAD; None when neither
    exists, or (with `needs_change`) when HEAD is the working tree: nothing to compare."""
    found = resolve_all(root, [stack], against, needs_change=needs_change)[stack]
    if isinstance(found, BaselineError):
        raise found
    return found


def resolve_all(root: Path, stacks: list[str], against: Optional[str], *,
                needs_change: bool = False) -> dict[str, Union[Baseline, None, BaselineError]]:
    """`resolve` for several stacks at once: a git ref is exported once and its stacks rendered side by
    side (one process each), since most of a baseline's time is those renders."""
    found: dict[str, Union[Baseline, None, BaselineError]] = {}
    refs: list[str] = []
    ref = against
    for stack in stacks:
        try:
            if against is not None:
                path = Path(against) if Path(against).is_absolute() else Path.cwd() / against
                if (path / "resources.json").is_file():
                    found[stack] = _read(path, f"the render in {against}")
                elif (path / stack / "resources.json").is_file():
                    found[stack] = _read(path / stack, f"the render in {Path(against) / stack}")
                elif path.is_dir():
                    raise BaselineError(f"--against {against}: neither {against}/resources.json nor "
                                        f"{against}/{stack}/resources.json (a `python -m infra render --out DIR` "
                                        "output is expected)")
                else:
                    refs.append(stack)
                continue
            deployed = deployed_dir(root, stack)
            if (deployed / "resources.json").is_file():
                found[stack] = _read(deployed, f"the last deployment from this checkout ({DEPLOYED / stack})")
            else:
                refs.append(stack)
        except BaselineError as error:
            found[stack] = error
    if refs and against is None:
        ref = "HEAD"
        if not is_git(root) or (needs_change and unchanged(root, ref)):
            found.update({stack: None for stack in refs})
            refs = []
    if refs:
        found.update(at_ref(root, refs, ref))
    return found


def _read(directory: Path, described: str) -> Baseline:
    try:
        return Baseline(json.loads((directory / "resources.json").read_text(encoding="utf-8")), described)
    except (OSError, ValueError) as error:
        raise BaselineError(f"{directory / 'resources.json'} does not read: {error}") from None


def _git(root: Path, *argv: str, text: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=text, timeout=120)


def is_git(root: Path) -> bool:
    try:
        done = _git(root, "rev-parse", "--is-inside-work-tree")
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "true"


def unchanged(root: Path, ref: str) -> bool:
    """No tracked file differs from `ref` and no untracked file is waiting (a new entity): a render
    of `ref` would equal the working tree's."""
    diff = _git(root, "diff", "--quiet", ref, "--", ".")
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", ".")
    return diff.returncode == 0 and status.returncode == 0 and not status.stdout.strip()


def at_ref(root: Path, stacks: list[str], ref: str) -> dict[str, Union[Baseline, BaselineError]]:
    """The stacks rendered from the repository as it was at `ref` (its program and its stack files),
    with this interpreter; a stack file the ref does not have is an empty baseline (everything new)."""
    if not is_git(root):
        error = BaselineError(f"--against {ref}: {root} is not a git work tree (or git is missing); pass a render "
                              "directory instead (`python -m infra render --stack ... --out DIR`)")
        return {stack: error for stack in stacks}
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode != 0:
        error = BaselineError(f"--against {ref}: no such commit, branch or tag in {root} (in CI, fetch it first: "
                              "actions/checkout with fetch-depth: 0)")
        return {stack: error for stack in stacks}
    sha = commit.stdout.strip()
    prefix = _git(root, "rev-parse", "--show-prefix").stdout.strip()  # the project folder inside the repository
    described = f"git {ref} ({sha[:12]})"
    with tempfile.TemporaryDirectory(prefix="cloudstation-baseline-") as directory:
        archive = _git(root, "archive", "--format=tar", sha, text=False)
        if archive.returncode != 0:
            error = BaselineError(f"--against {ref}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
            return {stack: error for stack in stacks}
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(directory, filter="data")
        project = Path(directory) / prefix
        with ThreadPoolExecutor(max_workers=len(stacks)) as pool:  # each render is a process of its own
            renders = {stack: pool.submit(_render_at, project, Path(directory) / ".render" / stack, stack, ref, sha)
                       for stack in stacks}
            found: dict[str, Union[Baseline, BaselineError]] = {}
            for stack, render in renders.items():
                out = render.result()
                if isinstance(out, BaselineError):
                    found[stack] = out
                elif out is None:
                    found[stack] = Baseline([], f"{described}, which has no Pulumi.{stack}.yaml")
                else:
                    try:
                        found[stack] = _read(out, described)
                    except BaselineError as error:
                        found[stack] = error
        return found


def _render_at(project: Path, out: Path, stack: str, ref: str, sha: str) -> Union[Path, BaselineError, None]:
    stack_path = project / f"Pulumi.{stack}.yaml"
    if not stack_path.is_file():
        return None
    argv = [sys.executable, "-m", "infra", "render", "--stack", stack, "--out", str(out)]
    if _environment(stack_path) == "prod":
        argv += ["--promoted-from", "test"]  # before its first promotion: as it would be written
    done = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return BaselineError(f"--against {ref}: Pulumi.{stack}.yaml does not render at {sha[:12]}: {last[0]}")
    return out


def _environment(path: Path) -> Optional[str]:
    try:
        config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("config") or {}
    except (OSError, yaml.YAMLError):
        return None
    return config.get("cloudstation:environment")
