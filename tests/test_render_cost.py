"""Cheap guards of what keeps `render` within 1.5x a bare Pulumi program (bench/render_cost.py, too
slow for the suite, measures it): the program loads none of pulumi-kubernetes' generated API
modules (components/kube.py), and the config models do not extract their attribute docstrings at
import (components/model.py), which the config reference reads from the source instead, exactly as
pydantic would have."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cloudstation_tools import config_reference
from components.model import ConfigModel

ROOT = Path(__file__).resolve().parent.parent

API_MODULE = re.compile(r"pulumi_kubernetes\.[a-z]+\.v[0-9]+(?:(?:alpha|beta)[0-9]+)?")

LOADED = """
import json, sys
sys.path.insert(0, {root!r})
from cloudstation_tools import render
render.render({stack!r})
# A lazily imported module (pulumi_kubernetes' _utilities.lazy_import) is in sys.modules before it runs.
print(json.dumps(sorted(name for name, module in sys.modules.items() if type(module).__name__ != "_LazyModule")))
"""


@pytest.mark.parametrize("stack", ["test"])
def test_render_loads_no_generated_kubernetes_api_module(stack):
    """A kind missing from components/kube.py KINDS, or a module importing pulumi_kubernetes for its
    kinds, loads the kind's whole API group version (core/v1 alone is ~0.3 s of CPU). meta/v1 is
    loaded on purpose: the light kinds type `metadata` with its ObjectMeta."""
    run = subprocess.run([sys.executable, "-c", LOADED.format(root=str(ROOT), stack=stack)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loaded = [name for name in json.loads(run.stdout.splitlines()[-1])
              if API_MODULE.fullmatch(name) and name != "pulumi_kubernetes.meta.v1"]
    assert loaded == [], (f"{loaded}: add the kinds the program registers from these to components/kube.py "
                          "KINDS (tests/test_kube_light.py checks each entry), and import `components.kube as k8s`")


def _models(cls=ConfigModel):
    for sub in cls.__subclasses__():
        yield sub
        yield from _models(sub)


def test_config_reference_reads_attribute_docstrings_as_pydantic_does():
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    import infra.config  # noqa: F401  (defines the models)

    models = sorted(set(_models()), key=lambda m: (m.__module__, m.__qualname__))
    assert len(models) > 20
    assert not ConfigModel.model_config.get("use_attribute_docstrings")
    for model in models:
        assert config_reference.attribute_docstrings(model) == extract_docstrings_from_cls(model, use_inspect=True), model
    # the fields' descriptions come from there
    assert config_reference._description(infra.config.StackConfig, "environment")
