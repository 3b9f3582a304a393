"""The project's dynamic resources (components/dynamic_provider.py ProjectDynamicResource: EntityBuild's
build, armada Queue) register exactly what pulumi's own `dynamic.Resource.__init__` registers, while
serializing each provider class once per process and leaving `pickle` as they found it.

Each comparison registers the same things twice, once with pulumi 3.272.0's constructor in place of
ProjectDynamicResource's and once with ours, and compares every RegisterResourceRequest byte for byte
(tests/register_requests.py RequestMonitor: type, name, parent, inputs with `__provider` and its secret
wrapper, dependencies, options, source position and stack trace)."""
from __future__ import annotations

import pickle
import sys

import pulumi
import pulumi.dynamic as dynamic
import pytest
from pulumi.dynamic.dynamic import serialize_provider

from cloudstation_tools import render as render_module
from cloudstation_tools.mocks import ProgramMocks, is_wrapped_secret
from components import dynamic_provider
from components.armada.queue import Queue, QueueApiSettings, QueueArgs, QueueProvider
from components.dynamic_provider import PROJECT_ROOT, ProjectDynamicResource, load_provider
from components.entity_build import EntityBuildProvider, EntityBuildResource
from tests.register_requests import RENDERS, RequestMonitor, decoded, register  # noqa: F401 (fixture)

OURS = ProjectDynamicResource.__dict__["__init__"]
PATCHED = ("_batch_setitems", "save_dict")


def pickler_state() -> tuple:
    return (pickle.Pickler, *(getattr(pickle._Pickler, name) for name in PATCHED))


@pytest.fixture(autouse=True)
def pickle_restored():
    """Upstream's constructor (the comparison runs) leaves its wrappers on `pickle._Pickler`: undo them."""
    saved = pickler_state()
    yield
    pickle.Pickler = saved[0]
    for name, value in zip(PATCHED, saved[1:]):
        setattr(pickle._Pickler, name, value)


@pytest.fixture
def dynamic_both_ways(register, monkeypatch):
    """`run(program, upstream)` -> {(type, name, parent): request bytes}; `upstream` puts pulumi's
    `dynamic.Resource.__init__` in place of ProjectDynamicResource's."""

    def run(program, upstream: bool) -> dict:
        monkeypatch.setattr(ProjectDynamicResource, "__init__", dynamic.Resource.__init__ if upstream else OURS)
        monkeypatch.setattr(dynamic_provider, "_SERIALIZED", {})
        return register(program)

    return run


class SecretByDefault(dynamic.ResourceProvider):
    """Stateless, rebuilt by import, but not opting out of the secret `__provider`."""

    def __reduce__(self):
        return load_provider, (PROJECT_ROOT, "tests.test_dynamic_resources", "SecretByDefault")


class Stateful(dynamic.ResourceProvider):
    """Pickled with its state (no loader): serialized on every registration, as upstream does."""

    serialize_as_secret_always = False

    def __init__(self, setting: str):
        self.setting = setting


class Probe(ProjectDynamicResource, module="probe", name="Probe"):
    def __init__(self, provider, name: str, props: dict, opts=None):
        super().__init__(provider, name, props, opts)


def entity_build_props(**overrides) -> dict:
    return {
        "contentTag": "0123abcd", "contextDigest": "sha256:" + "b" * 64, "contextDir": "../entities/shop/cart",
        "dockerfileText": "FROM scratch\n", "repository": "shop/cart", "queue": "shop-builds",
        "registryAuthorization": pulumi.Output.secret("Basic dXNlcjpwYXNz"),
        "armadaAuthorization": pulumi.Output.secret("Basic YnVpbGQ6cGFzcw=="),
        "jobItem": pulumi.Output.from_input({"namespace": "builds", "podSpec": {"containers": []}}),
        "timeoutSeconds": 2400, "pollSeconds": 5, **overrides,
    }


def every_option(parent, depends_on) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(
        parent=parent, depends_on=depends_on, protect=True, ignore_changes=["jobItem"], delete_before_replace=False,
        retain_on_delete=True, custom_timeouts=pulumi.CustomTimeouts(create="40m"),
        aliases=[pulumi.Alias(name="old")], additional_secret_outputs=["digest"], replace_on_changes=["contentTag"],
    )


