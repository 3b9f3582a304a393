"""Armada's generated override configs, checked against Armada's own default config files at the
pinned version (recorded in tests/upstream/armada-v<version>.yaml by scripts/armada-config-keys.py,
and compared with the full upstream files when the team's reference folder is present), and the
config-time rules."""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from components.armada import config as ac
from components.armada.binoculars import binoculars_spec
from components.armada.cluster import BINOCULARS_JOB_RULES, EXECUTOR_JOB_RULES, EXECUTOR_RULES, priority_class
from components.armada.event_ingester import event_ingester_spec
from components.armada.executor import ExecutorArgs, executor_spec
from components.armada.lookout import lookout_spec
from components.armada.lookout_ingester import lookout_ingester_spec
from components.armada.scheduler import scheduler_spec
from components.armada.scheduler_ingester import scheduler_ingester_spec
from components.armada.server import server_spec
from components.armada.service import ArmadaArgs
from components.armada.settings import ArmadaConfig
from infra import config as stack_config
from infra.versions import ARMADA
from tests.conftest import ROOT

# What the tests need from armadaproject/armada at the pinned tag, carried by the repository:
# key trees of the default and example configs, a few default values, the Helm ClusterRoles.
UPSTREAM_FILE = ROOT / "tests" / "upstream" / f"armada-v{ARMADA}.yaml"
UPSTREAM = yaml.safe_load(UPSTREAM_FILE.read_text(encoding="utf-8"))
GENERATOR = ROOT / "scripts" / "armada-config-keys.py"
# Optional: the team's reference folder with the full upstream files, beside the repository
# (../shared/reference) unless CLOUDSTATION_REFERENCE names it; only an extra check uses it.
REFERENCE = Path(os.environ.get("CLOUDSTATION_REFERENCE") or ROOT.parent / "shared" / "reference") / "armada"

# A config that turns every optional branch on, so every generated key is checked.
FULL = ArmadaConfig.model_validate(
    {
        "scheduler": {"pools": ["default", "gpu"]},
        "executors": [{"name": "a", "pool": "default"}, {"name": "b", "pool": "gpu", "clusterId": "gpu-cluster"}],
        "binoculars": {"enabled": True},
        "lookout": {"publicUrl": "https://lookout.example.com"},
        "server": {"publicRestUrl": "https://armada.example.com"},
    }
)
ENDPOINTS = ac.Endpoints(
    namespace="armada",
    postgres_host="pg.db.svc.cluster.local",
    postgres_port=5432,
    redis_address="redis.db.svc.cluster.local:6379",
    pulsar_url="pulsar://pulsar.db.svc.cluster.local:6650",
    pulsar_admin_url="http://pulsar.db.svc.cluster.local:8080",
    postgres_secret="pg-credentials",
    redis_secret="redis-secret",
)


def args(config: ArmadaConfig = FULL) -> ArmadaArgs:
    return ArmadaArgs(config=config, endpoints=ENDPOINTS, image="img:1")


def specs(config: ArmadaConfig = FULL) -> dict:
    """service directory in the reference -> its ServiceSpec."""
    a = args(config)
    return {
        "server": server_spec(a),
        "scheduler": scheduler_spec(a),
        "scheduleringester": scheduler_ingester_spec(a),
        "executor": executor_spec(ExecutorArgs(config=config, endpoints=ENDPOINTS, image="img:1", executor=config.executors[0])),
        "lookout": lookout_spec(a),
        "lookoutingester": lookout_ingester_spec(a),
        "eventingester": event_ingester_spec(a),
        "binoculars": binoculars_spec(a),
    }


def recorded(path: str) -> dict:
    """The record of one upstream file (repository-relative path at the tag)."""
    files = UPSTREAM["files"]
    assert path in files, (f"{path} is not recorded in {UPSTREAM_FILE.name}: add it to RECORD in "
                           f"{GENERATOR.relative_to(ROOT)} and regenerate the file")
    return files[path]


def default_keys(service: str) -> dict:
    """The key tree of a service's built-in default config (`config/<service>/config.yaml`):
    every map key, nested as in the file, leaves None; `ac.key_paths` walks it like the file."""
    return recorded(f"config/{service}/config.yaml")["keys"]


