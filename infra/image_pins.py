"""Platform images that run by tag (issue 20 finding 6): the named opt-out, the refusal's remedy, and
what entity pods run besides what the program renders, shared by the stack config's check
(infra/stack_images.py), the rendered-graph checks and the policy pack (policy/rules.py).

A pin of infra/versions.py runs by digest once infra/image-digests.yaml records one for its tag;
until then a stack refuses to deploy it unless its stack file names it in
`platform.images.allowUnpinned` (a lab cluster's explicit, per-pin opt-out).

The CloudState proxies run in pods the operator creates from a StatefulService, with the image its
ConfigMap names (v0.6.0 operator/src/main/scala/io/cloudstate/operator/StatefulServiceOperatorFactory.scala
`createSideCar`: `store.proxyImage(config.images)`), so no rendered pod shows them. Every
StatefulService therefore carries PROXY_ANNOTATION, the image its pods' proxy runs as the cluster's
operator is configured (its own stack's ConfigMap, or the owner's for a stack sharing the cluster):
what the checks and the pack see of those pods.

Standard library and infra/versions.py only: the pack's virtualenv has neither pydantic nor the
Kubernetes SDK.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

KEY = "cloudstation:platform.images.allowUnpinned"
"""The opt-out, as errors name it."""
PIN_COMMAND = "python -m infra pin-images --missing"
"""What records the digests (cloudstation_tools/pin_images.py); it needs the registries, so it runs where they are reachable."""
PROXY_ANNOTATION = "cloudstation.io/proxy-image"
"""On every StatefulService: the proxy image the operator gives its pods (see the module docstring)."""
OPERATOR_CONFIG_MAP = "cloudstate-operator-config"
"""The operator's ConfigMap (upstream's name; the operator reads it from env CONFIG_MAP, key `config`)."""


def remedy(names: Iterable[str]) -> str:
    """How to get rid of a pull by tag: record the digests, or (a lab cluster) opt out by name."""
    listed = ", ".join(names)
    return (f"run `{PIN_COMMAND}` where their registries are reachable (it records each digest in "
            f"infra/image-digests.yaml; commit that file), or, on a lab cluster only, list {listed} in {KEY}")


def allowed_unpinned(config: Mapping[str, Any]) -> frozenset[str]:
    """The opt-out of a stack's config as the engine passes it to a policy pack (full key -> value,
    an object as JSON text); empty when it is absent or malformed (config validation refuses that)."""
    platform = config.get("cloudstation:platform")
    if isinstance(platform, str):
        try:
            platform = json.loads(platform)
        except ValueError:
            return frozenset()
    images = platform.get("images") if isinstance(platform, Mapping) else None
    names = images.get("allowUnpinned") if isinstance(images, Mapping) else None
    if not isinstance(names, list):
        return frozenset()
    return frozenset(name for name in names if isinstance(name, str))


def parse_operator_config(text: str) -> dict:
    """`watch.namespaces` and `proxy.image` back out of the HOCON components/cloudstate_operator.py
    `operator_config` writes (one `key = <JSON value>` per line); the keys the operator reads are
    v0.6.0 operator/src/main/scala/io/cloudstate/operator/OperatorConfig.scala's."""
    watched: list[str] = []
    images: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(" = ")
        if not sep:
            continue
        if key == "watch.namespaces":
            watched = json.loads(value)
        else:
            images[key] = json.loads(value)
    return {"watch.namespaces": watched, "proxy.image": images}
