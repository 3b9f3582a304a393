"""PostgreSQL and Cassandra (managed and external) and the StatefulStores that point at them."""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from components import cassandra as cassandra_module
from components import postgres as postgres_module
from components.cassandra import Cassandra, CassandraArgs, CassandraSettings
from components.cloudstate_store import stateful_store_spec
from components.postgres import Postgres, PostgresArgs, PostgresSettings, SecretRef
from infra import versions
from cloudstation_tools import validate
from infra.config import ConfigError, load
from tests import stacks
from tests.conftest import build, manifests, validation_problems
from tests.stacks import edited, rendered as variant
from tests.conftest import container, find, objects, pod_spec, spec_violations, standard_violations


def env_of(container_: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container_.get("env", [])}


def secret_keys(rendered, name: str, namespace: str) -> set[str]:
    [secret] = [o for o in manifests(rendered.registrations) if o["kind"] == "Secret"
                and o["metadata"]["name"] == name and o["metadata"]["namespace"] == namespace]
    return set(secret.get("stringData") or secret.get("data"))


def stores(rendered) -> list[dict]:
    return objects(rendered, "StatefulStore")


# --- managed PostgreSQL: both stack files use it ---------------------------------------------


MANAGED = {
    # kind: (client ports, the server's ingress ports, keys of its credentials Secret)
    "postgres": ([{"name": "postgres", "port": 5432, "targetPort": "postgres"}], [5432],
                 {"username", "password", "database"}),
    "cassandra": ([{"name": "cql", "port": 9042, "targetPort": "cql"}], [9042, 7000],
                  {"username", "password", "lockout-password"}),
}
"""What each managed store kind serves (components/postgres.py, components/cassandra.py)."""


def kind_of(store: dict) -> str:
    return store["spec"]["type"].lower()


def test_every_store_of_both_stacks_is_a_managed_server_of_its_projects_kind_with_its_own_credentials(rendered):
    config = load(stacks.read(rendered.stack).values)
    # project-state's, and one per project with an event-sourced entity (the kind that needs a store),
    # of the kind the project names (the base pair: shop on PostgreSQL, warehouse on Cassandra)
    expected = {f"{config.platform.namespace}-state": config.platform.project_state_store}
    expected.update({f"{p.name}-{rendered.stack}": p.store for p in config.projects
                     if any(e.kind.needs_store for e in p.entities)})
    assert {s["metadata"]["namespace"]: kind_of(s) for s in stores(rendered)} == expected
    assert set(expected.values()) == set(MANAGED)  # both kinds are checked below
    for store in stores(rendered):
        name, namespace, kind = store["metadata"]["name"], store["metadata"]["namespace"], kind_of(store)
        ports, _, keys = MANAGED[kind]
        statefulset = find(rendered, "StatefulSet", name, namespace)
        claim = statefulset["spec"]["volumeClaimTemplates"][0]
        size = getattr(config.platform.stores, kind).storage.size
        assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == size
        headless = find(rendered, "Service", f"{name}-headless", namespace)
        assert headless["spec"]["clusterIP"] == "None" and statefulset["spec"]["serviceName"] == f"{name}-headless"
        client = find(rendered, "Service", name, namespace)
        assert client["spec"]["ports"] == ports
        assert secret_keys(rendered, f"{name}-credentials", namespace) == keys
        assert store["spec"] == stateful_store_spec(
            kind, f"{name}.{namespace}.svc.cluster.local", ports[0]["port"], f"{name}-credentials")


def test_managed_postgres_runs_as_postgres_on_its_volume_with_probes(rendered):
    statefulset = find(rendered, "StatefulSet", "shop-postgres", f"shop-{rendered.stack}")
    spec = pod_spec(statefulset)
    assert spec_violations("postgres", spec) == []
    assert spec["securityContext"]["runAsUser"] == spec["securityContext"]["fsGroup"] == 70
    server = container(spec, "postgres")
    assert server["image"] == versions.image("postgres")
    env = env_of(server)
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/")
    for name, key in (("POSTGRES_USER", "username"), ("POSTGRES_PASSWORD", "password"), ("POSTGRES_DB", "database")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "shop-postgres-credentials", "key": key}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert "pg_isready" in " ".join(server[probe]["exec"]["command"])
    mounts = {m["mountPath"] for m in server["volumeMounts"]}
    assert {"/var/lib/postgresql/data", "/var/run/postgresql", "/tmp"} <= mounts


