"""Health and availability (issue 14 item 2): disruption budgets and node spreading for every
workload that runs more than one pod, leader election for a replicated Armada scheduler, no second
executor pod, and probes on the Armada ingesters.

Checked on the fixture stacks (tests/stacks/): the base pair, prod on a cluster of its own
(docs/armada.md's example, two server and Lookout pods) and `replicated`: the base test stack with two
pods of every Armada service (binoculars on), of the `cart` entity, and of the projects' store, a
managed Cassandra. Expectations are derived from the rendered objects: which workloads run more than one
pod, which pods a budget selects, which ports a container declares.
"""
from __future__ import annotations

import json

import pytest
import yaml
from pulumi_policy import StackValidationPolicy

from components.armada.auth import SCHEDULER_USER, scheduler_auth_file
from components.armada.config import CONFIG_FILE, env_overrides_existing_key
from components.armada.settings import ArmadaConfig
from components.project_environment import SERVICE_LABEL
from cloudstation_tools import checks, engine, render, validate
from infra import config as stack_config
from policy import rules
from tests import stacks, test_standards, unpinned
from tests.conftest import find, objects, standard_violations
from tests.test_armada_config import load
from tests.test_network_policies import API_SERVER, Address, cluster_of
from tests.test_policy import check_resource

ARMADA_SERVICES = stacks.REPLICATED_SERVICES
"""The keys of `platform.armada` whose `replicas` scale a service (every one but `executors`)."""
REPLICATED_ENTITY = stacks.REPLICATED_ENTITY
INGESTERS = ("armada-scheduler-ingester", "armada-lookout-ingester", "armada-event-ingester")
LEADER_CONFIG_FIELDS = {"mode", "leaselockname", "leaselocknamespace", "leaseduration", "renewdeadline", "retryperiod",
                        "podname", "leaderconnection"}
"""The fields of v0.22.7 `internal/leaderelection/leaderelection.go` Config (Viper matches keys in any case)."""
LEASE_VERBS = {"get", "create", "update"}
"""What client-go's LeaseLock does with its Lease (tools/leaderelection/resourcelock/leaselock.go)."""
JITTER_FACTOR = 1.2
"""client-go tools/leaderelection/leaderelection.go JitterFactor (NewLeaderElector's check)."""


def replicated_stack() -> render.StackFile:
    return stacks.stack_file(stacks.REPLICATED)


def replicated() -> render.Rendered:
    return stacks.rendered(stacks.REPLICATED)


def replicated_config() -> stack_config.StackConfig:
    return stacks.config(stacks.REPLICATED)


@pytest.fixture(params=["test", "prod", stacks.OWN_CLUSTER, "replicated"])
def any_stack(request) -> render.Rendered:
    return stacks.rendered(request.param)


# --- what runs more than one pod -----------------------------------------------------------------


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def pod_workloads(rendered) -> list[dict]:
    return [o for o in rendered.manifests() if o["kind"] in checks.POD_SPEC_KINDS and o["kind"] != "PodTemplate"]


def multi_pod_workloads(rendered) -> list[dict]:
    """Deployments and StatefulSets of the graph with more than one replica."""
    return [o for o in pod_workloads(rendered)
            if o["kind"] in ("Deployment", "StatefulSet") and o["spec"].get("replicas", 1) > 1]


