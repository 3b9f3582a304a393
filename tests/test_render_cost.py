"""A cheap guard of `render`'s cost (bench/render_cost.py, too slow for the suite, measures it): the
config models do not extract their attribute docstrings at import (components/model.py), which the
config reference reads from the source instead, exactly as pydantic would have."""
from __future__ import annotations

from cloudstation_tools import config_reference
from components.model import ConfigModel


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