def default_value(service: str, dotted: str) -> Any:
    """A value of a service's default config, at a dotted key path the generator records."""
    values = recorded(f"config/{service}/config.yaml").get("values", {})
    assert dotted in values, (f"config/{service}/config.yaml {dotted} is not recorded: add it to VALUES "
                              f"in {GENERATOR.relative_to(ROOT)} and regenerate {UPSTREAM_FILE.name}")
    return values[dotted]


# Keys we set that the default files lack, each a real key of that service:
ABSENT_FROM_DEFAULTS = {
    # The default files have no auth, and both refuse to start without one (v0.22.7
    # internal/common/auth/setup.go); the key shape is in _local/server/config-auth.yaml and
    # _local/scheduler/config-auth.yaml (test_the_allow_list_is_needed).
    "server": {("auth",), ("schedulerApiConnection", "forceNoTls")},  # forceNoTls: _local/server/config-auth.yaml
    "scheduler": {("auth",)},
    # G6: the default file's `metrics.port` is ignored; the struct field is `metricsPort`.
    "scheduleringester": {("metricsPort",)},
}


def allowed_absent(service: str, path: tuple[str, ...]) -> bool:
    return any(path[: len(prefix)] == prefix for prefix in ABSENT_FROM_DEFAULTS.get(service, ()))


@pytest.mark.parametrize("service", sorted(specs()))
def test_every_generated_key_is_a_key_armada_knows(service):
    generated = specs()[service].config
    known = ac.key_paths(default_keys(service))
    unknown = sorted(p for p in ac.key_paths(generated) if p not in known and not allowed_absent(service, p))
    assert unknown == []


def test_the_allow_list_is_needed():
    """Each allow-listed key really is missing from its default file (else drop it from the list),
    and the auth keys are those of upstream's auth examples."""
    for service, prefixes in ABSENT_FROM_DEFAULTS.items():
        known = ac.key_paths(default_keys(service))
        assert [p for p in prefixes if p in known] == [], service
    server_example = ac.key_paths(recorded("_local/server/config-auth.yaml")["keys"])
    assert {("auth",), ("schedulerApiConnection", "forceNoTls")} <= server_example
    assert ("auth",) in ac.key_paths(recorded("_local/scheduler/config-auth.yaml")["keys"])


def test_the_key_check_catches_a_misspelt_key():
    config = FULL.model_copy(update={"server": FULL.server.model_copy(update={"extra": {"eventsApiRedis": {"adrs": []}}})})
    generated = server_spec(args(config)).config
    known = ac.key_paths(default_keys("server"))
    assert ("eventsApiRedis", "adrs") in {p for p in ac.key_paths(generated) if p not in known}


@pytest.mark.parametrize("service", sorted(specs()))
def test_every_armada_env_var_overrides_a_key_that_exists(service):
    """Viper applies ARMADA_* only to keys present in the merged YAML (v0.22.7
    internal/common/startup.go: SetEnvPrefix("ARMADA"), AutomaticEnv, then Unmarshal)."""
    spec = specs()[service]
    merged = ac.deep_merge(default_keys(service), spec.config)
    names = [e["name"] for e in spec.env if e["name"].startswith("ARMADA_")]
    assert [n for n in names if not ac.env_overrides_existing_key(n, merged)] == []


def test_passwords_come_from_secrets_only():
    for service, spec in specs().items():
        for env in spec.env:
            assert "value" not in env, (service, env)
        assert "password" not in yaml.safe_dump(spec.config).lower(), service


def test_database_users_get_user_and_password_from_the_postgres_secret():
    for service in ("server", "scheduler", "scheduleringester", "lookout", "lookoutingester"):
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in specs()[service].env}
        assert env["ARMADA_POSTGRES_CONNECTION_PASSWORD"] == {"name": "pg-credentials", "key": "password"}
        assert env["ARMADA_POSTGRES_CONNECTION_USER"] == {"name": "pg-credentials", "key": "username"}


