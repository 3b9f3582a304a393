"""Worker clusters (issue 14 item 5): a main stack whose scheduler serves executors of other
clusters (`armada.workers`, `armada.executorApi`) and a worker stack that runs only an executor
(`armada.mode: executor-only`), rendered as a pair from docs/armada.md's two examples, and the
wiring across them checked on the rendered objects: address, TLS, credentials, pool, cluster id.

Every expectation is read from the two stack files or from the other stack's rendered objects,
never written down here: the worker must dial what the main exposes, authenticate as a user the
main's scheduler has, with the group it grants `execute_jobs`, in a pool it schedules.
"""
from __future__ import annotations

import json

import pytest
import yaml

from cloudstation_tools import checks, render, validate
from cloudstation_tools.mocks import is_wrapped_secret
from components.armada import config as ac
from components.armada.settings import EXECUTOR_PASSWORD_KEY
from infra import armada_workers, config as stack_config
from tests import unpinned
from tests.conftest import ROOT, find, objects, standard_violations
from tests.test_armada_config import default_keys
from tests import stacks

ARMADA_DOC = ROOT / "docs" / "armada.md"
MAIN_EXAMPLE = stacks.MAIN_EXAMPLE
WORKER_EXAMPLE = stacks.WORKER_EXAMPLE
WORKER_STACK = stacks.WORKER
PLATFORM = stacks.PLATFORM


def example(first_line: str) -> dict:
    """The docs/armada.md YAML block that starts with `first_line`: stack-file keys and values."""
    return stacks.doc_example(first_line)


def main_values() -> tuple[dict, list[str]]:
    """The base test stack with the main example's keys added to its `platform.armada` section, as
    the docs say (the fixture `workers-main`, tests/stacks/); the engine's view (JSON strings, fake
    secure values)."""
    stack_file = stacks.stack_file(stacks.WORKERS_MAIN)
    return stack_file.values, list(stack_file.secret_keys)


def worker_values(document: dict | None = None) -> tuple[dict, list[str]]:
    """The worker example as its own stack file (the fixture `gpu`), read as the engine passes it; its
    executor's pin has no digest record yet: a lab cluster's opt-out (tests/stacks/ `worker_document`)."""
    stack_file = (stacks.stack_file(stacks.WORKER) if document is None
                  else stacks.as_stack_file(stacks.worker_document(document)))
    return stack_file.values, list(stack_file.secret_keys)


def pair() -> tuple[render.Rendered, render.Rendered]:
    return stacks.rendered(stacks.WORKERS_MAIN), stacks.rendered(stacks.WORKER)


def configs() -> tuple[stack_config.StackConfig, stack_config.StackConfig]:
    return stacks.config(stacks.WORKERS_MAIN), stacks.config(stacks.WORKER)


def armada_config(rendered: render.Rendered, name: str) -> dict:
    """The override file of an Armada service as its ConfigMap holds it."""
    return yaml.safe_load(find(rendered, "ConfigMap", name)["data"][ac.CONFIG_FILE])


def plain(value):
    """`value` with every secret marker of the mocks' registrations removed."""
    if is_wrapped_secret(value):
        return plain(value["value"])
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return [plain(item) for item in value] if isinstance(value, list) else value


def secret_data(rendered: render.Rendered, name: str) -> dict:
    """A Secret's stringData as registered (the manifests redact secret values)."""
    [inputs] = [plain(r.inputs) for r in rendered.of_type("kubernetes:core/v1:Secret")
                if r.inputs["metadata"]["name"] == name]
    return inputs["stringData"]