def test_generated_passwords_are_long_and_random(rendered):
    """Kept with the data (components/kept_secret.py): generated like RandomPassword(32, special=False)."""
    passwords = [r for r in rendered.of_type("pulumi-python:dynamic/secrets:KeptSecret")
                 if r.name.endswith(("postgres-credentials-values", "cassandra-credentials-values"))]
    assert {r.name for r in passwords} >= {"shop-postgres-credentials-values", "project-state-postgres-credentials-values"}
    assert all(r.inputs["lengths"]["password"] >= 32 for r in passwords)


# --- external PostgreSQL, managed and external Cassandra (variant stacks) --------------------


def test_variant_stacks_validate_and_meet_the_standard():
    owner = variant("owner-external-cassandra")
    owner_crds = objects(owner, "CustomResourceDefinition")
    for rendered in (variant("non-owner"), owner):
        assert validation_problems(rendered, extra_crds=owner_crds) == []
        assert standard_violations(rendered.manifests()) == []


def test_external_postgres_copies_the_named_secret_and_creates_the_database():
    rendered = variant("non-owner")
    state = rendered.outputs["projectStateNamespace"]
    assert not [s for s in objects(rendered, "StatefulSet") if s["metadata"]["name"] == "project-state-postgres"]
    assert secret_keys(rendered, "project-state-postgres-credentials", state) == {"username", "password", "database"}
    [copy] = [r for r in rendered.of_type("kubernetes:core/v1:Secret") if r.name == "project-state-postgres-credentials"]
    assert base64.b64decode(copy.inputs["data"]["value"]["database"]).decode() == "platform_test"
    store = find(rendered, "StatefulStore", "project-state-postgres", state)
    assert store["spec"]["config"]["service"] == "pg.example.internal" and store["spec"]["config"]["port"] == 6432
    job = find(rendered, "Job", "project-state-postgres-databases", state)
    script = pod_spec(job)["containers"][0]["args"][0]
    assert "pg.example.internal -p 6432" in script and "CREATE DATABASE platform_test" in script


def test_managed_cassandra_has_auth_seeds_and_probes():
    rendered = variant("non-owner")
    statefulset = find(rendered, "StatefulSet", "shop-cassandra", "shop-test")
    spec = pod_spec(statefulset)
    assert spec["securityContext"]["runAsUser"] == spec["securityContext"]["fsGroup"] == 999
    config = container(spec, "config")
    assert "PasswordAuthenticator" in config["command"][-1]
    server = container(spec, "cassandra")
    assert server["image"] == versions.image("cassandra")
    assert env_of(server)["CASSANDRA_SEEDS"]["value"] == "shop-cassandra-0.shop-cassandra-headless.shop-test.svc.cluster.local"
    assert "nodetool" in " ".join(server["readinessProbe"]["exec"]["command"])
    assert server["livenessProbe"]["tcpSocket"]["port"] == 9042
    assert {m["mountPath"] for m in server["volumeMounts"]} >= {"/var/lib/cassandra", "/etc/cassandra", "/tmp"}
    assert secret_keys(rendered, "shop-cassandra-credentials", "shop-test") == {"username", "password", "lockout-password"}
    auth = pod_spec(find(rendered, "Job", "shop-cassandra-auth", "shop-test"))["containers"][0]
    assert "CREATE ROLE IF NOT EXISTS" in auth["command"][-1] and "LOGIN = false" in auth["command"][-1]
    policy = find(rendered, "NetworkPolicy", "shop-cassandra", "shop-test")
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [9042, 7000]
    store = find(rendered, "StatefulStore", "shop-cassandra", "shop-test")
    # Operator 0.6.0 passes these to the proxy as CASSANDRA_USERNAME/PASSWORD; optional
    # credentials are ignored unless their keys are named (reference §3.1 gotcha).
    assert store["spec"]["config"] == {
        "service": "shop-cassandra.shop-test.svc.cluster.local",
        "credentialsFromSecret": {"name": "shop-cassandra-credentials", "usernameKey": "username", "passwordKey": "password"},
    }


