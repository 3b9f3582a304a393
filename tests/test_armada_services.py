"""Armada on the rendered graph of every stack that runs one (the test stack file, and prod on a
cluster of its own: tests/stacks/) and of one more variant: services, wiring read back
from the rendered ConfigMaps, start order, pruning, cluster prerequisites and outputs. The prod
stack file shares the test stack's cluster and so runs no Armada (one per cluster)."""
from __future__ import annotations

import json

import pytest
import yaml

from components.armada.auth import AUTH_PATH
from components.armada.config import CONFIG_FILE, CONFIG_PATH, key_paths
from components.armada.service import checksum
from components import network
from cloudstation_tools import checks, validate
from infra.versions import ARMADA, IMAGES, tag_of
from tests import unpinned
from tests.stacks import OWN_CLUSTER, config_of, rendered as armada_variant
from tests.conftest import find, objects, pod_spec, standard_violations
from tests.test_armada_config import allowed_absent, default_keys
from tests import stacks

SERVICES = {
    # Deployment name -> image key in infra/versions.py
    "armada-server": "armada-server",
    "armada-scheduler": "armada-scheduler",
    "armada-scheduler-ingester": "armada-scheduler-ingester",
    "armada-lookout": "armada-lookout",
    "armada-lookout-ingester": "armada-lookout-ingester",
    "armada-event-ingester": "armada-event-ingester",
}
WITH_HEALTH = {"armada-server", "armada-scheduler", "armada-lookout", "armada-binoculars"}
WITH_CREDENTIALS = {"armada-server", "armada-scheduler", "armada-binoculars"}
"""Besides every executor: the services that authenticate callers or call another with a password."""


@pytest.fixture
def rendered(armada_rendered):
    """In this module, `rendered` is each stack that runs an Armada (conftest's `armada_rendered`)."""
    return armada_rendered


def namespace_of(rendered) -> str:
    return rendered.outputs["armadaNamespace"]


def armada_objects(rendered) -> list[dict]:
    namespace = namespace_of(rendered)
    return [
        o for o in rendered.manifests()
        if o["metadata"].get("namespace") == namespace
        or (o["kind"] in ("PriorityClass", "ClusterRole", "ClusterRoleBinding") and "armada" in o["metadata"]["name"])
    ]


def deployments(rendered) -> dict[str, dict]:
    """The Armada services' Deployments (dependencies run as StatefulSets; monitoring's store
    exporters, components/exporters.py, are Deployments of another component)."""
    return {o["metadata"]["name"]: o for o in armada_objects(rendered)
            if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "armada"}


def executors(rendered) -> list[str]:
    return [name for name in deployments(rendered) if name.startswith("armada-executor-")]


def service_config(rendered, name: str) -> dict:
    config_map = find(rendered, "ConfigMap", name, namespace_of(rendered))
    return yaml.safe_load(config_map["data"][CONFIG_FILE])


def registration(rendered, type_: str, name: str):
    [match] = [r for r in rendered.registrations if r.type == type_ and r.name == name]
    return match


def depends_on(rendered, type_: str, name: str, on_type: str, on_name: str) -> bool:
    return registration(rendered, on_type, on_name).urn in registration(rendered, type_, name).dependencies


# --- the services ----------------------------------------------------------------------------


def test_every_service_runs_its_pinned_image_with_its_config(rendered):
    found = deployments(rendered)
    assert set(SERVICES) | set(executors(rendered)) == set(found)
    assert executors(rendered), "at least one executor"
    for name, deployment in found.items():
        key = SERVICES.get(name, "armada-executor")
        [container] = pod_spec(deployment)["containers"]
        assert container["image"] == IMAGES[key] and tag_of(container["image"]) == ARMADA, name
        expected_args = ["run", "--config", CONFIG_PATH] if name == "armada-scheduler" else ["--config", CONFIG_PATH]
        if name in WITH_CREDENTIALS or name.startswith("armada-executor-"):
            expected_args += ["--config", AUTH_PATH]  # the credentials file, merged over the config
        assert container["args"] == expected_args, name
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        assert volumes["config"]["configMap"]["name"] == name
        assert {"name": "config", "mountPath": "/config", "readOnly": True} in container["volumeMounts"]