def program():
    parent = pulumi.ComponentResource("test:index:Parent", "parent")
    queue = Queue("shop-builds", QueueArgs(name="shop-builds", user_owners=["admin"]),
                  QueueApiSettings(url="http://127.0.0.1:8080", username="queues"),
                  pulumi.ResourceOptions(parent=parent), password=pulumi.Output.secret("pw"), submitters=("builds",))
    first = EntityBuildResource("shop-cart-build", entity_build_props(), every_option(parent, [queue]))
    EntityBuildResource("shop-list-build", entity_build_props(repository="shop/list"), pulumi.ResourceOptions(depends_on=[first]))
    Probe(SecretByDefault(), "secret-by-default", {"a": 1})
    Probe(SecretByDefault(), "secret-by-default-again", {"a": 2})
    Probe(Stateful("one"), "stateful-one", {"b": pulumi.Output.secret("s")})
    Probe(Stateful("two"), "stateful-two", {})
    parent.register_outputs({})
    return pulumi.Output.from_input(None)


def provider_input(request: bytes):
    return decoded(request)["object"]["__provider"]


def test_dynamic_resources_register_what_upstream_dynamic_resource_registers(dynamic_both_ways):
    upstream, ours = dynamic_both_ways(program, True), dynamic_both_ways(program, False)
    assert len(upstream) == 1 + 1 + 1 + 2 + 4  # stack, parent, queue, builds, probes
    assert ours.keys() == upstream.keys()
    for key, request in upstream.items():
        assert decoded(ours[key]) == decoded(request), key
        assert ours[key] == request, key
    by_name = {name: request for (_type, name, _parent), request in ours.items()}
    types = {name: type_ for (type_, name, _parent) in ours}
    assert types["shop-cart-build"] == "pulumi-python:dynamic/builds:EntityBuild"
    assert types["shop-builds"] == "pulumi-python:dynamic/armada:Queue"
    assert types["secret-by-default"] == "pulumi-python:dynamic/probe:Probe"
    # The providers that opt out carry a plain string; the others a secret (as upstream decides).
    for name in ("shop-cart-build", "shop-builds", "stateful-one", "stateful-two"):
        assert isinstance(provider_input(by_name[name]), str), name
    assert is_wrapped_secret(provider_input(by_name["secret-by-default"]))
    assert provider_input(by_name["shop-cart-build"]) == serialize_provider(EntityBuildProvider())


def test_the_test_stack_registers_the_same_either_way(monkeypatch):
    """The whole program (EntityBuilds and Queues with their real inputs): identical requests."""
    runs = {}
    for upstream in (True, False):
        monkeypatch.setattr(ProjectDynamicResource, "__init__", dynamic.Resource.__init__ if upstream else OURS)
        monkeypatch.setattr(dynamic_provider, "_SERIALIZED", {})
        monitors: list[RequestMonitor] = []

        def monitor(mocks, monitors=monitors):
            monitors.append(RequestMonitor(mocks))
            return monitors[-1]

        monkeypatch.setattr(render_module, "RecordingMonitor", monitor)
        RENDERS["test"]()
        runs[upstream] = monitors[-1].requests
    dynamic_keys = [key for key in runs[True] if key[0].startswith("pulumi-python:dynamic/")]
    assert {key[0] for key in dynamic_keys} == {"pulumi-python:dynamic/builds:EntityBuild", "pulumi-python:dynamic/armada:Queue",
                                                 "pulumi-python:dynamic/secrets:KeptSecret"}
    assert runs[False].keys() == runs[True].keys()
    for key, request in runs[True].items():
        assert runs[False][key] == request, key


def test_a_thousand_dynamic_resources_serialize_each_provider_class_once(register, monkeypatch):
    """Upstream would run dill 1000 times and nest its pickler wrapper 1000 deep (RecursionError
    near 480 at Python's default limit); ours runs it once per class and nests nothing."""
    calls: list[str] = []
    original = dynamic_provider.serialize_provider
    monkeypatch.setattr(dynamic_provider, "serialize_provider", lambda p: calls.append(type(p).__name__) or original(p))
    monkeypatch.setattr(dynamic_provider, "_SERIALIZED", {})
    before = pickler_state()
    api = QueueApiSettings(url="http://127.0.0.1:8080")

    def many():
        for i in range(500):
            Queue(f"q{i}", QueueArgs(name=f"q{i}"), api)
            EntityBuildResource(f"b{i}", entity_build_props(repository=f"p/e{i}"))
        return pulumi.Output.from_input(None)

    # What `pulumi up` runs the program with: the interpreter's default (celpy, which the schema
    # validation in this test process imports, raises it to 2500).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        requests = register(many)
    finally:
        sys.setrecursionlimit(limit)
    assert sorted(calls) == ["EntityBuildProvider", "QueueProvider"]
    assert pickler_state() == before
    providers = {provider_input(r) for (t, _n, _p), r in requests.items() if t.startswith("pulumi-python:dynamic/")}
    assert providers == {serialize_provider(QueueProvider()), serialize_provider(EntityBuildProvider())}
    assert sum(1 for key in requests if key[0].startswith("pulumi-python:dynamic/")) == 1000


