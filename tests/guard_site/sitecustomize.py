"""Installed into every Python process the test suite starts (tests/user_files.py puts this folder
on PYTHONPATH): logs each open of a stack file at the repository's root, with the running test,
for tests/conftest.py to check. Then runs the sitecustomize this one shadows, if any."""
import os
import sys


def _install() -> None:
    import re

    log, root = os.environ.get("CLOUDSTATION_GUARD_LOG"), os.environ.get("CLOUDSTATION_GUARD_ROOT")
    if not (log and root):
        return
    stack_file = re.compile(r"^Pulumi\.[^/\\]+\.yaml$")

    def hook(event, args):
        if event != "open" or not args or isinstance(args[0], int):
            return
        try:
            text = os.fsdecode(args[0])
        except (TypeError, ValueError):
            return
        if stack_file.match(os.path.basename(text)):
            full = os.path.realpath(text)
            if os.path.dirname(full) == root:
                with open(log, "a", encoding="utf-8") as out:
                    out.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '')}\t{full}\n")

    sys.addaudithook(hook)


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    # Not another copy of this one (a repository copy's suite puts its own first on PYTHONPATH).
    here = os.path.basename(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.basename(os.path.abspath(p or ".")) != here])
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_install()
_chain()