def test_each_component_is_on_the_right_database_with_an_explicit_port():
    expected = {
        "server": "lookout", "lookout": "lookout", "lookoutingester": "lookout",
        "scheduler": "scheduler", "scheduleringester": "scheduler",
    }
    configs = {s: spec.config for s, spec in specs().items()}
    for service, database in expected.items():
        connection = configs[service]["postgres"]["connection"]
        assert (connection["dbname"], connection["host"], connection["port"]) == (
            database, "pg.db.svc.cluster.local", 5432
        ), service
    # The upstream defaults agree on which database each one uses.
    for service, database in expected.items():
        assert default_value(service, "postgres.connection.dbname") == database
    for service in ("executor", "eventingester", "binoculars"):
        assert "postgres" not in configs[service]


def test_lookout_database_port_is_set_because_its_default_is_5433():
    assert default_value("lookout", "postgres.connection.port") == 5433
    assert specs()["lookout"].config["postgres"]["connection"]["port"] == 5432


def test_server_events_api_and_event_ingester_share_one_redis_and_db():
    server = specs()["server"].config["eventsApiRedis"]
    ingester = specs()["eventingester"].config["redis"]
    assert server == ingester == {"addrs": ["redis.db.svc.cluster.local:6379"], "db": 1}
    env = {e["name"] for e in specs()["server"].env} | {e["name"] for e in specs()["eventingester"].env}
    assert {"ARMADA_EVENTSAPIREDIS_PASSWORD", "ARMADA_REDIS_PASSWORD"} <= env


def test_pulsar_url_and_topics_agree_between_producers_and_consumers():
    configs = {s: spec.config for s, spec in specs().items()}
    users = ["server", "scheduler", "scheduleringester", "lookoutingester", "eventingester"]
    assert {configs[s]["pulsar"]["URL"] for s in users} == {"pulsar://pulsar.db.svc.cluster.local:6650"}
    assert {configs[s]["pulsar"]["jobsetEventsTopic"] for s in users} == {"events"}
    assert configs["server"]["pulsar"]["controlPlaneEventsTopic"] == "control-plane"
    assert configs["scheduleringester"]["pulsar"]["controlPlaneEventsTopic"] == "control-plane"


def test_topics_can_be_renamed_for_a_shared_pulsar():
    config = ArmadaConfig.model_validate({"topics": {"events": "test-events", "controlPlane": "test-control"}})
    s = specs(config)
    assert s["server"].config["pulsar"]["jobsetEventsTopic"] == s["lookoutingester"].config["pulsar"]["jobsetEventsTopic"] == "test-events"
    assert s["scheduleringester"].config["pulsar"]["controlPlaneEventsTopic"] == "test-control"


def test_every_in_cluster_grpc_connection_says_force_no_tls_and_targets_the_right_port():
    configs = {s: spec.config for s, spec in specs().items()}
    scheduler_port = configs["scheduler"]["grpc"]["port"]
    server_port = configs["server"]["grpcPort"]
    connections = {
        "server": (configs["server"]["schedulerApiConnection"], f"armada-scheduler.armada.svc.cluster.local:{scheduler_port}"),
        "scheduler": (configs["scheduler"]["armadaApi"], f"armada-server.armada.svc.cluster.local:{server_port}"),
        "executor": (configs["executor"]["executorApiConnection"], f"armada-scheduler.armada.svc.cluster.local:{scheduler_port}"),
    }
    for service, (connection, address) in connections.items():
        assert connection == {"armadaUrl": address, "forceNoTls": True}, service
    # The executor default would turn TLS on (G1).
    assert default_value("executor", "executorApiConnection.forceNoTls") is False


def test_no_anonymous_access_and_no_permission_for_everyone_by_default():
    configs = {s: spec.config for s, spec in specs().items()}
    assert "auth" not in default_keys("server") and "auth" not in default_keys("scheduler")
    # Binoculars' default is anonymous, so it is switched off explicitly.
    assert default_value("binoculars", "auth.anonymousAuth") is True
    for service in ("server", "scheduler", "binoculars"):
        assert configs[service]["auth"]["anonymousAuth"] is False, service
    # Every authenticated principal, the platform's own included, is in "everyone" (v0.22.7
    # internal/common/auth/permissions.go).
    for service in ("server", "scheduler", "binoculars"):
        mapping = configs[service]["auth"].get("permissionGroupMapping", {})
        assert all("everyone" not in groups for groups in mapping.values()), service
    # The scheduler's only permission is for this stack's executors; binoculars grants none
    # (no node cordoning).
    assert configs["scheduler"]["auth"]["permissionGroupMapping"] == {"execute_jobs": ["cloudstation-executors"]}
    assert "permissionGroupMapping" not in configs["binoculars"]["auth"]
    server = configs["server"]["auth"]["permissionGroupMapping"]
    assert {p for p, groups in server.items() if "cloudstation-queue-managers" in groups} == {"create_queue", "delete_queue"}
    assert {p for p, groups in server.items() if "armada-admins" in groups} == set(server) - {"execute_jobs"}