def test_external_cassandra_only_points_at_the_cluster():
    rendered = variant("owner-external-cassandra")
    assert not [s for s in objects(rendered, "StatefulSet") if "cassandra" in s["metadata"]["name"]]
    store = find(rendered, "StatefulStore", "shop-cassandra", "shop-prod")
    assert store["spec"]["type"] == "Cassandra" and store["spec"]["deployment"] == "Unmanaged"
    assert store["spec"]["config"]["service"] == "cassandra-a.example.internal,cassandra-b.example.internal"
    assert secret_keys(rendered, "shop-cassandra-credentials", "shop-prod") == {"username", "password"}


# --- what operator 0.6.0 passes to the proxy ------------------------------------------------


def operator_credential(config: dict, key: str, mandatory: bool) -> dict | None:
    """How operator 0.6.0 resolves one credential of a StatefulStore's config into the proxy's env
    value (rule of v0.6.0 `operator/.../stores/CredentialsHelper.scala`): a literal under
    `credentials`, else the Secret key named by `credentialsFromSecret.<key>Key`, else (mandatory
    credentials only) the Secret key `<key>`; otherwise nothing."""
    literal = config.get("credentials", {}).get(key)
    secret = config.get("credentialsFromSecret")
    if literal is not None:
        return {"value": literal}
    if secret and (f"{key}Key" in secret or mandatory):
        return {"secretKeyRef": {"name": secret["name"], "key": secret.get(f"{key}Key", key)}}
    return None


@pytest.mark.parametrize("kind, credentials", [
    # v0.6.0 stores/PostgresStoreSupport.scala: database, username, password mandatory.
    ("postgres", {"database": True, "username": True, "password": True}),
    # v0.6.0 stores/CassandraStoreSupport.scala: CASSANDRA_USERNAME/PASSWORD, both optional.
    ("cassandra", {"username": False, "password": False}),
])
def test_the_operator_passes_every_credential_from_the_stores_secret(kind, credentials):
    config = stateful_store_spec(kind, "db", 5432, "creds")["config"]
    for key, mandatory in credentials.items():
        assert operator_credential(config, key, mandatory) == {"secretKeyRef": {"name": "creds", "key": key}}, key
    # the gotcha the explicit keys avoid: an optional credential without its key is dropped
    assert operator_credential({"credentialsFromSecret": {"name": "creds"}}, "username", False) is None


# --- the Postgres component as other areas use it (Armada: extra databases) ------------------


def test_postgres_creates_extra_databases_with_an_idempotent_job(mocked):
    component = {}

    def make():
        component["pg"] = Postgres("armada-postgres", PostgresArgs(
            settings=PostgresSettings(username="armada"), namespace="armada", extra_databases=("scheduler", "lookout")))

    created = build(mocked, make)
    assert validate.validate_all(created) == []
    job = [o for o in created if o["kind"] == "Job"][0]
    script = pod_spec(job)["containers"][0]["args"][0]
    assert "CREATE DATABASE scheduler" in script and "CREATE DATABASE lookout" in script
    assert "WHERE NOT EXISTS" in script and "ON_ERROR_STOP=1" in script
    assert component["pg"].port == 5432 and component["pg"].service_name == "armada-postgres"
    assert component["pg"].database == "cloudstate"


def test_database_script_and_list_are_pure():
    settings = PostgresSettings(mode="external", host="db", cidrs=["10.9.0.0/24"], credentials_secret=SecretRef(namespace="n", name="s"))
    args = PostgresArgs(settings=settings, namespace="x", database="shop_test", extra_databases=("a", "shop_test"))
    assert postgres_module.databases_to_create(args) == ["shop_test", "a"]
    managed = PostgresArgs(settings=PostgresSettings(), namespace="x", extra_databases=("a",))
    assert postgres_module.databases_to_create(managed) == ["a"]
    assert postgres_module.create_databases_script(["a"]) == (
        "SELECT 'CREATE DATABASE a' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'a')\\gexec\n")