def replicated_entities(rendered) -> dict[tuple[str, str], int]:
    """(namespace, StatefulService) -> replicas, for the operator-made entity Deployments scaled
    above one by their HorizontalPodAutoscaler (components/project_environment.py)."""
    found = {}
    for hpa in objects(rendered, "HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]["name"]
        if hpa["spec"]["minReplicas"] > 1 and target.endswith("-deployment"):
            found[(hpa["metadata"]["namespace"], target.removesuffix("-deployment"))] = hpa["spec"]["minReplicas"]
    return found


def selected_workloads(rendered, budget: dict) -> list[dict]:
    namespace = budget["metadata"]["namespace"]
    return [w for w in pod_workloads(rendered) if w["metadata"]["namespace"] == namespace
            and checks.selects(budget["spec"]["selector"], checks.pod_labels(w))]


def test_budgets_exist_exactly_for_the_workloads_of_more_than_one_pod(any_stack):
    budgets = objects(any_stack, "PodDisruptionBudget")
    covered, entities = [], []
    for budget in budgets:
        assert budget["apiVersion"] == "policy/v1"
        spec = budget["spec"]
        assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec, budget["metadata"]["name"]
        # A pod that is not Ready never blocks a drain.
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        selected = selected_workloads(any_stack, budget)
        if selected:
            # Exactly one workload's pods (not its Jobs', nor another service's), of more than one replica.
            assert len(selected) == 1, (budget["metadata"]["name"], [key(w) for w in selected])
            [workload] = selected
            assert spec["selector"] == workload["spec"]["selector"], key(workload)
            covered.append(key(workload))
        else:
            # Otherwise only the operator's pods of one entity, by the label the operator gives them.
            assert set(spec["selector"]) == {"matchLabels"}, budget
            [(label, service)] = spec["selector"]["matchLabels"].items()
            assert label == SERVICE_LABEL
            entities.append((budget["metadata"]["namespace"], service))
    assert sorted(covered) == sorted(key(w) for w in multi_pod_workloads(any_stack))
    assert sorted(entities) == sorted(replicated_entities(any_stack))


@pytest.mark.parametrize("pair", ["rendered_stacks", pytest.param("example_rendered", marks=pytest.mark.example_stacks)])
def test_the_example_stacks_keep_one_pod_of_everything(request, pair):
    # The example's cluster budgets (tests/test_cluster_fit.py, tests/test_armada_fit.py) are for one
    # pod of everything; the base fixture pair too (`replicated` is the fixture with more).
    for rendered in request.getfixturevalue(pair).values():
        assert multi_pod_workloads(rendered) == [] and replicated_entities(rendered) == {}
        assert objects(rendered, "PodDisruptionBudget") == []


def test_the_replicated_variant_replicates_what_it_says():
    rendered = replicated()
    armada = replicated_config().platform.armada
    namespace = armada.namespace
    deployments = {d["metadata"]["name"]: d for d in objects(rendered, "Deployment")
                   if d["metadata"]["namespace"] == namespace}
    # `armada.<service>.replicas` scales that service: every Armada Deployment but the executors'.
    for name, deployment in deployments.items():
        expected = 1 if name.startswith("armada-executor-") else 2
        if name.startswith("armada-") and name not in ("armada-postgres", "armada-redis", "armada-pulsar"):
            assert deployment["spec"]["replicas"] == expected, name
    assert {k: getattr(armada, _field(k)).replicas for k in ARMADA_SERVICES} == {k: 2 for k in ARMADA_SERVICES}
    # and the Cassandra StatefulSet of each project with a store (every project is on Cassandra there)
    stores = [p for p in replicated_config().projects if any(e.kind.needs_store for e in p.entities)]
    assert len(stores) > 1 and {p.store for p in stores} == {"cassandra"}
    assert len(multi_pod_workloads(rendered)) == len(ARMADA_SERVICES) + len(stores)
    assert list(replicated_entities(rendered).values()) == [2]
    # The registry runs one pod (filesystem storage on a ReadWriteOnce claim): no budget.
    assert all(w["spec"].get("replicas", 1) == 1 for w in pod_workloads(rendered) if "registry" in w["metadata"]["name"])


def _field(stack_key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in stack_key)


def test_replicated_workloads_prefer_different_nodes(any_stack):
    for workload in pod_workloads(any_stack):
        spec = checks.pod_spec(workload)
        if workload not in multi_pod_workloads(any_stack):
            assert "topologySpreadConstraints" not in spec, key(workload)
            continue
        [constraint] = spec["topologySpreadConstraints"]
        assert constraint["topologyKey"] == "kubernetes.io/hostname"
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node cluster still runs them all
        assert constraint["maxSkew"] == 1
        # Counts exactly the workload's own pods.
        assert constraint["labelSelector"] == workload["spec"]["selector"], key(workload)
        assert checks.selects(constraint["labelSelector"], checks.pod_labels(workload))
        if workload["kind"] == "Deployment":
            assert constraint["matchLabelKeys"] == ["pod-template-hash"]


def test_the_replicated_variant_meets_the_standards_and_validates():
    manifests = replicated().manifests()
    assert standard_violations(manifests) == []
    versions = [validate.SUPPORTED_VERSIONS[0], validate.SUPPORTED_VERSIONS[-1]]
    assert validate.validate_all([o for o in manifests if o["kind"] != "Secret"], versions=versions) == []
    assert checks.network_policy_violations(manifests) == []
    # The budgets and the Lease Role wait for their namespaces as everything else does.
    test_standards.test_every_namespaced_object_waits_for_its_namespace(replicated())


def test_the_replicated_variant_passes_the_policy_pack(monkeypatch):
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(replicated_stack().values))
    monkeypatch.setenv("PULUMI_STACK", "test")
    violations = [
        v for policy in rules.POLICIES if not isinstance(policy, StackValidationPolicy)
        for r in replicated().registrations for v in check_resource(policy, r.type, r.inputs, name=r.name)
    ]
    assert violations == []