def test_every_executor_pool_is_a_scheduler_pool():
    pools = [p["name"] for p in specs()["scheduler"].config["scheduling"]["pools"]]
    for executor in FULL.executors:
        generated = ac.executor_config(FULL, executor, ENDPOINTS)
        assert generated["application"]["pool"] in pools
    assert ac.executor_config(FULL, FULL.executors[1], ENDPOINTS)["application"] == {"clusterId": "gpu-cluster", "pool": "gpu"}


def _seconds(duration: str) -> float:
    value, unit = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", duration).groups()
    return float(value) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def test_the_scheduler_sees_a_new_executor_within_one_lease_interval():
    """Issue 19 defect 2: v0.22.7 rejects a job its submit check's executor snapshot cannot place
    (internal/scheduler/submitcheck.go: SubmitChecker.Run refreshes the snapshot every
    `scheduling.executorUpdateFrequency`, config/scheduler/config.yaml 60s), so on a fresh install
    the builds submitted seconds after the executor's first report were REJECTED for a minute. The
    snapshot is now refreshed as often as an executor reports (executor `task.
    allocateSpareClusterCapacityInterval`, its lease request: internal/scheduler/api.go StoreExecutor)."""
    assert default_value("scheduler", "scheduling.executorUpdateFrequency") == "60s"
    frequency = specs()["scheduler"].config["scheduling"]["executorUpdateFrequency"]
    assert frequency == ac.EXECUTOR_UPDATE_FREQUENCY
    assert 0 < _seconds(frequency) <= _seconds(default_value("executor", "task.allocateSpareClusterCapacityInterval"))
    # Still a setting of the stack's: `armada.scheduler.extra` wins, as for every generated key.
    override = ArmadaConfig.model_validate({"scheduler": {"extra": {"scheduling": {"executorUpdateFrequency": "30s"}}}})
    assert specs(override)["scheduler"].config["scheduling"]["executorUpdateFrequency"] == "30s"


def test_ports_in_the_configs_are_the_ports_the_pods_expose():
    s = specs()
    assert (s["server"].config["grpcPort"], s["server"].config["httpPort"], s["server"].config["metricsPort"]) == tuple(
        s["server"].ports[n] for n in ("grpc", "http", "metrics")
    )
    assert (s["scheduler"].config["grpc"]["port"], s["scheduler"].config["http"]["port"]) == (
        s["scheduler"].ports["grpc"], s["scheduler"].ports["http"]
    )
    assert s["scheduleringester"].config["metricsPort"] == s["scheduleringester"].ports["metrics"]
    assert (s["executor"].config["httpPort"], s["executor"].config["metric"]["port"]) == (
        s["executor"].ports["http"], s["executor"].ports["metrics"]
    )
    assert (s["lookout"].config["apiPort"], s["lookout"].config["metricsPort"]) == (
        s["lookout"].ports["http"], s["lookout"].ports["metrics"]
    )
    assert s["lookoutingester"].config["metricsPort"] == s["lookoutingester"].ports["metrics"]
    assert s["eventingester"].config["metricsPort"] == s["eventingester"].ports["metrics"]


def test_health_probes_only_where_armada_has_a_health_endpoint():
    with_health = {s for s, spec in specs().items() if spec.health}
    assert with_health == {"server", "scheduler", "executor", "lookout", "binoculars"}


def test_lookout_points_the_browser_at_public_urls():
    ui = specs()["lookout"].config["uiConfig"]
    assert ui["armadaApiBaseUrl"] == "https://armada.example.com"
    assert ui["binocularsBaseUrlPattern"] == "http://armada-binoculars.armada.svc.cluster.local:8080"
    assert specs()["server"].config["corsAllowedOrigins"] == ["https://lookout.example.com"]


