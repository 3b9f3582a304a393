"""components/kube.py registers Kubernetes objects without pulumi-kubernetes' generated classes; the
engine must not be able to tell. Each test registers the same things twice, once through the
generated classes (`kube.UPSTREAM = True`) and once through the light ones, and compares every
RegisterResourceRequest the monitor receives, serialized: type, name, parent, provider, inputs
(wire names, secrets), property dependencies, dependsOn, aliases, version, options, source position
and stack trace (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/resource.py `register_resource`)."""
from __future__ import annotations

import pulumi
import pulumi.runtime.settings
import pytest

from components import kube
from cloudstation_tools import render as render_module
from cloudstation_tools.mocks import ProgramMocks, RecordingMonitor
from tests import cloudstate_variants, promoted


class RequestMonitor(RecordingMonitor):
    """Keeps every RegisterResourceRequest and ReadResourceRequest as bytes, the set-valued fields
    sorted: the SDK builds `dependencies` (both requests) and each propertyDependencies entry from
    Python sets (pulumi 3.272.0 sdk/python/lib/pulumi/runtime/resource.py `prepare_resource`), and a
    dependency on a local component is one on each of its children, walked from
    `Resource._childResources`, a set of objects hashed by address (runtime/rpc.py
    `_add_dependency`): their order changes from run to run even through the generated classes, and
    carries no meaning."""

    def __init__(self, mocks: ProgramMocks):
        super().__init__(mocks)
        self.requests: dict[tuple[str, str, str], bytes] = {}

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        self._keep((request.type, request.name, request.parent), request)
        return response

    def ReadResource(self, request):
        # `Kind.get` of an existing object (external stores' credentials) is pulumi-kubernetes' own.
        response = super().ReadResource(request)
        self._keep(("read " + request.type, request.name, request.parent), request)
        return response

    def _keep(self, key, request):
        copy = type(request)()
        copy.CopyFrom(request)
        dependencies = sorted(copy.dependencies)
        del copy.dependencies[:]
        copy.dependencies.extend(dependencies)
        if hasattr(copy, "propertyDependencies"):  # RegisterResourceRequest only
            for entry in copy.propertyDependencies.values():
                urns = sorted(entry.urns)
                del entry.urns[:]
                entry.urns.extend(urns)
        assert key not in self.requests, key
        self.requests[key] = copy.SerializeToString(deterministic=True)


@pytest.fixture
def both_ways(monkeypatch):
    """`run(program)` -> {(type, name, parent): request bytes}, with upstream classes and without."""

    def run(program, upstream: bool) -> dict:
        monkeypatch.setattr(kube, "UPSTREAM", upstream)
        mocks = ProgramMocks()
        monitor = RequestMonitor(mocks)
        pulumi.runtime.settings.ROOT.set(None)
        pulumi.runtime.set_mocks(mocks, project="light", stack="unit", preview=False, monitor=monitor)
        pulumi.runtime.test(program)()
        return monitor.requests

    return run


def sample(name: str):
    """A value for input `name` of any kind: camelCase field names, as components write them
    (components/k8s.py), snake_case keys only in maps (labels, data) and unknown fields, which
    neither way translates."""
    values = {
        "metadata": {"name": "obj", "namespace": "ns", "labels": {"app_name": "x"}, "annotations": {"a": "b"}},
        "data": {"key_one": "value", "keyTwo": "value"},
        "string_data": {"plain_key": "text"},
        "binary_data": {"blob_key": "YQ=="},
        "immutable": True,
        "type": "Opaque",
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["x"]}],
        "role_ref": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}],
        "aggregation_rule": {"clusterRoleSelectors": [{"matchLabels": {"a": "b"}}]},
        "automount_service_account_token": False,
        "image_pull_secrets": [{"name": "pull"}],
        "secrets": [{"name": "s"}],
        "description": "why",
        "global_default": False,
        "preemption_policy": "Never",
        "value": 1000,
    }
    # spec: fields no kind has, so the generated classes' typed outputs accept it for every kind
    # (the stacks' real specs are compared in test_both_stacks_register_the_same_through_the_light_kinds)
    return values.get(name, {"someField": {"nested_key": 1, "nestedKey": [{"deep_key": "x"}]}, "other_field": "x"})


def kind_class(path: tuple[str, str, str]):
    module, version, kind = path
    return getattr(getattr(getattr(kube, module), version), kind)


def test_kube_stands_in_for_pulumi_kubernetes(monkeypatch):
    import pulumi_kubernetes

    assert kube.Provider is pulumi_kubernetes.Provider
    assert kube.apiextensions.CustomResource is pulumi_kubernetes.apiextensions.CustomResource
    assert kube.core.v1.Pod is pulumi_kubernetes.core.v1.Pod  # not in KINDS: the generated class
    assert issubclass(kube.apps.v1.Deployment, kube.KubernetesObject)
    assert kube.apps.v1.Deployment is kube.apps.v1.Deployment  # one class per kind (isinstance works)
    monkeypatch.setattr(kube, "UPSTREAM", True)
    assert kube.apps.v1.Deployment is pulumi_kubernetes.apps.v1.Deployment