def auth_file(rendered: render.Rendered, name: str) -> dict:
    """The credentials file a service's pods mount (the Secret its Deployment names)."""
    spec = find(rendered, "Deployment", name)["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "auth"]
    return yaml.safe_load(secret_data(rendered, volume["secret"]["secretName"])["auth.yaml"])


def pod(rendered: render.Rendered, name: str) -> dict:
    return find(rendered, "Deployment", name)["spec"]["template"]["spec"]


def the_worker_executor(worker: render.Rendered) -> str:
    [deployment] = objects(worker, "Deployment")
    return deployment["metadata"]["name"]


# --- the wiring across the pair -------------------------------------------------------------------


def test_the_worker_dials_the_address_the_main_exposes_with_tls():
    main, worker = pair()
    main_config, worker_config = configs()
    api = main_config.platform.armada.executor_api
    exposed = find(main, "Service", "armada-scheduler-executors")
    [port] = exposed["spec"]["ports"]
    connection = armada_config(worker, the_worker_executor(worker))["executorApiConnection"]
    assert connection["armadaUrl"] == f"{api.host}:{port['port']}"
    assert connection["forceNoTls"] is False
    assert worker_config.platform.armada.remote_scheduler.address == connection["armadaUrl"]
    # The Service reaches the scheduler's gRPC port, which serves TLS with the Secret's certificate.
    assert exposed["spec"]["type"] == api.service_type
    assert exposed["spec"]["externalTrafficPolicy"] == "Local"  # the NetworkPolicy sees the workers' addresses
    scheduler = find(main, "Deployment", "armada-scheduler")["spec"]["template"]
    assert exposed["spec"]["selector"].items() <= scheduler["metadata"]["labels"].items()
    [container] = scheduler["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == \
        armada_config(main, "armada-scheduler")["grpc"]["port"]
    tls = armada_config(main, "armada-scheduler")["grpc"]["tls"]
    assert tls["enabled"] is True
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    [volume] = [v for v in scheduler["spec"]["volumes"] if v.get("secret", {}).get("secretName") == api.tls_secret]
    files = {f"{mounts[volume['name']]}/{item['path']}" for item in volume["secret"]["items"]}
    assert {tls["certPath"], tls["keyPath"]} <= files


def test_the_worker_trusts_only_the_ca_it_was_given():
    _, worker = pair()
    _, worker_config = configs()
    spec = pod(worker, the_worker_executor(worker))
    [container] = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    directory, _, file = env["SSL_CERT_FILE"].rpartition("/")
    assert env["SSL_CERT_DIR"] == directory  # nothing else: Go reads only these (crypto/x509 root_unix.go)
    [volume] = [v for v in spec["volumes"] if v["name"] == mounts[directory]]
    [item] = volume["configMap"]["items"]
    assert item["path"] == file
    ca = find(worker, "ConfigMap", volume["configMap"]["name"])
    assert ca["data"][item["key"]] == worker_config.platform.armada.remote_scheduler.ca_certificate


def test_the_main_stacks_own_clients_trust_the_ca_of_the_scheduler_certificate():
    main, _ = pair()
    main_config, _ = configs()
    secret = main_config.platform.armada.executor_api.tls_secret
    callers = {"armada-server": ("schedulerApiConnection",)}
    callers.update({f"armada-executor-{e.name}": ("executorApiConnection",) for e in main_config.platform.armada.executors})
    for name, (connection,) in callers.items():
        assert armada_config(main, name)[connection]["forceNoTls"] is False, name
        spec = pod(main, name)
        [container] = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "SSL_CERT_DIR" not in env, name  # keeps the public roots for its other connections
        directory, _, file = env["SSL_CERT_FILE"].rpartition("/")
        [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"]["secretName"] == secret
        assert volume["secret"]["items"] == [{"key": "ca.crt", "path": file}]


def test_the_worker_authenticates_as_a_user_the_main_scheduler_lets_execute_jobs():
    main, worker = pair()
    main_config, worker_config = configs()
    basic = auth_file(worker, the_worker_executor(worker))["executorApiConnection"]["basicAuth"]
    # The password is the worker stack's secret config key, and nothing else.
    assert basic["password"] == worker_values()[0][f"cloudstation:{EXECUTOR_PASSWORD_KEY}"]
    scheduler = auth_file(main, "armada-scheduler")
    users = scheduler["auth"]["basicAuth"]["users"]
    assert basic["username"] in users
    groups = set(users[basic["username"]]["groups"])
    mapping = armada_config(main, "armada-scheduler")["auth"]["permissionGroupMapping"]
    assert groups & set(mapping["execute_jobs"])
    # What the user copies into the worker stack: the main's Secret for that worker.
    [declared] = [w for w in main_config.platform.armada.workers
                  if w.name == worker_config.platform.armada.executors[0].name]
    handed = secret_data(main, f"armada-worker-{declared.name}")
    assert handed["username"] == basic["username"]
    assert handed["password"] == users[basic["username"]]["password"]
    # Its group is exactly the local executors' (no more rights than an executor has).
    local = auth_file(main, f"armada-executor-{main_config.platform.armada.executors[0].name}")
    assert set(users[local["executorApiConnection"]["basicAuth"]["username"]]["groups"]) == groups


def test_the_worker_pool_is_scheduled_and_cluster_ids_are_distinct():
    main, worker = pair()
    main_config, _ = configs()
    application = armada_config(worker, the_worker_executor(worker))["application"]
    pools = [p["name"] for p in armada_config(main, "armada-scheduler")["scheduling"]["pools"]]
    assert application["pool"] in pools
    local_ids = [armada_config(main, f"armada-executor-{e.name}")["application"]["clusterId"]
                 for e in main_config.platform.armada.executors]
    assert application["clusterId"] not in local_ids
    # ... and it is the id and pool the main stack declared for it.
    declared = main.outputs["armadaWorkers"]
    assert {(w["clusterId"], w["pool"]) for w in declared.values()} == {(application["clusterId"], application["pool"])}


def test_only_the_workers_cidrs_reach_the_exposed_port():
    main, worker = pair()
    main_config, worker_config = configs()
    policy = find(main, "NetworkPolicy", "armada-scheduler-executors")
    [rule] = policy["spec"]["ingress"]
    expected = {str(c) for w in main_config.platform.armada.workers for c in w.cidrs}
    assert {p["ipBlock"]["cidr"] for p in rule["from"]} == expected
    assert all(set(p) == {"ipBlock"} for p in rule["from"])
    assert [p["port"] for p in rule["ports"]] == [armada_config(main, "armada-scheduler")["grpc"]["port"]]
    assert set(find(main, "Service", "armada-scheduler-executors")["spec"]["loadBalancerSourceRanges"]) == expected
    # The worker's executor may connect to the main scheduler's addresses on its port only.
    remote = worker_config.platform.armada.remote_scheduler
    rules = find(worker, "NetworkPolicy", the_worker_executor(worker))["spec"]["egress"]
    [to_scheduler] = [r for r in rules if any(p["port"] == remote.port for p in r["ports"])]
    assert {p["ipBlock"]["cidr"] for p in to_scheduler["to"]} == {str(c) for c in remote.cidrs}


WORKER_KINDS = {
    "Namespace", "NetworkPolicy", "ServiceAccount", "ConfigMap", "Secret", "Deployment", "Service",
    "PriorityClass", "ClusterRole", "ClusterRoleBinding", "RoleBinding", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def test_the_worker_runs_nothing_but_its_executor():
    main, worker = pair()
    _, worker_config = configs()
    armada = worker_config.platform.armada
    assert {o["kind"] for o in objects(worker)} <= WORKER_KINDS
    assert [d["metadata"]["name"] for d in objects(worker, "Deployment")] == \
        [f"armada-executor-{worker_config.platform.armada.executors[0].name}"]
    assert [name for name, _ in checks.workloads(objects(worker))] == [f"Deployment {armada.namespace}/{the_worker_executor(worker)}"]
    assert {s["metadata"]["name"] for s in objects(worker, "Service")} == {the_worker_executor(worker)}
    namespaces = {n["metadata"]["name"] for n in objects(worker, "Namespace")}
    assert namespaces == {armada.namespace, *armada.job_namespaces}
    # The job pods' PriorityClasses are the main scheduler's classes.
    classes = armada_config(main, "armada-scheduler")["scheduling"]["priorityClasses"]
    assert {p["metadata"]["name"]: p["value"] for p in objects(worker, "PriorityClass")} == \
        {name: c["priority"] for name, c in classes.items()}
    assert not [r for r in worker.registrations if r.type.startswith("pulumi-python:dynamic")]


@pytest.mark.parametrize("which", ["main", "worker"])
def test_the_pair_validates_strictly_and_meets_the_standards(which):
    rendered = dict(zip(["main", "worker"], pair()))[which]
    manifests = rendered.manifests()
    assert validate.validate_all(manifests) == []
    assert standard_violations(manifests) == []  # PSS restricted, requests and limits, pinned images
    assert [p for kind in ("Deployment",) for o in objects(rendered, kind)
            for p in checks.probe_violations(o["metadata"]["name"], o["spec"]["template"]["spec"], kind)] == []
    assert checks.network_policy_violations(manifests) == []  # every rule names its peers
    assert [p for c in objects(rendered, "ConfigMap")
            for p in checks.configmap_violations(c["metadata"]["name"], c)] == []


def test_generated_keys_are_armadas_own():
    """The worker's executor writes only keys of the executor's default file; the main
    scheduler's TLS adds `grpc.tls.certPath`/`keyPath`, absent from the default file (which has
    only `grpc.tls.enabled`) but fields of its TlsConfig (v0.22.7 internal/common/grpc/
    configuration/types.go) that upstream Helm sets (deployment/scheduler/values.yaml)."""
    main, worker = pair()
    executor = armada_config(worker, the_worker_executor(worker))
    assert sorted(p for p in ac.key_paths(executor) if p not in ac.key_paths(default_keys("executor"))) == []
    known = ac.key_paths(default_keys("scheduler"))
    scheduler = armada_config(main, "armada-scheduler")
    unknown = {p for p in ac.key_paths(scheduler) if p not in known and p[0] != "auth"}
    assert unknown == {("grpc", "tls", "certPath"), ("grpc", "tls", "keyPath")}
    assert ("grpc", "tls", "enabled") in known


# --- refusals -------------------------------------------------------------------------------------


def refused(values: dict, secret_keys: list[str]) -> str:
    with pytest.raises(stack_config.ConfigError) as error:
        stacks.load(values, secret_keys=secret_keys)
    return str(error.value)


def worker_with(change) -> tuple[dict, list[str]]:
    document = example(WORKER_EXAMPLE)
    change(document)
    return worker_values(document)


def main_with(change) -> tuple[dict, list[str]]:
    values, secret_keys = main_values()
    platform = json.loads(values[PLATFORM])
    change(platform["armada"])
    values[PLATFORM] = json.dumps(platform)
    return values, secret_keys


def test_a_worker_refuses_what_it_does_not_run():
    message = refused(*worker_with(lambda d: d[PLATFORM]["armada"].update(postgres={"mode": "managed"})))
    assert "cloudstation:platform.armada.postgres:" in message and "only allowed when mode is 'full'" in message
    message = refused(*worker_with(lambda d: d[PLATFORM].update(registry={"mode": "managed"})))
    assert "cloudstation:platform.registry:" in message and "runs no registry" in message
    message = refused(*worker_with(lambda d: d[PLATFORM]["armada"]["executors"].append({"name": "more"})))
    assert "cloudstation:platform.armada.executors:" in message and "exactly one executor" in message
    message = refused(*worker_with(lambda d: d[PLATFORM]["armada"].pop("remoteScheduler")))
    assert "cloudstation:platform.armada.remoteScheduler: (not set) — required when mode is 'executor-only'" in message


def test_a_worker_never_sends_its_password_in_plaintext():
    def no_tls(document):
        document[PLATFORM]["armada"]["executors"][0]["extra"] = {"executorApiConnection": {"ForceNoTLS": "true"}}
    message = refused(*worker_with(no_tls))
    assert "cloudstation:platform.armada.executors[0].extra.executorApiConnection.ForceNoTLS: 'true'" in message
    message = refused(*worker_with(lambda d: d[PLATFORM]["armada"]["remoteScheduler"].update(address="localhost:50052")))
    assert "remoteScheduler.address: 'localhost:50052'" in message and "never uses TLS" in message
    # Without the password as a secret, the stack says which command sets it.
    values, _ = worker_values()
    message = refused(values, [])
    assert f"pulumi config set --secret cloudstation:{EXECUTOR_PASSWORD_KEY}" in message


def test_the_main_stack_refuses_inconsistent_workers():
    message = refused(*main_with(lambda a: a.pop("executorApi")))
    assert "cloudstation:platform.armada.executorApi: (not set) — workers reach the scheduler" in message
    message = refused(*main_with(lambda a: a["workers"][0].update(name=a["executors"][0]["name"], clusterId="x")))
    assert "cloudstation:platform.armada.workers[0].name:" in message and "unique across executors and workers" in message
    message = refused(*main_with(lambda a: a["workers"][0].update(clusterId=a["executors"][0]["name"])))
    assert "cloudstation:platform.armada.workers[0].clusterId:" in message and "already executors[0]'s" in message
    message = refused(*main_with(lambda a: a["workers"][0].update(cidrs=["0.0.0.0/0"])))
    assert "cloudstation:platform.armada.workers[0].cidrs" in message and "matches every address" in message
    message = refused(*main_with(lambda a: a.update(scheduler={**a.get("scheduler", {}), "replicas": 2})))
    assert "cloudstation:platform.armada.scheduler.replicas: 2 — with armada.workers" in message
    message = refused(*main_with(lambda a: a.update(server={"extra": {"schedulerApiConnection": {"forceNoTls": True}}})))
    assert "cloudstation:platform.armada.server.extra.schedulerApiConnection.forceNoTls: true" in message
    message = refused(*main_with(lambda a: a.update(remoteScheduler={"address": "x.example.com:50052",
                                                                     "allowAnyAddress": True})))
    assert "cloudstation:platform.armada.remoteScheduler:" in message and "only allowed when mode is 'executor-only'" in message


def test_a_full_stack_still_needs_projects():
    values, secret_keys = stacks.read("test").values, stacks.read("test").secret_keys
    values = {**values, "cloudstation:projects": "[]"}
    assert "cloudstation:projects: [] — list should have at least 1 item" in refused(values, secret_keys)
    assert "cloudstation:projects: missing — this key is required" in refused(
        {k: v for k, v in values.items() if k != "cloudstation:projects"}, secret_keys)


# --- the worker stack checked against its main stack's file -----------------------------------------


def worker_config_with(change=None, root=None, stack_dir=None) -> stack_config.StackConfig:
    document = example(WORKER_EXAMPLE)
    if change is not None:
        change(document)
    values, secret_keys = worker_values(document)
    return stack_config.load(values, secret_keys=secret_keys, root=root, stack_dir=stack_dir)


def test_the_pair_agrees_and_each_disagreement_is_named():
    main_config, worker_config = configs()
    assert armada_workers.mismatches(worker_config, main_config, "Pulumi.test.yaml") == []
    armada = lambda d: d[PLATFORM]["armada"]  # noqa: E731
    cases = {
        "executors[0].pool: 'default' — Pulumi.test.yaml declares pool 'gpu'":
            lambda d: armada(d)["executors"][0].update(pool="default"),
        "executors[0].clusterId: 'gpu-2' — Pulumi.test.yaml declares cluster id 'gpu-cluster'":
            lambda d: armada(d)["executors"][0].update(clusterId="gpu-2"),
        "executors[0].name: 'tpu' — Pulumi.test.yaml declares no such worker":
            lambda d: armada(d)["executors"][0].update(name="tpu"),
        "remoteScheduler.address: '198.51.100.10:50052' — Pulumi.test.yaml exposes its scheduler as executorApi.host":
            lambda d: armada(d)["remoteScheduler"].update(address="198.51.100.10:50052"),
        "remoteScheduler.address: 'armada-executors.example.com:443' — Pulumi.test.yaml's LoadBalancer listens on port":
            lambda d: armada(d)["remoteScheduler"].update(address="armada-executors.example.com:443"),
        "priorityClasses: {\"armada-default\": 10} — differs from Pulumi.test.yaml's":
            lambda d: armada(d).update(priorityClasses={"armada-default": {"priority": 10, "preemptible": False}}),
    }
    for expected, change in cases.items():
        found = armada_workers.mismatches(worker_config_with(change), main_config, "Pulumi.test.yaml")
        assert len(found) == 1 and f"cloudstation:platform.armada.{expected}" in found[0], (expected, found)


def test_main_stack_names_a_stack_file_beside_this_one(tmp_path):
    main_file = {k: json.loads(v) if v[:1] in "[{" else v for k, v in main_values()[0].items()}
    (tmp_path / "Pulumi.test.yaml").write_text(yaml.safe_dump({"config": main_file}))
    with_main = lambda d: d[PLATFORM]["armada"]["remoteScheduler"].update(mainStack="test")  # noqa: E731
    assert armada_workers.problems(worker_config_with(with_main), tmp_path) == []

    def wrong_pool(document):
        with_main(document)
        document[PLATFORM]["armada"]["executors"][0]["pool"] = "default"
    [found] = armada_workers.problems(worker_config_with(wrong_pool), tmp_path)
    assert found.startswith("cloudstation:platform.armada.executors[0].pool: 'default'")
    # The program's own load runs the check (with the repository root, as the program does; the
    # stack files beside it are the fixtures').
    with pytest.raises(stack_config.ConfigError, match=r"remoteScheduler.mainStack: 'elsewhere' — no stack file"):
        worker_config_with(lambda d: d[PLATFORM]["armada"]["remoteScheduler"].update(mainStack="elsewhere"), root=ROOT,
                           stack_dir=stacks.DIR)
