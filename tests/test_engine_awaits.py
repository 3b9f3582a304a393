"""What pulumi-kubernetes 4.34.2 waits for after each create and update, which mocks skip
(cloudstation_tools/engine.py): every awaited object can become ready from the objects in the Pulumi graph
alone, objects skip the await only where the graph cannot make them ready, and every Job is
replaced, not re-awaited, when it is not ready. Run on both stack files and on prod with a cluster
(and Armada) of its own."""
from __future__ import annotations

import dataclasses
import importlib.metadata
from pathlib import Path

import pulumi_kubernetes
import pytest

from cloudstation_tools import engine
from tests import stacks
from tests.conftest import ROOT

STACKS = ["test", "prod", stacks.OWN_CLUSTER]


@pytest.fixture(params=STACKS)
def graph(request, rendered_stacks) -> engine.Graph:
    rendered = rendered_stacks.get(request.param) or stacks.rendered(request.param)
    return engine.Graph(rendered.resources())


def test_every_awaited_object_can_become_ready_from_the_graph(graph):
    assert engine.await_problems(graph) == []


def test_the_model_awaits_every_workload_the_stack_deploys(graph):
    """Guards the check above against passing vacuously: each workload kind the provider awaits
    is seen as awaited unless it skips the await."""
    for obj in graph.objects:
        if obj.gvk in engine.AWAITERS and obj.kind in engine.WORKLOAD_KINDS:
            assert (engine.awaited(obj) is None) == engine.annotation_true(obj.inputs, engine.SKIP_AWAIT), obj.label()
    assert any(engine.awaited(o) for o in graph.objects)


def test_skip_await_only_where_the_graph_cannot_make_the_object_ready(graph):
    """skipAwait is for objects whose readiness something outside the graph decides (pods the
    CloudState operator makes); anywhere else it would hide a real failure until later."""
    skipping = [o for o in graph.objects if engine.annotation_true(o.inputs, engine.SKIP_AWAIT)]
    needless = [o.label() for o in skipping if not engine.readiness_problems(graph, _awaited_again(o))]
    assert needless == []


def test_every_job_is_replaced_when_it_is_not_ready(graph):
    jobs = [o for o in graph.objects if o.kind == "Job"]
    assert [j.label() for j in jobs if not engine.replace_unready(j)] == []


def test_replace_unready_is_what_the_installed_provider_documents():
    """The annotation's meaning is the pinned SDK's (generated from the provider's
    gen/additionalComments.go `replaceUnreadyComment`): the Job docstring names it."""
    assert importlib.metadata.version("pulumi-kubernetes") == engine.PULUMI_KUBERNETES
    assert f"pulumi-kubernetes=={engine.PULUMI_KUBERNETES}" in (ROOT / "requirements.txt").read_text()
    assert '"pulumi.com/replaceUnready": "true"' in _sdk_source("batch/v1", "Job")


def test_every_kind_the_installed_sdk_says_is_awaited_is_modelled():
    """The SDK's docstrings (provider gen/additionalComments.go `awaitComments`) list the kinds with
    await logic; the model must know each (it also knows DaemonSet and PVC, which they omit)."""
    documented = {
        f"{api_version}/{path.stem}"
        for api_version in ("apps/v1", "batch/v1", "v1", "networking.k8s.io/v1")
        for path in sorted(_sdk_dir(api_version).glob("[A-Z]*.py"))
        if not path.stem.endswith(("Patch", "List"))
        and "This resource waits until its status is ready" in _sdk_source(api_version, path.stem)
    }
    assert {"apps/v1/Deployment", "batch/v1/Job", "v1/Service"} <= documented
    assert documented <= set(engine.AWAITERS), documented - set(engine.AWAITERS)


def _sdk_dir(api_version: str) -> Path:
    group, _, version = api_version.rpartition("/")
    return Path(pulumi_kubernetes.__file__).parent / (group.split(".")[0] or "core") / version


def _sdk_source(api_version: str, kind: str) -> str:
    """The installed SDK's module of one kind (its docstrings come from the provider's schema)."""
    return (_sdk_dir(api_version) / f"{kind}.py").read_text(encoding="utf-8")


# --- the model on objects made for the purpose: each check fails when its fault is present ---------


def _object(kind: str, name: str, namespace: str = "ns", api: str = "v1", depends_on=(), annotations=None, **body):
    metadata = {"name": name, "namespace": namespace, **({"annotations": annotations} if annotations else {})}
    return {"urn": f"urn:pulumi:s::p::{kind}::{name}", "type": f"kubernetes:{api}:{kind}", "name": name,
            "custom": True, "dependsOn": list(depends_on), "options": {},
            "inputs": {"apiVersion": api.replace("core/", ""), "kind": kind, "metadata": metadata, **body}}