def test_upstream_serialize_provider_still_nests_its_wrapper_and_ours_does_not():
    """Why the guard exists (pulumi 3.272.0 dynamic.py `serialize_provider` restores only
    `pickle.Pickler`). If a pulumi upgrade fixes it, this fails: the guard may then go."""
    before = pickler_state()
    serialize_provider(QueueProvider())
    once = pickler_state()
    assert once[0] is before[0]
    assert once[1] is not before[1] and once[2] is not before[2]  # left patched
    serialize_provider(QueueProvider())
    twice = pickler_state()
    assert twice[1] is not once[1]  # wrapped again: one more level per call
    assert dynamic_provider.guarded_serialize_provider(QueueProvider()) == serialize_provider(QueueProvider())
    settled = pickler_state()
    dynamic_provider.guarded_serialize_provider(EntityBuildProvider())
    assert pickler_state() == settled


def test_the_guard_restores_pickle_even_when_serialization_fails():
    class Unpicklable(dynamic.ResourceProvider):
        def __reduce__(self):
            raise TypeError("no")

    before = pickler_state()
    with pytest.raises(TypeError):
        dynamic_provider.guarded_serialize_provider(Unpicklable())
    assert pickler_state() == before


def test_only_providers_rebuilt_by_their_loader_are_reused(monkeypatch):
    monkeypatch.setattr(dynamic_provider, "_SERIALIZED", {})
    assert dynamic_provider.serialized_provider(Stateful("a")) != dynamic_provider.serialized_provider(Stateful("b"))
    assert dynamic_provider._SERIALIZED == {}
    text, secrets = dynamic_provider.serialized_provider(QueueProvider())
    assert (text, secrets) == (serialize_provider(QueueProvider()), False)
    assert list(dynamic_provider._SERIALIZED) == [QueueProvider().__reduce__()]


def test_the_reserved_provider_key_is_refused_both_ways(dynamic_both_ways):
    for upstream in (True, False):
        errors = []

        def refused():
            try:
                Probe(Stateful("x"), "x", {"__provider": "mine"})
            except Exception as error:  # noqa: BLE001 - upstream raises a bare Exception
                errors.append(str(error))
            return pulumi.Output.from_input(None)

        dynamic_both_ways(refused, upstream)
        assert errors == ["A dynamic resource must not define the __provider key"], upstream


def test_the_monitor_ignores_only_the_order_of_dependencies():
    """Both requests' dependency URNs come from sets (RequestMonitor): their order is dropped,
    nothing else, so a different set still fails the comparisons above."""
    from pulumi.runtime.proto import resource_pb2

    urns = resource_pb2.RegisterResourceRequest.PropertyDependencies
    kept = []
    for kind, extra in ((resource_pb2.ReadResourceRequest, {}),
                        (resource_pb2.RegisterResourceRequest, {"propertyDependencies": {"p": urns(urns=["a", "b"])}}),
                        (resource_pb2.RegisterResourceRequest, {"propertyDependencies": {"p": urns(urns=["b", "a"])}})):
        for dependencies in (["u:b", "u:a"], ["u:a", "u:b"], ["u:a"]):
            monitor = RequestMonitor(ProgramMocks())
            monitor._keep(("t", "n", "p"), kind(type="t", name="n", dependencies=dependencies, **extra))
            kept.append(monitor.requests[("t", "n", "p")])
    for group in (kept[0:3], kept[3:6], kept[6:9]):
        assert group[0] == group[1] != group[2]
    assert kept[3:6] == kept[6:9]
    assert resource_pb2.ReadResourceRequest.FromString(kept[0]).dependencies == ["u:a", "u:b"]