def test_lookout_without_public_urls_points_the_browser_at_a_port_forward():
    # A browser cannot resolve `*.svc.cluster.local`: the default must be what a port-forward serves.
    plain = args(ArmadaConfig())
    ui = lookout_spec(plain).config["uiConfig"]
    assert ui["armadaApiBaseUrl"] == "http://localhost:8080"
    server = server_spec(plain).config
    assert "corsAllowedOrigins" not in server  # the default file's localhost origins stay
    assert "http://localhost:10000" in default_value("server", "corsAllowedOrigins")


def test_extra_is_deep_merged_over_the_generated_config():
    config = ArmadaConfig.model_validate(
        {"scheduler": {"extra": {"scheduling": {"maxRetries": 7, "pools": [{"name": "default"}, {"name": "x"}]},
                                 "postgres": {"connection": {"sslmode": "require"}}}}}
    )
    generated = scheduler_spec(args(config)).config
    assert generated["scheduling"]["maxRetries"] == 7
    assert generated["scheduling"]["pools"] == [{"name": "default"}, {"name": "x"}]  # lists are replaced
    assert generated["postgres"]["connection"] == {
        "host": "pg.db.svc.cluster.local", "port": 5432, "dbname": "scheduler", "sslmode": "require"
    }
    assert "priorityClasses" in generated["scheduling"]  # siblings stay


def test_deep_merge_replaces_lists_and_merges_maps():
    assert ac.deep_merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2], "d": 3}}) == {"a": {"b": 1, "c": [2], "d": 3}}


def test_priority_classes_match_the_scheduler_config():
    scheduling = specs()["scheduler"].config["scheduling"]["priorityClasses"]
    for name, settings in FULL.priority_classes.items():
        k8s_class = priority_class(name, settings)
        assert k8s_class["value"] == scheduling[name]["priority"]
        assert k8s_class["metadata"]["name"] == name
    # Armada's own defaults name these two classes.
    assert set(scheduling) == set(default_keys("scheduler")["scheduling"]["priorityClasses"])


def test_the_server_accepts_exactly_the_configured_priority_classes():
    allowed = specs()["server"].config["submission"]["allowedPriorityClassNames"]
    defaults = {"submission": {"allowedPriorityClassNames": default_value("server", "submission.allowedPriorityClassNames")}}
    merged = ac.deep_merge(defaults, specs()["server"].config)["submission"]["allowedPriorityClassNames"]
    assert {n for n, on in merged.items() if on} == set(FULL.priority_classes) == {"armada-default", "armada-preemptible"}
    assert allowed["armada-resilient"] is False
    assert merged["armada-default"] is True and default_value("server", "submission.defaultPriorityClassName") == "armada-default"


def cluster_role(chart: str) -> list[dict]:
    """The rules of upstream's ClusterRole for a Helm chart (deployment/<chart>/templates/clusterrole.yaml)."""
    return recorded(f"deployment/{chart}/templates/clusterrole.yaml")["rules"]


def notes_table(notes: Path, title: str) -> list[dict]:
    """A RBAC table of the reference notes (armada/NOTES.md §7) as ClusterRole rules."""
    lines = notes.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rules = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if rules:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in ("apiGroups",) or set(cells[0]) <= {"-"}:
            continue
        group = re.findall(r"`([^`]*)`", cells[0])[0].strip('"')
        resources = re.findall(r"`([^`]*)`", cells[1])
        verbs = [v.strip() for v in cells[2].split(",")]
        rules.append({"apiGroups": [group], "resources": resources, "verbs": verbs})
    return rules


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


FORBIDDEN = {
    ("", "users", "impersonate"), ("", "groups", "impersonate"), ("", "serviceaccounts", "impersonate"),
    ("", "serviceaccounts/token", "create"), ("", "nodes/proxy", "get"), ("", "nodes", "patch"),
    ("authentication.k8s.io", "tokenreviews", "create"), ("", "secrets", "get"),
}