def test_seeds_are_the_first_pods():
    assert cassandra_module.seeds("c", "ns", 1) == "c-0.c-headless.ns.svc.cluster.local"
    assert cassandra_module.seeds("c", "ns", 3).split(",") == [
        "c-0.c-headless.ns.svc.cluster.local", "c-1.c-headless.ns.svc.cluster.local"]


def test_cassandra_component_alone_validates(mocked):
    created = build(mocked, lambda: Cassandra("c", CassandraArgs(CassandraSettings(replicas=3), "ns", "ns")))
    assert validate.validate_all(created) == []
    [statefulset] = [o for o in created if o["kind"] == "StatefulSet"]
    assert statefulset["spec"]["replicas"] == 3


# --- config errors ---------------------------------------------------------------------------


def problems(stores: dict) -> list[str]:
    stack_file = edited("test", platform=lambda p: {**p, "stores": stores})
    with pytest.raises(ConfigError) as caught:
        load(stack_file.values)
    return caught.value.problems


def test_external_postgres_without_host_or_secret_is_a_clear_error():
    [problem] = problems({"postgres": {"mode": "external", "credentialsSecret": {"namespace": "a", "name": "b"}}})
    assert problem == ("cloudstation:platform.stores.postgres.host: (not set) — "
                       "required when mode is 'external': the server's host name")
    # Everything the mode needs at once (issue 21: no rounds): the Secret, and the CIDRs of a host outside.
    problem, cidrs = problems({"cassandra": {"mode": "external", "host": "c"}})
    assert problem.startswith("cloudstation:platform.stores.cassandra.credentialsSecret: (not set) — required when "
                              "mode is 'external': an existing Secret with keys username and password")
    assert cidrs.startswith("cloudstation:platform.stores.cassandra.cidrs: [] — required for a server outside")


def test_external_only_keys_are_rejected_in_managed_mode():
    [problem] = problems({"postgres": {"host": "db.example"}})
    assert problem == ("cloudstation:platform.stores.postgres.host: 'db.example' — "
                       "only allowed when mode is 'external'")
    [problem] = problems({"cassandra": {"mode": "external", "host": "c", "replicas": 3, "cidrs": ["10.20.1.0/24"],
                                        "credentialsSecret": {"namespace": "a", "name": "b"}}})
    assert problem == "cloudstation:platform.stores.cassandra.replicas: 3 — only allowed when mode is 'managed'"


def test_bad_database_name_and_mode_name_the_key():
    found = problems({"postgres": {"database": "Shop-DB", "mode": "hosted"}})
    assert any(p.startswith("cloudstation:platform.stores.postgres.database: 'Shop-DB' — ") for p in found)
    assert any(p.startswith("cloudstation:platform.stores.postgres.mode: 'hosted' — must be one of") for p in found)