def test_pods_roll_when_their_config_changes(rendered):
    for name, deployment in deployments(rendered).items():
        text = find(rendered, "ConfigMap", name, namespace_of(rendered))["data"][CONFIG_FILE]
        annotation = deployment["spec"]["template"]["metadata"]["annotations"]["cloudstation.io/config-checksum"]
        assert annotation == checksum(text), name


def test_each_service_has_its_own_service_account(rendered):
    accounts = {o["metadata"]["name"] for o in objects(rendered, "ServiceAccount")}
    for name, deployment in deployments(rendered).items():
        assert pod_spec(deployment)["serviceAccountName"] == name
        assert name in accounts
    # Only the executor needs a Kubernetes API token.
    tokens = {n for n, d in deployments(rendered).items() if pod_spec(d)["automountServiceAccountToken"]}
    assert tokens == set(executors(rendered))


def test_no_service_link_env_that_armada_would_read_as_config(rendered):
    for name, spec in checks.workloads(armada_objects(rendered)):
        if any(c["image"].startswith("docker.io/gresearch/") for c in spec["containers"]):
            assert spec["enableServiceLinks"] is False, name


def test_probes_on_health_or_on_metrics_where_there_is_no_health_endpoint(rendered):
    for name, deployment in deployments(rendered).items():
        [container] = pod_spec(deployment)["containers"]
        has_health = name in WITH_HEALTH or name.startswith("armada-executor-")
        # The ingesters serve only /metrics (tests/test_availability.py checks the port and source).
        expected = {"path": "/health", "port": "http"} if has_health else {"path": "/metrics", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == expected, name
        assert container["livenessProbe"]["httpGet"] == expected, name


def test_services_expose_the_ports_the_containers_and_configs_use(rendered):
    namespace = namespace_of(rendered)
    for name, deployment in deployments(rendered).items():
        [container] = pod_spec(deployment)["containers"]
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        services = [o for o in objects(rendered, "Service") if o["metadata"]["name"] == name]
        if name in ("armada-scheduler-ingester", "armada-lookout-ingester", "armada-event-ingester"):
            assert services == []
            assert set(container_ports) == {"metrics"}
            assert service_config(rendered, name)["metricsPort"] == container_ports["metrics"]
            continue
        [svc] = services
        assert svc["metadata"]["namespace"] == namespace
        assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == container_ports
        assert all(p["targetPort"] == p["name"] for p in svc["spec"]["ports"])
    server = service_config(rendered, "armada-server")
    assert (server["grpcPort"], server["httpPort"]) == (50051, 8080)
    assert service_config(rendered, "armada-scheduler")["grpc"]["port"] == 50052
    assert service_config(rendered, "armada-lookout")["apiPort"] == 10000


def test_workloads_meet_the_standard_and_validate(rendered):
    mine = armada_objects(rendered)
    assert standard_violations(mine) == []
    # Secrets are the dependency components' (and redacted here); everything else must validate.
    assert validate.validate_all([o for o in mine if o["kind"] != "Secret"]) == []


def test_armada_pods_run_as_the_image_user_with_a_read_only_root(rendered):
    for name, spec in checks.workloads(armada_objects(rendered)):
        if not any(c["image"].startswith("docker.io/gresearch/") for c in spec["containers"]):
            continue
        assert (spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]) == (1000, 2000), name
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_only_the_server_and_executors_reach_the_scheduler_grpc_port(rendered):
    policy = find(rendered, "NetworkPolicy", "armada-scheduler", namespace_of(rendered))
    scheduler = find(rendered, "Deployment", "armada-scheduler", namespace_of(rendered))
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= scheduler["spec"]["template"]["metadata"]["labels"].items()
    # The only rule: health and metrics are left to the kubelet (tests/test_network_policies.py).
    [grpc_rule] = policy["spec"]["ingress"]
    assert grpc_rule["ports"] == [{"port": 50052, "protocol": "TCP"}]
    [peer] = grpc_rule["from"]
    clients = {
        name for name, d in deployments(rendered).items()
        if peer["podSelector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    }
    assert clients == {"armada-server", *executors(rendered)}


# --- wiring, read back from the rendered config files ----------------------------------------


def test_wiring_in_the_rendered_configs(rendered):
    namespace = namespace_of(rendered)
    configs = {name: service_config(rendered, name) for name in deployments(rendered)}
    postgres_host = f"armada-postgres.{namespace}.svc.cluster.local"
    for name, database in [("armada-server", "lookout"), ("armada-lookout", "lookout"),
                           ("armada-lookout-ingester", "lookout"), ("armada-scheduler", "scheduler"),
                           ("armada-scheduler-ingester", "scheduler")]:
        assert configs[name]["postgres"]["connection"] == {
            "host": postgres_host, "port": 5432, "dbname": database, "sslmode": "disable"
        }, name
    assert configs["armada-server"]["eventsApiRedis"] == configs["armada-event-ingester"]["redis"]
    assert configs["armada-server"]["eventsApiRedis"]["addrs"] == [f"armada-redis.{namespace}.svc.cluster.local:6379"]
    pulsar_urls = {c["pulsar"]["URL"] for c in configs.values() if "pulsar" in c}
    assert len(pulsar_urls) == 1
    scheduler = f"armada-scheduler.{namespace}.svc.cluster.local:50052"
    assert configs["armada-server"]["schedulerApiConnection"] == {"armadaUrl": scheduler, "forceNoTls": True}
    for executor in executors(rendered):
        assert configs[executor]["executorApiConnection"] == {"armadaUrl": scheduler, "forceNoTls": True}
        pools = [p["name"] for p in configs["armada-scheduler"]["scheduling"]["pools"]]
        assert configs[executor]["application"]["pool"] in pools
    assert configs["armada-scheduler"]["armadaApi"]["forceNoTls"] is True
    assert configs["armada-scheduler"]["auth"]["permissionGroupMapping"]["execute_jobs"]


DEFAULT_DIRS = {
    "armada-server": "server", "armada-scheduler": "scheduler", "armada-scheduler-ingester": "scheduleringester",
    "armada-lookout": "lookout", "armada-lookout-ingester": "lookoutingester",
    "armada-event-ingester": "eventingester", "armada-binoculars": "binoculars",
}


def test_rendered_configs_including_stack_file_extras_use_only_known_keys(rendered):
    for name in deployments(rendered):
        service = "executor" if name.startswith("armada-executor-") else DEFAULT_DIRS[name]
        known = key_paths(default_keys(service))
        generated = key_paths(service_config(rendered, name))
        assert sorted(p for p in generated if p not in known and not allowed_absent(service, p)) == [], name


def test_prod_on_its_own_cluster_uses_its_external_pulsar():
    prod = armada_variant(OWN_CLUSTER)
    assert service_config(prod, "armada-server")["pulsar"]["URL"] == "pulsar://pulsar-broker.pulsar.svc.cluster.local:6650"
    assert not [o for o in objects(prod, "StatefulSet") if o["metadata"]["name"] == "armada-pulsar"]
    assert service_config(prod, "armada-lookout")["prunerConfig"] == {"expireAfter": "2160h"}  # extra


def test_secret_env_points_at_the_dependency_secrets(rendered):
    secrets = {o["metadata"]["name"] for o in objects(rendered, "Secret")}
    for name, deployment in deployments(rendered).items():
        for env in pod_spec(deployment)["containers"][0]["env"]:
            if env["name"].startswith("ARMADA_"):
                assert env["valueFrom"]["secretKeyRef"]["name"] in secrets, (name, env)


# --- order -----------------------------------------------------------------------------------


def test_databases_then_migrations_then_services(rendered):
    job, deploy = "kubernetes:batch/v1:Job", "kubernetes:apps/v1:Deployment"
    databases = ("kubernetes:batch/v1:Job", "armada-postgres-databases")
    for migration in ("armada-scheduler-migration", "armada-lookout-migration"):
        assert depends_on(rendered, job, migration, *databases), migration
    assert depends_on(rendered, deploy, "armada-scheduler-deploy", job, "armada-scheduler-migration")
    assert depends_on(rendered, deploy, "armada-scheduler-ingester-deploy", job, "armada-scheduler-migration")
    assert depends_on(rendered, deploy, "armada-lookout-deploy", job, "armada-lookout-migration")
    assert depends_on(rendered, deploy, "armada-lookout-ingester-deploy", job, "armada-lookout-migration")
    # G3: the server needs the lookout migration's tables.
    assert depends_on(rendered, deploy, "armada-server-deploy", job, "armada-lookout-migration")
    for executor in executors(rendered):
        assert depends_on(rendered, deploy, f"{executor}-deploy", deploy, "armada-scheduler-deploy")


def test_migration_jobs_run_the_right_commands(rendered):
    namespace = namespace_of(rendered)
    scheduler = pod_spec(find(rendered, "Job", "armada-scheduler-migration", namespace))["containers"][0]
    lookout = pod_spec(find(rendered, "Job", "armada-lookout-migration", namespace))["containers"][0]
    assert scheduler["image"] == IMAGES["armada-scheduler"] and scheduler["args"][:3] == ["migrateDatabase", "--config", CONFIG_PATH]
    assert lookout["image"] == IMAGES["armada-lookout"] and lookout["args"] == ["--migrateDatabase", "--config", CONFIG_PATH]
    databases = pod_spec(find(rendered, "Job", "armada-postgres-databases", namespace))["containers"][0]
    assert "CREATE DATABASE scheduler" in databases["args"][0] and "CREATE DATABASE lookout" in databases["args"][0]
    # Not PGDATABASE (the Secret's `lookout`): on an external server it is one the Job creates.
    [psql] = [line for line in databases["args"][0].splitlines() if line.startswith("psql ")]
    assert " -d postgres " in psql


def replaced_on_next_up(job: dict, live_status: dict) -> bool:
    """pulumi-kubernetes v4.34.2's Diff for a Job that is in state (provider/pkg/provider/provider.go:
    `metadata.ReplaceUnready(newInputs)` and kind Job -> replace unless the live Job passes the Job
    checker, pkg/await/checker/job: started and condition Complete True). The annotation's value
    must be exactly "true" (metadata.IsAnnotationTrue)."""
    annotations = job["metadata"].get("annotations") or {}
    if annotations.get("pulumi.com/replaceUnready") != "true" or job["kind"] != "Job":
        return False
    conditions = {c["type"]: c["status"] for c in live_status.get("conditions", [])}
    ready = bool(live_status.get("startTime")) and conditions.get("Complete") == "True"
    return not ready


def migration_jobs(rendered) -> list[dict]:
    """The Armada services' Jobs (the dependencies' own Jobs are their components')."""
    return [
        o for o in objects(rendered, "Job")
        if o["metadata"]["namespace"] == namespace_of(rendered)
        and any(c["image"].startswith("docker.io/gresearch/armada-") for c in pod_spec(o)["containers"])
    ]


def test_a_failed_migration_job_is_replaced_on_the_next_up(rendered):
    jobs = migration_jobs(rendered)
    assert {j["metadata"]["name"] for j in jobs} == {"armada-scheduler-migration", "armada-lookout-migration"}
    failed = {"startTime": "2026-01-01T00:00:00Z", "conditions": [{"type": "Failed", "status": "True"}]}
    done = {"startTime": "2026-01-01T00:00:00Z", "conditions": [{"type": "Complete", "status": "True"}]}
    for job in jobs:
        name = job["metadata"]["name"]
        assert replaced_on_next_up(job, failed), name
        assert replaced_on_next_up(job, {}), name  # never started (e.g. the up was interrupted)
        assert not replaced_on_next_up(job, done), name  # a completed migration stays
        # Same name -> the provider deletes the old Job before creating the new one; an explicit
        # deleteBeforeReplace: false would override that (and the Job's name would clash).
        registration_ = registration(rendered, "kubernetes:batch/v1:Job", name)
        assert registration_.inputs["metadata"]["name"] == name
        assert getattr(registration_, "options", {}).get("deleteBeforeReplace", True) is True, name


def test_single_writer_services_never_run_twice_during_a_rollout(rendered):
    """The scheduler (leader.mode standalone: every instance leads) and each executor (its cluster
    id is its identity) must stop before their replacement starts: Recreate, never RollingUpdate."""
    found = deployments(rendered)
    single_writers = {"armada-scheduler", *executors(rendered)}
    assert config_of(rendered).platform.armada.executors and single_writers <= set(found)
    for name, deployment in found.items():
        strategy = deployment["spec"]["strategy"]
        if name in single_writers:
            assert strategy == {"type": "Recreate"}, name
        else:
            # The others may overlap; they must never be unavailable during a rollout.
            assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == 0, name


def test_external_database_job_does_not_connect_to_a_database_it_creates():
    from components.postgres import create_databases_job_spec

    spec = create_databases_job_spec("armada-postgres", "creds", "db.example.com", 5432, "postgres:16", ["lookout", "scheduler"])
    container = spec["template"]["spec"]["containers"][0]
    assert {e["name"]: e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"]}["PGDATABASE"] == "database"
    [psql] = [line for line in container["args"][0].splitlines() if line.startswith("psql ")]
    assert psql.split(" -d ")[1].split()[0] == "postgres"


def test_pruning_cron_jobs_follow_the_config(rendered_stacks):
    prod = armada_variant(OWN_CLUSTER)
    scheduler = find(prod, "CronJob", "armada-scheduler-pruner", "armada")
    assert scheduler["spec"]["schedule"] == "15 * * * *"
    args = pod_spec(scheduler)["containers"][0]["args"]
    assert args[:3] == ["pruneDatabase", "--config", CONFIG_PATH] and args[args.index("--expireAfter") + 1] == "24h"
    lookout = find(rendered_stacks["test"], "CronJob", "armada-lookout-pruner", "armada")
    assert lookout["spec"]["schedule"] == "@daily"
    assert pod_spec(lookout)["containers"][0]["args"] == ["--pruneDatabase", "--config", CONFIG_PATH]


# --- cluster prerequisites and outputs -------------------------------------------------------


def test_each_armada_stack_creates_its_clusters_priority_classes_and_cluster_roles(rendered):
    classes = {o["metadata"]["name"]: o["value"] for o in objects(rendered, "PriorityClass")}
    scheduling = service_config(rendered, "armada-scheduler")["scheduling"]["priorityClasses"]
    assert {n: c["priority"] for n, c in scheduling.items()} == classes
    assert {"armada-default", "armada-preemptible"} <= set(classes)
    assert find(rendered, "ClusterRole", "cloudstation-armada-executor")["rules"]
    assert config_of(rendered).platform.owns_cluster_resources


def test_each_executor_is_bound_to_the_executor_cluster_role(rendered):
    for executor in executors(rendered):
        binding = find(rendered, "ClusterRoleBinding", f"{namespace_of(rendered)}-{executor}")
        assert binding["roleRef"]["name"] == "cloudstation-armada-executor"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": executor, "namespace": namespace_of(rendered)}]


def test_the_stack_sharing_the_test_stacks_cluster_runs_no_armada(rendered_stacks):
    """One Armada per cluster: the prod stack file (not the cluster's owner) registers none of it,
    and the test stack's Armada has the build queue of every prod project."""
    prod, test = rendered_stacks["prod"], rendered_stacks["test"]
    assert not config_of(prod).platform.owns_cluster_resources
    assert [r.name for r in prod.registrations if r.type.startswith("cloudstation:armada:")] == []
    assert [o["metadata"]["name"] for o in prod.manifests() if "armada" in json.dumps(o["metadata"])] == []
    assert [name for name in prod.outputs if name.startswith("armada")] == []
    assert [r for r in test.registrations if r.type.startswith("cloudstation:armada:")]
    queues = set(test.outputs["armadaQueues"])
    assert {f"{project.name}-builds" for project in config_of(prod).projects} <= queues


def test_job_namespaces_exist(rendered):
    names = {o["metadata"]["name"] for o in objects(rendered, "Namespace")}
    jobs = config_of(rendered).platform.armada.job_namespaces
    assert jobs == ["armada-jobs"]  # both stacks use the default
    assert {namespace_of(rendered), *jobs} <= names


def test_outputs(rendered):
    namespace = namespace_of(rendered)
    outputs = rendered.outputs
    assert outputs["armadaApiGrpc"] == f"armada-server.{namespace}.svc.cluster.local:50051"
    assert outputs["armadaApiRest"] == f"http://armada-server.{namespace}.svc.cluster.local:8080"
    armadactl = yaml.safe_load(outputs["armadactlConfig"])
    context = armadactl["contexts"][armadactl["currentContext"]]
    if rendered.stack == "test":
        assert context == {"armadaUrl": outputs["armadaApiGrpc"], "forceNoTls": True}
        assert outputs["armadaLookoutUrl"] == f"http://armada-lookout.{namespace}.svc.cluster.local:10000"
    else:
        assert context == {"armadaUrl": "armada-grpc.example.com:443"}
        assert outputs["armadaLookoutUrl"] == "https://lookout.example.com"


# --- a variant: options off and on ------------------------------------------------------------


@pytest.fixture(scope="module")
def variant():
    stack_file = stacks.read("test")
    platform = json.loads(stack_file.values["cloudstation:platform"])
    platform["armada"].update(
        {
            "namespace": "armada-b",
            "jobNamespaces": ["batch-a", "batch-b"],
            "scheduler": {"pools": ["default", "gpu"], "pruning": {"enabled": False}, "restrictGrpc": False},
            "lookout": {"pruning": {"enabled": False}},
            "executors": [{"name": "cpu", "pool": "default"}, {"name": "gpu", "pool": "gpu"}],
            "binoculars": {"enabled": True},
        }
    )
    # Binoculars' pin has no digest record yet: named in the opt-out, as a lab cluster does.
    stack_file.values["cloudstation:platform"] = json.dumps(unpinned.opt_out(platform))
    return stacks.render("test", stack_file=stack_file)


def test_variant_one_executor_per_entry_and_binoculars(variant):
    found = deployments(variant)
    assert {"armada-executor-cpu", "armada-executor-gpu", "armada-binoculars"} <= set(found)
    pools = {n: service_config(variant, n)["application"]["pool"] for n in ("armada-executor-cpu", "armada-executor-gpu")}
    assert pools == {"armada-executor-cpu": "default", "armada-executor-gpu": "gpu"}
    lookout_ui = service_config(variant, "armada-lookout")["uiConfig"]
    assert lookout_ui["binocularsBaseUrlPattern"] == "http://armada-binoculars.armada-b.svc.cluster.local:8080"
    # Binoculars reads job logs in the job namespaces and nothing cluster-wide.
    for job_namespace in ("batch-a", "batch-b"):
        binding = find(variant, "RoleBinding", "armada-b-armada-binoculars", job_namespace)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": "cloudstation-armada-binoculars-jobs"}
    assert {"batch-a", "batch-b"} <= {o["metadata"]["name"] for o in objects(variant, "Namespace")}
    assert validate.validate_all([o for o in armada_objects(variant) if o["kind"] != "Secret"]) == []


def test_variant_without_pruning(variant):
    mine = armada_objects(variant)
    # No pruner (the PostgreSQL backups' CronJobs are components/postgres_backup.py's).
    assert [o for o in mine if o["kind"] == "CronJob"
            and o["metadata"]["labels"]["app.kubernetes.io/component"] not in ("database-backup", "database-restore")] == []
    # restrictGrpc off: the scheduler's gRPC port admits any source (every address and every pod)
    scheduler = next(o for o in mine if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "armada-scheduler")
    assert scheduler["spec"]["ingress"] == [{"from": network.any_source(), "ports": [{"port": 50052, "protocol": "TCP"}]}]
    # One cluster-wide (read-only) binding per executor, named after the Armada namespace;
    # binoculars has none.
    bindings = sorted(o["metadata"]["name"] for o in objects(variant, "ClusterRoleBinding") if "armada" in o["metadata"]["name"])
    assert bindings == ["armada-b-armada-executor-cpu", "armada-b-armada-executor-gpu"]
