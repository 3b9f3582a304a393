"""How the project's dynamic providers travel to Pulumi's dynamic-provider process.

Pulumi pickles a dynamic resource's provider with dill into the resource's inputs (`__provider`,
pulumi sdk/python/lib/pulumi/dynamic/dynamic.py `serialize_provider`) and unpickles it in a separate
process (pulumi/dynamic/__main__.py `get_provider`). That process starts in the program's directory
(infra/, Pulumi.yaml `main`), where `components` is not importable, so a provider pickled by
reference would not load. Instead a provider's `__reduce__` returns `(load_provider, (PROJECT_ROOT,
module, class name))`: dill serializes functions of `__main__` by value, so this loader (and only
it) is carried in the pickle; it finds the project, puts it on sys.path and imports the provider
class normally. Standard library only.
"""
from __future__ import annotations

import os


def load_provider(root: str, module: str, name: str):
    """Rebuild provider `module.name` inside Pulumi's dynamic-provider process.

    The project root is where the program ran (`root`), else the nearest of the working directory
    and its two parents that has the module's file."""
    import importlib
    import os
    import sys

    marker = os.path.join(*module.split(".")) + ".py"
    here = os.getcwd()
    candidates = [root, here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))]
    found = next((path for path in candidates if os.path.isfile(os.path.join(path, marker))), None)
    if found is None:
        raise RuntimeError(f"cannot find the CloudStation project ({marker}) in {candidates}")
    if found not in sys.path:
        sys.path.insert(0, found)
    return getattr(importlib.import_module(module), name)()


# dill serializes functions of `__main__` by value, everything else by reference (import name).
load_provider.__module__ = "__main__"
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The directory holding components/ (the repository root) on the machine running the program."""