def test_managed_servers_accept_connections_only_from_their_namespace(rendered):
    kinds = set()
    for store in stores(rendered):
        name, namespace, kind = store["metadata"]["name"], store["metadata"]["namespace"], kind_of(store)
        policy = find(rendered, "NetworkPolicy", name, namespace)
        selector = find(rendered, "StatefulSet", name, namespace)["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["podSelector"]["matchLabels"] == selector
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        ports = [{"protocol": "TCP", "port": port} for port in MANAGED[kind][1]]
        assert [{**rule, "ports": sorted(rule["ports"], key=lambda p: p["port"])} for rule in policy["spec"]["ingress"]] \
            == [{"from": [{"podSelector": {}}], "ports": sorted(ports, key=lambda p: p["port"])}]
        kinds.add(kind)
    assert kinds == set(MANAGED)


def test_database_services_select_only_the_servers_pods_not_the_setup_jobs():
    for rendered in (variant("non-owner"), variant("owner-external-cassandra")):
        templates = [(o, o["spec"]["template"]["metadata"]["labels"]) for o in objects(rendered)
                     if o["kind"] in ("StatefulSet", "Job", "Deployment")]
        for service in objects(rendered, "Service"):
            selector = service["spec"].get("selector") or {}
            if not selector:
                continue
            selected = [o["kind"] for o, labels in templates if o["metadata"]["namespace"] == service["metadata"]["namespace"]
                        and selector.items() <= labels.items()]
            assert "Job" not in selected, service["metadata"]["name"]



def _run_config_script(base: Path, as_image_user: bool) -> tuple[subprocess.CompletedProcess, Path]:
    """The init container's script on a fake image config: the sources owned by the image's user,
    the destination like an emptyDir with fsGroup (owned by root, group-setgid, mode 2777)."""
    source, destination = base / "etc-cassandra", base / "config"
    (source / "triggers").mkdir(parents=True)
    destination.mkdir()
    (source / "cassandra.yaml").write_text("authenticator: AllowAllAuthenticator\nauthorizer: AllowAllAuthorizer\n")
    script = cassandra_module.CONFIG_SCRIPT.replace(cassandra_module.CONFIG_DIR, str(source)).replace(
        "/config/", f"{destination}/"
    )
    command = ["sh", "-c", script]
    if as_image_user:
        uid = cassandra_module.UID
        for path in (base, source, source / "triggers", source / "cassandra.yaml"):
            os.chown(path, uid, uid)
        os.chown(destination, 0, uid)
        destination.chmod(0o2777)
        command = [shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True), destination


def test_cassandra_config_script_copies_into_a_root_owned_empty_dir():
    """`cp -a` fails there ("preserving times for '/config/.'": only the owner, root, may set
    them), which crash-looped every Cassandra pod; a plain copy works. The script runs as the
    image's user when this machine allows it (root with setpriv), else as the current user."""
    copy = cassandra_module.CONFIG_SCRIPT.split("&&")[0].split()
    assert copy[0] == "cp" and not {"-a", "-p", "--archive"} & set(copy), copy
    assert not [option for option in copy if option.startswith("--preserve")], copy
    as_image_user = os.geteuid() == 0 and shutil.which("setpriv") is not None
    # Not pytest's tmp_path: its parents are private to their owner, and the image's user needs a way in.
    with tempfile.TemporaryDirectory() as base:
        result, destination = _run_config_script(Path(base), as_image_user)
        assert result.returncode == 0, result.stderr
        text = (destination / "cassandra.yaml").read_text()
        assert "authenticator: PasswordAuthenticator" in text and "authorizer: CassandraAuthorizer" in text
        assert (destination / "triggers").is_dir()


# --- setup Jobs after a failed run (pulumi-kubernetes replaceUnready) -----------------------


def test_a_failed_setup_job_is_replaced_on_the_next_up_not_awaited_again(rendered_stacks):
    """pulumi-kubernetes awaits a Job until it completes; a Job that failed stays in the state and
    every later `up` would wait on it again. `pulumi.com/replaceUnready: "true"` on the Job makes the
    provider's Diff replace a Job that is not complete (provider/pkg/provider/provider.go `Diff`);
    the provider reads it only on Jobs (anywhere else it logs "not supported")."""
    renders = [*rendered_stacks.values(), variant("non-owner"), variant("owner-external-cassandra")]
    jobs = []
    for rendered in renders:
        for obj in rendered.manifests():
            annotations = obj["metadata"].get("annotations") or {}
            if obj["kind"] != "Job":
                assert "pulumi.com/replaceUnready" not in annotations, (rendered.stack, obj["kind"], obj["metadata"]["name"])
                continue
            if obj["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "database-setup":
                jobs.append(obj)
                assert annotations.get("pulumi.com/replaceUnready") == "true", (rendered.stack, obj["metadata"]["name"])
    kinds = {job["metadata"]["name"].rsplit("-", 1)[-1] for job in jobs}
    assert kinds == {"databases", "auth"}  # the PostgreSQL database Job and the Cassandra auth Job are both covered