def test_scaling_out_awaits_and_updates_in_place(rendered_stacks):
    before, after = engine.Graph(rendered_stacks["test"].resources()), engine.Graph(replicated().resources())
    assert engine.await_problems(after) == []
    changes = engine.changes(before, after)
    assert [p for change in changes for p in change.problems()] == []
    # The services' Deployments roll; none is replaced (their selectors stay).
    scaled = [c for c in changes if c.new.kind == "Deployment" and ("spec", "replicas") in c.paths]
    grown = {o.urn for o in after.objects if o.kind == "Deployment" and o.spec.get("replicas", 1) > 1
             and o.urn in before.by_urn}
    assert {c.new.urn for c in scaled} == grown and len(grown) >= len(ARMADA_SERVICES) - 1  # binoculars is new
    assert not any(c.replaced for c in scaled)


def test_a_budget_changes_in_place():
    # pulumi-kubernetes replaces only policy/v1beta1 budgets on a spec change (cloudstation_tools/engine.py FORCE_NEW).
    graph = engine.Graph(replicated().resources())
    [budget, *_] = [o for o in graph.objects if o.kind == "PodDisruptionBudget"]
    changed = engine.Resource(budget.urn, budget.type, budget.name, True, budget.depends_on, budget.options,
                              {**budget.inputs, "spec": {**budget.spec, "maxUnavailable": 2}})
    change = engine.diff(budget, changed)
    assert change.paths == [("spec", "maxUnavailable")] and not change.replaced and change.problems() == []


# --- the scheduler: leader election ----------------------------------------------------------------


def config_of(rendered) -> stack_config.StackConfig:
    return replicated_config() if rendered is replicated() else stacks.config_of(rendered)


def scheduler_objects(rendered) -> tuple[str, dict, dict]:
    namespace = config_of(rendered).platform.armada.namespace
    deployment = find(rendered, "Deployment", "armada-scheduler", namespace)
    config = yaml.safe_load(find(rendered, "ConfigMap", "armada-scheduler", namespace)["data"][CONFIG_FILE])
    return namespace, deployment, config


def test_one_scheduler_stays_standalone_and_recreates(rendered_stacks):
    namespace, deployment, config = scheduler_objects(rendered_stacks["test"])
    assert "leader" not in config  # the default file's `mode: standalone`
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert checks.pod_spec(deployment)["automountServiceAccountToken"] is False
    assert not [o for o in objects(rendered_stacks["test"], "Role") if o["metadata"]["namespace"] == namespace]


