"""How the project's dynamic providers travel to Pulumi's dynamic-provider process.

Pulumi pickles a dynamic resource's provider with dill into the resource's inputs (`__provider`,
pulumi sdk/python/lib/pulumi/dynamic/dynamic.py `serialize_provider`) and unpickles it in a separate
process (pulumi/dynamic/__main__.py `get_provider`). That process starts in the program's directory
(Pulumi.yaml `main`; the project root today, but `components` must load from any directory, and the
launcher's Python need not put it on sys.path), so a provider pickled by reference might not load. Instead a provider's `__reduce__` returns `(load_provider, (PROJECT_ROOT,
module, class name))`: dill serializes functions of `__main__` by value, so this loader (and only
it) is carried in the pickle; it finds the project, puts it on sys.path and imports the provider
class normally. The loader uses the standard library only.

`ProjectDynamicResource` is the base of the project's dynamic resources: it registers exactly what
pulumi's `dynamic.Resource.__init__` registers, but serializes each provider class once per process
(see its docstring for why).
"""
from __future__ import annotations

import os
import pickle
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic
from pulumi.dynamic.dynamic import PROVIDER_KEY, serialize_provider
from pulumi.runtime._serialization import _serialize


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


class ProjectProvider(dynamic.ResourceProvider):
    """Base of the project's dynamic providers: each travels as `load_provider(PROJECT_ROOT, its
    module, its class)`, captures nothing (so its serialized form need not be secret), and reports
    the input problems its `problems` finds as check failures."""

    serialize_as_secret_always = False

    def __reduce__(self):
        return load_provider, (PROJECT_ROOT, type(self).__module__, type(self).__qualname__)

    def problems(self, news: dict[str, Any]) -> list[tuple[str, str]]:
        """`(input key, reason)` for each thing wrong with the inputs; none by default."""
        return []

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        return dynamic.CheckResult(news, [dynamic.CheckFailure(key, reason) for key, reason in self.problems(news)])


# --- registering a dynamic resource ---------------------------------------------------------------

_PICKLER_PATCHED = ("_batch_setitems", "save_dict")
"""What pulumi's `serialize_provider` replaces on `pickle._Pickler` and never puts back."""


def guarded_serialize_provider(provider: dynamic.ResourceProvider) -> str:
    """pulumi's own `serialize_provider`, leaving `pickle` as it found it.

    pulumi 3.272.0 sdk/python/lib/pulumi/dynamic/dynamic.py `serialize_provider` sets
    `pickle.Pickler = pickle._Pickler`, wraps `pickle.Pickler._batch_setitems` (so `_Pickler`'s) in a
    sorting wrapper and replaces `save_dict`, and in its `finally` restores only `pickle.Pickler`:
    every call wraps the previous wrapper again, and after ~480 calls (fewer inside a deep program
    stack) pickling a dict recurses past the interpreter's limit (RecursionError; the same code on
    pulumi/pulumi master as stored, 2026-08; pulumi/pulumi#17803 reports that error for a dynamic
    provider, closed as not reproduced). Putting both attributes back after each call keeps the
    nesting at one, whoever called upstream before."""
    saved = pickle.Pickler, {name: getattr(pickle._Pickler, name) for name in _PICKLER_PATCHED}
    try:
        return serialize_provider(provider)
    finally:
        pickle.Pickler = saved[0]
        for name, value in saved[1].items():
            setattr(pickle._Pickler, name, value)


_SERIALIZED: dict[tuple, tuple[str, bool]] = {}
"""(loader, loader arguments) -> (serialized provider, whether it captured secrets): one dill run per
provider class and process."""


def serialized_provider(provider: dynamic.ResourceProvider) -> tuple[str, bool]:
    """`(text, contains_secrets)` as `dynamic.Resource.__init__` computes them
    (`_serialize(True, serialize_provider, provider)`), computed once per provider class.

    Reuse is exact only for a provider whose pickle is determined by its class: one whose
    `__reduce__` returns `(load_provider, (root, module, name))` (pickle then writes that call and
    nothing of the instance). Any other provider is serialized every time, as upstream does."""
    reduced = provider.__reduce__() if type(provider).__reduce__ is not object.__reduce__ else None
    by_loader = (isinstance(reduced, tuple) and len(reduced) == 2 and reduced[0] is load_provider
                 and isinstance(reduced[1], tuple) and all(isinstance(arg, str) for arg in reduced[1]))
    key = reduced if by_loader else None
    if key is None:
        return _serialize(True, guarded_serialize_provider, provider)
    if key not in _SERIALIZED:
        _SERIALIZED[key] = _serialize(True, guarded_serialize_provider, provider)
    return _SERIALIZED[key]


class ProjectDynamicResource(dynamic.Resource):
    """A dynamic resource whose provider is serialized once per class and process.

    `dynamic.Resource.__init__` (pulumi 3.272.0 sdk/python/lib/pulumi/dynamic/dynamic.py) runs dill
    over the provider for every resource (~1.5-15 ms each, and the pickler nesting above grows by
    one each time). This registers the same request: type `pulumi-python:dynamic/<module>:<name>`,
    the caller's props plus `__provider` (a secret Output unless the provider sets
    `serialize_as_secret_always = False` and captured no secret), the same options; and it calls
    `CustomResource.__init__` from its own `__init__`, so the SDK's stack trace (the frames above
    the third `__init__`, sdk/python/lib/pulumi/runtime/resource.py `_get_stack_trace`) starts at
    the subclass's `super().__init__` line, as it does through upstream's `__init__`.
    tests/test_dynamic_resources.py compares the requests byte for byte."""

    def __init__(
        self, provider: dynamic.ResourceProvider, name: str, props: dict, opts: Optional[pulumi.ResourceOptions] = None
    ) -> None:
        if PROVIDER_KEY in props:
            raise Exception("A dynamic resource must not define the __provider key")
        text, contains_secrets = serialized_provider(provider)
        serialized: Any = text
        if getattr(provider, "serialize_as_secret_always", True) or contains_secrets:
            serialized = pulumi.Output.secret(text)
        props[PROVIDER_KEY] = serialized
        pulumi.CustomResource.__init__(self, f"pulumi-python:{self._resource_type_name}", name, props, opts)