def test_executor_roles_are_a_least_privilege_subset_of_upstreams():
    upstream = grants(cluster_role("executor"))
    cluster_wide, in_job_namespaces = grants(EXECUTOR_RULES), grants(EXECUTOR_JOB_RULES)
    assert cluster_wide | in_job_namespaces <= upstream
    # Cluster-wide: reading only (its informers, v0.22.7 cluster_context.go), nothing written.
    assert {verb for _, _, verb in cluster_wide} == {"get", "list", "watch"}
    assert {(g, r) for g, r, _ in cluster_wide} == {
        ("", "pods"), ("", "events"), ("", "nodes"), ("", "services"),
        ("networking.k8s.io", "ingresses"), ("discovery.k8s.io", "endpointslices"),
    }
    # In the job namespaces: exactly what it writes.
    assert in_job_namespaces == {
        ("", "pods", "create"), ("", "pods", "patch"), ("", "pods", "delete"),
        ("", "services", "create"), ("", "services", "delete"),
        ("networking.k8s.io", "ingresses", "create"), ("networking.k8s.io", "ingresses", "delete"),
    }
    assert not (cluster_wide | in_job_namespaces) & FORBIDDEN
    assert not [g for g in cluster_wide | in_job_namespaces if "*" in g]


def test_binoculars_only_reads_job_logs():
    assert grants(BINOCULARS_JOB_RULES) == {("", "pods/log", "get")}
    # Upstream's role would let it impersonate anyone and patch every node.
    assert {("", "users", "impersonate"), ("", "nodes", "patch")} <= grants(cluster_role("binoculars"))


def test_armadactl_config_has_the_reference_shape():
    reference = recorded("_local/.armadactl.yaml")["keys"]
    generated = ac.armadactl_config("c", "armada-server.armada.svc.cluster.local:50051")
    assert set(generated) == set(reference) == {"currentContext", "contexts"}
    assert generated["contexts"]["c"] == {"armadaUrl": "armada-server.armada.svc.cluster.local:50051", "forceNoTls": True}
    assert ac.armadactl_config("c", "armada.example.com:443", tls=True)["contexts"]["c"] == {"armadaUrl": "armada.example.com:443"}


# --- the recorded upstream facts ------------------------------------------------------------------


def test_the_recorded_facts_are_of_the_pinned_version():
    assert (UPSTREAM["repository"], UPSTREAM["tag"]) == ("https://github.com/armadaproject/armada", f"v{ARMADA}")
    assert set(specs()) | {"lookouthc"} == {p.split("/")[1] for p in UPSTREAM["files"] if p.startswith("config/")}
    # Each record names the exact upstream file: `git ls-tree v<version> <path>` prints this blob id.
    assert all(re.fullmatch(r"[0-9a-f]{40}", entry["blob"]) for entry in UPSTREAM["files"].values())