def _deployment(name: str, labels: dict, pod: dict | None = None, depends_on=()):
    return _object("Deployment", name, api="apps/v1", depends_on=depends_on, spec={
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i:1"}], **(pod or {})}},
    })


def _service(name: str, selector: dict, **spec):
    return _object("Service", name, api="core/v1", spec={"selector": selector, "ports": [{"port": 80}], **spec})


def _problems(*entries, cluster=engine.KIND_CLUSTER):
    return engine.await_problems(engine.Graph(entries), cluster)


def test_a_service_must_select_a_pod_template_in_the_graph():
    assert _problems(_deployment("web", {"app": "web"}), _service("web", {"app": "web"})) == []
    [problem] = _problems(_service("entity", {"cloudstate.io/statefulService": "cart"}))
    assert "matches no pod template in the graph" in problem
    assert _problems(_object("Service", "entity", api="core/v1", annotations={engine.SKIP_AWAIT: "true"},
                             spec={"selector": {"x": "y"}})) == []
    # Not awaited: headless, no selector; skipAwait must be exactly "true".
    assert _problems(_service("h", {"x": "y"}, clusterIP="None"), _service("n", {})) == []
    assert _problems(_object("Service", "e", api="core/v1", annotations={engine.SKIP_AWAIT: "True"},
                             spec={"selector": {"x": "y"}}))


def test_load_balancers_and_ingresses_wait_for_controllers_outside_the_graph():
    [problem] = _problems(_deployment("web", {"app": "web"}), _service("web", {"app": "web"}, type="LoadBalancer"))
    assert "load-balancer controller" in problem
    [problem] = _problems(_object("Ingress", "web", api="networking.k8s.io/v1", spec={}))
    assert "ingress controller" in problem


def test_a_workload_needs_what_its_pods_read_before_it_is_ready():
    pod = {"serviceAccountName": "web", "volumes": [{"name": "c", "configMap": {"name": "web-config"}}]}
    [missing_config, missing_account] = _problems(_deployment("web", {"app": "web"}, pod))
    assert "ServiceAccount ns/web" in missing_account and "ConfigMap ns/web-config" in missing_config
    deployment = _deployment("web", {"app": "web"}, pod)
    account = _object("ServiceAccount", "web")
    assert _problems(deployment, account, _object("ConfigMap", "web-config", data={})) == []
    # A ConfigMap made only once the Deployment is ready: the Deployment never gets ready.
    late = _object("ConfigMap", "web-config", depends_on=[deployment["urn"]], data={})
    [deadlock] = _problems(deployment, account, late)
    assert "deadlock" in deadlock


def test_a_claim_waits_for_its_consumer_only_when_its_binding_mode_is_unknown():
    claim = _object("PersistentVolumeClaim", "data", spec={"accessModes": ["ReadWriteOnce"]})
    consumer = _deployment("db", {"app": "db"}, {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
                           depends_on=[claim["urn"]])
    # kind's default class binds WaitForFirstConsumer: the provider accepts Pending (pvcBindMode).
    assert _problems(claim, consumer) == []
    # No class the provider can read: it waits for Bound, which needs the consumer it holds back.
    [deadlock] = _problems(claim, consumer, cluster=engine.Cluster(default_storage_class=None))
    assert "deadlock" in deadlock
    # A class in the graph decides (Immediate binds without a consumer).
    named = _object("PersistentVolumeClaim", "data", spec={"storageClassName": "fast"})
    fast = _object("StorageClass", "fast", namespace="", api="storage.k8s.io/v1", provisioner="x",
                   volumeBindingMode="Immediate")
    assert _problems(named, fast, consumer, cluster=engine.Cluster(default_storage_class=None)) == []


def test_wait_for_replaces_the_built_in_await():
    obj = engine.Resource.of(_object("StatefulService", "cart", api="cloudstate.io/v1alpha1",
                                     annotations={engine.WAIT_FOR: "condition=Ready"}))
    assert engine.awaited(obj) is not None
    assert engine.awaited(dataclasses.replace(obj, inputs={**obj.inputs, "metadata": {"name": "cart"}})) is None


def _awaited_again(obj: engine.Resource) -> engine.Resource:
    """`obj` without its skipAwait annotation."""
    annotations = {k: v for k, v in obj.annotations.items() if k != engine.SKIP_AWAIT}
    metadata = {**obj.meta, "annotations": annotations}
    return dataclasses.replace(obj, inputs={**obj.inputs, "metadata": metadata})