def test_every_light_kind_registers_as_its_generated_class(both_ways):
    """Every input of every kind in KINDS set, under a parent, with a provider and options of
    every sort: the requests are byte-identical, and the wire names match the generated classes'."""
    from pulumi import _types

    def program():
        provider = pulumi_kubernetes_provider()
        parent = pulumi.ComponentResource("test:index:Parent", "parent")
        parent.register_outputs({})
        first = None
        for path, kind in kube.KINDS.items():
            inputs = {name: sample(name) for name in kind.inputs if name not in ("api_version", "kind")}
            opts = pulumi.ResourceOptions(
                parent=parent, provider=provider, depends_on=[first] if first else [], protect=True,
                ignore_changes=["spec"], delete_before_replace=False, retain_on_delete=True,
                custom_timeouts=pulumi.CustomTimeouts(create="1m"), aliases=[pulumi.Alias(name="old")],
                additional_secret_outputs=["metadata"])
            made = kind_class(path)(f"{path[2]}-x", opts=opts, **inputs)  # one call site: same source position
            first = first or made
        return pulumi.Output.from_input(None)

    upstream, light = both_ways(program, True), both_ways(program, False)
    assert len(upstream) == len(kube.KINDS) + 3  # the stack, the provider, the parent
    assert light.keys() == upstream.keys()
    for key, request in upstream.items():
        assert decoded(light[key]) == decoded(request), key
        assert light[key] == request, key

    for path, kind in kube.KINDS.items():
        init_args = getattr(__import__(f"pulumi_kubernetes.{path[0]}.{path[1]}", fromlist=["_"]), f"{path[2]}InitArgs")
        names = _types.input_type_py_to_pulumi_names(init_args)
        assert {name: kube.wire_name(name) for name in kind.inputs} == {name: names[name] for name in kind.inputs}, path


def decoded(request: bytes) -> dict:
    from google.protobuf.json_format import MessageToDict
    from pulumi.runtime.proto import resource_pb2

    return MessageToDict(resource_pb2.RegisterResourceRequest.FromString(request))


def pulumi_kubernetes_provider():
    return kube.Provider("k8s", enable_server_side_apply=True)


@pytest.mark.parametrize("path", [path for path, kind in kube.KINDS.items() if kind.required])
def test_a_missing_required_input_is_refused_both_ways(both_ways, path):
    for upstream in (True, False):
        errors = []

        def program():
            try:
                kind_class(path)("x", metadata={"name": "x"})
            except TypeError as error:
                errors.append(str(error))
            return pulumi.Output.from_input(None)

        both_ways(program, upstream)
        assert errors == [f"Missing required property '{kube.KINDS[path].required[0]}'"], (path, upstream)


def test_only_a_snake_case_field_name_would_differ(both_ways):
    """The generated classes translate a snake_case name of a field they know (`resource_names`
    inside a PolicyRule) to its wire name; the light kinds send keys as written. Components write
    wire names, and the stack tests below fail if one does not."""
    sent = {}

    def program():
        kind_class(("rbac", "v1", "Role"))("r", rules=[{"resource_names": ["x"], "verbs": ["get"]}])
        return pulumi.Output.from_input(None)

    for upstream in (True, False):
        requests = both_ways(program, upstream)
        sent[upstream] = decoded(requests[("kubernetes:rbac.authorization.k8s.io/v1:Role", "r", "urn:pulumi:unit::light::pulumi:pulumi:Stack::light-unit")])["object"]["rules"]
    assert sent == {True: [{"resourceNames": ["x"], "verbs": ["get"]}], False: [{"resource_names": ["x"], "verbs": ["get"]}]}


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


def test_unknown_inputs_are_refused():
    with pytest.raises(TypeError, match="unexpected keyword arguments: specs"):
        kube.apps.v1.Deployment("x", specs={})


RENDERS = {
    "test": lambda: render_module.render("test", stack_file=promoted.read("test")),
    "prod": lambda: render_module.render("prod", stack_file=promoted.read("prod")),
    # external stores: their credentials are read from existing Secrets (`Secret.get`)
    "non-owner": lambda: cloudstate_variants.variant.__wrapped__("non-owner"),  # not the cached render
    "owner-external-cassandra": lambda: cloudstate_variants.variant.__wrapped__("owner-external-cassandra"),
}


@pytest.mark.parametrize("stack", list(RENDERS))
def test_both_stacks_register_the_same_through_the_light_kinds(monkeypatch, stack):
    """The whole program, each stack file (and two variants that read existing Secrets): what the
    monitor receives is the same either way."""
    runs, light = {}, []
    original = kube._light
    monkeypatch.setattr(kube, "_light", lambda path: light.append(path) or original(path))
    for upstream in (True, False):
        monkeypatch.setattr(kube, "UPSTREAM", upstream)
        monitors: list[RequestMonitor] = []

        def monitor(mocks, monitors=monitors):
            monitors.append(RequestMonitor(mocks))
            return monitors[-1]

        monkeypatch.setattr(render_module, "RecordingMonitor", monitor)
        RENDERS[stack]()
        runs[upstream] = monitors[-1].requests
    assert light, "the program registered no object through components/kube.py"
    assert runs[False].keys() == runs[True].keys()
    for key, request in runs[True].items():
        assert runs[False][key] == request, key