def generator():
    spec = importlib.util.spec_from_file_location("armada_config_keys", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generator_records_keys_values_and_rules():
    """The script behind the data file, on a small fake checkout: it fails, rather than guess, on a
    value path the file lacks and on template directives inside a ClusterRole's rules."""
    script = generator()
    data = b"a:\n  b: 1\n  c: [x]\nd: {}\n"
    assert script.key_tree(yaml.safe_load(data)) == {"a": {"b": None, "c": None}, "d": {}}
    assert script.blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob
    assert script.template_rules("kind: ClusterRole\nrules:\n- apiGroups: ['']\n", "x") == [{"apiGroups": [""]}]
    with pytest.raises(SystemExit, match="template directives"):
        script.template_rules("rules:\n{{- if .Values.x }}\n", "x")
    with pytest.raises(SystemExit, match="not a key path"):
        script.value_at({"a": {"b": 1}}, "a.c")


def test_the_recorded_facts_match_the_full_upstream_files():
    """Extra check, where the team's reference folder (verbatim upstream files) is present: the
    data file is what the generator makes of those files, and the ClusterRoles it keeps (the
    folder has no Helm templates) are the notes' RBAC tables."""
    folder = REFERENCE / f"armada-v{ARMADA}"
    if not (folder / "config").is_dir():
        pytest.skip(f"not run: the reference folder {folder} is absent (set CLOUDSTATION_REFERENCE to the folder "
                    f"holding armada/armada-v{ARMADA}/); the tests used the recorded {UPSTREAM_FILE.name}")
    script = generator()
    data, kept = script.generate(folder, UPSTREAM)
    assert {k: v for k, v in data.items() if k != "recorded"} == {k: v for k, v in UPSTREAM.items() if k != "recorded"}, (
        f"{UPSTREAM_FILE.name} differs from {folder}: run `python {GENERATOR.relative_to(ROOT)} --from {folder}`")
    assert sorted(kept) == [f"deployment/{chart}/templates/clusterrole.yaml" for chart in ("binoculars", "executor")]
    for chart, title in (("executor", "**Executor ClusterRole**"), ("binoculars", "**Binoculars ClusterRole**")):
        assert grants(cluster_role(chart)) == grants(notes_table(REFERENCE / "NOTES.md", title)), chart


# --- config-time errors (before any resource) ---------------------------------------------------


def minimal_stack(platform: dict) -> dict:
    """The raw config of a test stack with one small project and this `platform`."""
    return {
        "cloudstation:environment": "test",
        # Builds in the cluster (the default mode) must say where they may pull from.
        "cloudstation:platform": {"builds": {"publicEgress": {"enabled": True}}, **platform},
        "cloudstation:projects": [
            {"name": "p", "entities": [{"name": "e", "kind": "action", "language": "go", "source": "x"}]}
        ],
    }


def load(armada: dict) -> stack_config.StackConfig:
    return stack_config.load(minimal_stack({"armada": armada}))


def test_a_valid_armada_section_loads():
    config = load({"scheduler": {"pools": ["default", "gpu"]}, "executors": [{"name": "g", "pool": "gpu"}]})
    assert config.platform.armada.executors[0].pool == "gpu"


def test_an_executor_pool_the_scheduler_lacks_is_a_config_error():
    with pytest.raises(stack_config.ConfigError) as error:
        load({"scheduler": {"pools": ["default", "cpu"]}, "executors": [{"name": "g", "pool": "gpu"}]})
    message = str(error.value)
    assert "cloudstation:platform.armada.executors[0].pool: 'gpu'" in message
    assert "default, cpu" in message


@pytest.mark.parametrize(
    "armada, where",
    [
        ({"executors": [{"name": "a"}, {"name": "a"}]}, "armada.executors[1].name: 'a'"),
        ({"scheduler": {"replicas": 4}}, "armada.scheduler.replicas: 4"),  # 1 standalone, 2-3 elect a leader
        ({"scheduler": {"extra": {"Leader": {"mode": "standalone"}}}}, "armada.scheduler.extra.Leader"),
        ({"executors": [{"name": "a", "replicas": 2}]}, "armada.executors[0].replicas: 2"),
        ({"auth": {"permissionGroupMapping": {"submit_jobs": ["x"]}}}, "armada.auth.permissionGroupMapping.submit_jobs"),
        ({"priorityClasses": {"low": {"priority": 1, "preemptible": True}}}, "armada.priorityClasses"),
        ({"scheduler": {"pruning": {"schedule": "hourly"}}}, "armada.scheduler.pruning.schedule: 'hourly'"),
        ({"databases": {"scheduler": "my-db"}}, "armada.databases.scheduler: 'my-db'"),
        ({"servr": {}}, "armada.servr: unknown key"),
    ],
)
def test_bad_armada_settings_are_config_errors_naming_the_key(armada, where):
    with pytest.raises(stack_config.ConfigError) as error:
        load(armada)
    assert where in str(error.value)


def test_settings_reject_unknown_keys_directly():
    with pytest.raises(ValidationError):
        ArmadaConfig.model_validate({"lookout": {"publicURL": "x"}})


def test_a_stack_that_does_not_own_the_cluster_may_not_run_armada():
    # One Armada per cluster: an executor deletes the pods of another Armada's jobs (docs/armada.md).
    raw = minimal_stack({"ownsClusterResources": False})
    with pytest.raises(stack_config.ConfigError) as error:
        stack_config.load(raw)
    assert error.value.problems == [
        "cloudstation:platform.armada.enabled: true — one Armada per cluster: its executors delete the pods of "
        "any other Armada's jobs in the cluster; the stack that owns the cluster's resources runs it — set "
        "armada.enabled: false here, or give this stack its own cluster (ownsClusterResources: true)"
    ]
    raw["cloudstation:platform"]["armada"] = {"enabled": False}
    assert stack_config.load(raw).platform.armada.enabled is False
    raw["cloudstation:platform"] = minimal_stack({"ownsClusterResources": True})["cloudstation:platform"]
    assert stack_config.load(raw).platform.armada.enabled is True
