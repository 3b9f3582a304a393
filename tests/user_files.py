"""Which tests read the user's stack files: the guard that keeps the suite off them.

The stack files at the repository's root (`Pulumi.<stack>.yaml`; Pulumi.yaml is the project's, not a
stack's) belong to the user, who edits them as the docs say. The suite tests the program on its
fixture stacks (tests/stacks/), so a test that reads a root stack file fails unless it is marked
`example_stacks`: a fact about the repository's own example stack files, checked only while those
files are the example as recorded (tests/stacks/example.sha256) and skipped once the user edited them.

A read is an `open` of such a file (Python's audit hook, sys.addaudithook), by the test process or
by a Python process it starts: every child gets this folder's `guard_site/` on PYTHONPATH, whose
sitecustomize.py installs the same hook and appends each read to a log named by
CLOUDSTATION_GUARD_LOG, with the test that ran (pytest's PYTEST_CURRENT_TEST). Not covered: a child
started with a PYTHONPATH of its own, and non-Python programs (bash, node, the Pulumi CLI).
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Optional

LOG_ENV = "CLOUDSTATION_GUARD_LOG"
ROOT_ENV = "CLOUDSTATION_GUARD_ROOT"
SITE = Path(__file__).resolve().parent / "guard_site"
STACK_FILE = re.compile(r"^Pulumi\.[^/\\]+\.yaml$")
EXAMPLE_DIGESTS = Path(__file__).resolve().parent / "stacks" / "example.sha256"
"""sha256sum of the example stack files as the repository ships them (`python -m tests.user_files
--record` after changing them on purpose)."""
MARKER = "example_stacks"

_root: Optional[str] = None
_hooked = False
_current: Optional[str] = None
_reads: list[tuple[Optional[str], str]] = []


def is_stack_file(path, root: str) -> Optional[str]:
    """The real path of `path` if it names a stack file directly in `root`, else None."""
    if isinstance(path, int):
        return None
    try:
        text = os.fsdecode(path)
    except (TypeError, ValueError):
        return None
    if not STACK_FILE.match(os.path.basename(text)):
        return None
    full = os.path.realpath(text)
    return full if os.path.dirname(full) == root else None


def _hook(event: str, args: tuple) -> None:
    if event == "open" and _root is not None and args:
        full = is_stack_file(args[0], _root)
        if full is not None:
            _reads.append((_current, full))


def install(root: Path) -> None:
    """Watch opens of `root`'s stack files from now on, in this process and its Python children."""
    global _root, _hooked
    _root = os.path.realpath(root)
    if not _hooked:
        sys.addaudithook(_hook)
        _hooked = True
    log = Path(tempfile.gettempdir()) / f"cloudstation-guard-{os.getpid()}.log"
    log.write_text("")
    os.environ[LOG_ENV] = str(log)
    os.environ[ROOT_ENV] = _root
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *paths])


def uninstall() -> None:
    """Stop logging the children's reads (the hook of this process cannot be removed; it stays idle)."""
    global _root
    log = os.environ.pop(LOG_ENV, None)
    if log and os.path.exists(log):
        os.unlink(log)
    os.environ.pop(ROOT_ENV, None)
    _root = None


def running(nodeid: Optional[str]) -> None:
    """Reads from now on are `nodeid`'s (None: between tests)."""
    global _current
    _current = nodeid


def reads_of(nodeid: str) -> list[str]:
    """The stack files `nodeid` read since the last call (its own process and its children), each once."""
    found = [path for who, path in _reads if who == nodeid]
    _reads[:] = [(who, path) for who, path in _reads if who != nodeid]
    log = os.environ.get(LOG_ENV)
    if log and os.path.exists(log):
        lines = Path(log).read_text(encoding="utf-8").splitlines()
        kept = []
        for line in lines:
            test, _, path = line.partition("\t")
            if test.rsplit(" (", 1)[0] == nodeid:
                found.append(path)
            else:
                kept.append(line)
        if len(kept) != len(lines):
            Path(log).write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
    return sorted(set(found))


def unattributed() -> list[str]:
    """Reads outside any test (module imports at collection, say), each once; forgets them."""
    found = sorted({path for who, path in _reads if who is None})
    _reads[:] = [(who, path) for who, path in _reads if who is not None]
    return found


def problem(nodeid: str, paths: list[str], root: Path) -> str:
    names = ", ".join(Path(p).name for p in paths)
    return (f"{nodeid} read the user's stack file(s) {names} in {root}. Those are the user's to edit, and the "
            f"suite must stay green whatever they hold: test the program on the fixture stacks instead "
            f"(tests/stacks/: `stacks.read`, `stacks.render`, `stacks.rendered`, the `rendered` fixtures), or, "
            f"for a fact about the repository's own example stack files, mark the test "
            f"@pytest.mark.{MARKER} (it then runs only while they are the example, tests/stacks/example.sha256).")


# --- the example as recorded ---------------------------------------------------------------------


def example_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("Pulumi.*.yaml") if STACK_FILE.match(p.name))


def digests(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in example_files(root)}


def recorded() -> dict[str, str]:
    found = {}
    for line in EXAMPLE_DIGESTS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            found[name.strip()] = digest
    return found


def edited_example(root: Path) -> list[str]:
    """How the root's stack files differ from the example as recorded (empty: they are the example)."""
    now, then = digests(root), recorded()
    return ([f"{name} changed" for name in sorted(now.keys() & then.keys()) if now[name] != then[name]]
            + [f"{name} added" for name in sorted(now.keys() - then.keys())]
            + [f"{name} removed" for name in sorted(then.keys() - now.keys())])


def record(root: Path) -> None:
    EXAMPLE_DIGESTS.write_text("".join(f"{digest}  {name}\n" for name, digest in digests(root).items()),
                               encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m tests.user_files --record   (after changing the example stack files on purpose)")
    record(Path(__file__).resolve().parent.parent)
    print(EXAMPLE_DIGESTS.read_text(encoding="utf-8"), end="")