def test_replicated_schedulers_elect_a_leader_through_a_lease():
    rendered = replicated()
    namespace, deployment, config = scheduler_objects(rendered)
    leader = config["leader"]
    assert {k.lower() for k in leader} <= LEADER_CONFIG_FIELDS
    assert leader["mode"] == "kubernetes"
    assert leader["leaseLockNamespace"] == namespace and leader["leaseLockName"]
    seconds = {k: float(leader[k].removesuffix("s")) for k in ("leaseDuration", "renewDeadline", "retryPeriod")}
    assert seconds["leaseDuration"] > seconds["renewDeadline"] > JITTER_FACTOR * seconds["retryPeriod"]
    # Only the Lease holder schedules, so a rollout may overlap old and new pods.
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    [container] = checks.pod_spec(deployment)["containers"]
    # The identity comes from the downward API, and the URL a non-leader dials is built from it.
    [identity] = [e for e in container["env"] if e["name"] == "ARMADA_LEADER_PODNAME"]
    assert identity["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    grpc = {p["name"]: p["containerPort"] for p in container["ports"]}["grpc"]
    assert leader["leaderConnection"] == {"armadaUrl": f"[<name>]:{grpc}", "forceNoTls": True}
    assert config["grpc"]["port"] == grpc
    # The migration and pruning Jobs run no election and get no identity.
    for task in ("armada-scheduler-migration", "armada-scheduler-pruner"):
        task_object = next(o for o in rendered.manifests() if o["metadata"]["name"] == task)
        assert all(e["name"] != "ARMADA_LEADER_PODNAME" for c in checks.pod_spec(task_object)["containers"]
                   for e in c.get("env", []))
    # Viper applies the variable only to a key of the merged config: the override file has it.
    assert env_overrides_existing_key("ARMADA_LEADER_PODNAME", config)


def test_a_non_leader_logs_in_to_the_leader_as_the_scheduler_user():
    config = ArmadaConfig.model_validate({"scheduler": {"replicas": 2}})
    passwords = {name: f"pw-{name}" for name in ("cloudstation-server", SCHEDULER_USER, "cloudstation-executor-default")}
    document = scheduler_auth_file(config, passwords)
    assert document["leader"]["leaderConnection"]["basicAuth"] == {"username": SCHEDULER_USER,
                                                                   "password": passwords[SCHEDULER_USER]}
    # Accepted by the schedulers, in no group: scheduling reports need no permission.
    assert document["auth"]["basicAuth"]["users"][SCHEDULER_USER] == {"password": passwords[SCHEDULER_USER],
                                                                      "groups": []}
    single = scheduler_auth_file(ArmadaConfig(), passwords)
    assert "leader" not in single and SCHEDULER_USER not in single["auth"]["basicAuth"]["users"]


def test_lease_rbac_is_the_one_lease_in_the_armada_namespace_for_the_scheduler_only():
    rendered = replicated()
    namespace, deployment, config = scheduler_objects(rendered)
    lease = config["leader"]["leaseLockName"]
    account = checks.pod_spec(deployment)["serviceAccountName"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    bindings = [b for b in [*objects(rendered, "RoleBinding"), *objects(rendered, "ClusterRoleBinding")]
                if subject in b.get("subjects", [])]
    # Nothing cluster-wide: one RoleBinding, in the Armada namespace, to a Role there.
    [binding] = bindings
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"] == namespace
    assert binding["subjects"] == [subject]
    assert binding["roleRef"]["kind"] == "Role"
    role = find(rendered, "Role", binding["roleRef"]["name"], namespace)
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"], rule
        assert set(rule["verbs"]) <= LEASE_VERBS, rule
        # RBAC cannot name the object of a create; everything else is the one Lease.
        if set(rule["verbs"]) != {"create"}:
            assert rule["resourceNames"] == [lease], rule
    assert set().union(*(rule["verbs"] for rule in role["rules"])) == LEASE_VERBS
    # The pods start only once they may take the Lease.
    graph = engine.Graph(rendered.resources())
    pods = graph.find("Deployment", "armada-scheduler", namespace)
    assert graph.find("RoleBinding", binding["metadata"]["name"], namespace).urn in graph.waits_for(pods.urn)
    assert graph.find("Role", role["metadata"]["name"], namespace).urn in graph.waits_for(pods.urn)
    # Its token is mounted (the election calls the API server); no other Armada service gets one.
    assert checks.pod_spec(deployment)["automountServiceAccountToken"] is True


def test_replicated_schedulers_reach_the_api_server_and_each_other_only():
    rendered = replicated()
    namespace, deployment, config = scheduler_objects(rendered)
    cluster = cluster_of({"replicated": rendered})
    scheduler = cluster.pod(namespace, "armada-scheduler")
    api = replicated_config().platform.kubernetes_api
    for port in api.ports:
        assert cluster.allowed(scheduler, Address(API_SERVER), port)
    # A non-leader proxies scheduling reports to the leader's gRPC port, and to nothing else of its own.
    assert cluster.allowed(scheduler, scheduler, config["grpc"]["port"])
    assert not cluster.allowed(scheduler, scheduler, config["http"]["port"])
    # The ingesters and Lookout still may not call the scheduler.
    for other in ("armada-lookout", "armada-event-ingester"):
        assert not cluster.allowed(cluster.pod(namespace, other), scheduler, config["grpc"]["port"]), other


def test_a_second_executor_pod_is_refused_naming_the_key():
    with pytest.raises(stack_config.ConfigError) as error:
        load({"executors": [{"name": "a"}, {"name": "b", "replicas": 2}]})
    message = str(error.value)
    assert "cloudstation:platform.armada.executors[1].replicas: 2" in message
    assert "must be 1" in message and "executors" in message.split("must be 1", 1)[1]


@pytest.mark.parametrize("armada, where", [
    ({"scheduler": {"replicas": 4}}, "cloudstation:platform.armada.scheduler.replicas: 4"),
    ({"server": {"replicas": 0}}, "cloudstation:platform.armada.server.replicas: 0"),
    ({"scheduler": {"replicas": 2, "extra": {"leader": {"mode": "standalone"}}}},
     "cloudstation:platform.armada.scheduler.extra.leader"),
])
def test_replica_counts_outside_the_bounds_are_refused(armada, where):
    with pytest.raises(stack_config.ConfigError) as error:
        load(armada)
    assert where in str(error.value)


# --- the ingesters' probes -------------------------------------------------------------------------


def test_ingesters_are_probed_on_the_metrics_port_they_declare_and_serve(any_stack):
    armada = config_of(any_stack).platform.armada
    if not armada.enabled:  # the repo's prod stack: the cluster's one Armada is test's
        assert not [d for d in objects(any_stack, "Deployment") if d["metadata"]["name"] in INGESTERS]
        return
    namespace = armada.namespace
    for name in INGESTERS:
        deployment = find(any_stack, "Deployment", name, namespace)
        [container] = checks.pod_spec(deployment)["containers"]
        declared = {p["name"]: p["containerPort"] for p in container["ports"]}
        config = yaml.safe_load(find(any_stack, "ConfigMap", name, namespace)["data"][CONFIG_FILE])
        for probe in ("readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            # The only listener of an ingester (v0.22.7 internal/common/startup.go ServeMetricsFor).
            assert get["path"] == "/metrics", (name, probe)
            assert get["port"] in declared, (name, probe)
            assert declared[get["port"]] == config["metricsPort"], (name, probe)
