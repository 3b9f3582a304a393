"""The values of kept Secrets (components/kept_secret.py): read back from the cluster when the Secret
is there, generated when not, never changed by a refresh.

The provider runs against a fake Kubernetes API (tests/fake_kube_api.py: a bearer token, GET of a
Secret, 404 for a missing one, 403 when forbidden) reached through a kubeconfig, as in `pulumi up`;
the real API server is the end-to-end tier's (e2e/test_scenario.py step 5)."""
from __future__ import annotations

import string

import bcrypt
import pytest

from components import kept_secret, kube_tunnel
from components.kept_secret import KeptSecretError, KeptSecretProvider
from tests.fake_kube_api import FakeKubeApi, fresh_kube_configurations  # noqa: F401 (autouse fixture)

NAMESPACE = "shop-prod"
POSTGRES = {"namespace": NAMESPACE, "name": "shop-postgres-credentials", "lengths": {"password": 32}, "cluster": True}
REGISTRY = {"namespace": "cloudstation", "name": "registry-auth", "lengths": {"password": 32, "http-secret": 48},
            "htpasswd": {"key": "htpasswd", "username": "pusher", "passwordKey": "password"}, "cluster": True}
CASSANDRA = {"namespace": NAMESPACE, "name": "shop-cassandra-credentials",
             "lengths": {"password": 32, "lockout-password": 32}, "cluster": True}


@pytest.fixture
def api(tmp_path, monkeypatch):
    """A fake API server and KUBECONFIG pointing at it (current context `fake`)."""
    with FakeKubeApi() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


def created(props: dict) -> dict:
    result = KeptSecretProvider().create(dict(props))
    assert result.id == f"{props['namespace']}/{props['name']}"
    assert {k: v for k, v in result.outs.items() if k != "values"} == props  # outputs repeat the inputs
    return result.outs["values"]


def generated(value: str, length: int) -> bool:
    return len(value) == length and set(value) <= set(string.ascii_letters + string.digits)


def secret_reads(api: FakeKubeApi) -> list[str]:
    return [path for _method, path, kind in api.requests if kind == "get secrets"]


def test_a_secret_that_does_not_exist_is_generated(api):
    values = created(POSTGRES)
    assert list(values) == ["password"] and generated(values["password"], 32)
    assert created(POSTGRES) != values  # random, not derived
    assert secret_reads(api) == [f"/api/v1/namespaces/{NAMESPACE}/secrets/shop-postgres-credentials"] * 2
    registry = created(REGISTRY)
    assert generated(registry["password"], 32) and generated(registry["http-secret"], 48)
    assert kept_secret.htpasswd_verifies(registry["htpasswd"], "pusher", registry["password"])
    assert registry["htpasswd"].startswith("pusher:$2") and registry["htpasswd"].endswith("\n")


def test_every_value_the_secret_holds_is_kept(api):
    api.add_secret(NAMESPACE, "shop-postgres-credentials",
                   {"username": "cloudstate", "password": "the-password-the-data-was-made-with", "database": "shop_prod"})
    assert created(POSTGRES) == {"password": "the-password-the-data-was-made-with"}  # only what it generates
    api.add_secret(NAMESPACE, "shop-cassandra-credentials", {"username": "cloudstate", "password": "old-login",
                                                             "lockout-password": "old-lockout"})
    assert created(CASSANDRA) == {"password": "old-login", "lockout-password": "old-lockout"}


def test_a_kept_htpasswd_is_reused_when_it_verifies_and_computed_when_not(api):
    line = kept_secret.bcrypt_htpasswd("pusher", "kept-password")
    api.add_secret("cloudstation", "registry-auth", {"password": "kept-password", "http-secret": "kept-http-secret",
                                                     "htpasswd": line, "username": "pusher"})
    # Verifies: the very same text (bcrypt is salted: a new hash would differ and conflict).
    assert created(REGISTRY) == {"password": "kept-password", "http-secret": "kept-http-secret", "htpasswd": line}
    # Of another password, another user, or not an htpasswd entry: computed for the kept password.
    for stale in (kept_secret.bcrypt_htpasswd("pusher", "another"), kept_secret.bcrypt_htpasswd("someone", "kept-password"),
                  "pusher:{SHA}not-bcrypt\n", line + "extra:" + line.split(":", 1)[1], "pusher:$2y$10$broken\n"):
        api.add_secret("cloudstation", "registry-auth", {"password": "kept-password", "http-secret": "s", "htpasswd": stale})
        values = created(REGISTRY)
        assert values["password"] == "kept-password" and values["htpasswd"] != stale
        assert kept_secret.htpasswd_verifies(values["htpasswd"], "pusher", "kept-password")
        assert bcrypt.checkpw(b"kept-password", values["htpasswd"].split(":", 1)[1].strip().encode())


def test_only_what_is_missing_is_generated(api):
    api.add_secret(NAMESPACE, "shop-cassandra-credentials", {"username": "cloudstate", "password": "old-login"})
    values = created(CASSANDRA)
    assert values["password"] == "old-login" and generated(values["lockout-password"], 32)
    api.add_secret(NAMESPACE, "shop-cassandra-credentials", {"password": "", "lockout-password": "old-lockout"})
    values = created(CASSANDRA)  # an empty value is a missing one
    assert generated(values["password"], 32) and values["lockout-password"] == "old-lockout"
    # A kept password without its htpasswd: the file is computed for the kept password.
    api.add_secret("cloudstation", "registry-auth", {"password": "kept-password"})
    values = created(REGISTRY)
    assert values["password"] == "kept-password" and generated(values["http-secret"], 48)
    assert kept_secret.htpasswd_verifies(values["htpasswd"], "pusher", "kept-password")


def test_without_a_cluster_everything_is_generated_and_nothing_is_asked(api):
    api.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "kept"})
    values = created({**POSTGRES, "cluster": False})
    assert generated(values["password"], 32)
    assert api.requests == []


def test_the_stacks_context_is_used(api, tmp_path, monkeypatch):
    """`context` names the kubeconfig context (the stack's kubernetes.context); the current one is another cluster."""
    with FakeKubeApi() as other:
        other.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "of-the-current-context"})
        api.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "of-the-stacks-context"})
        path = api.write_kubeconfig(tmp_path / "two", context="stack", current="elsewhere",
                                    extra_contexts={"elsewhere": other.url})
        monkeypatch.setenv("KUBECONFIG", str(path))
        assert created({**POSTGRES, "context": "stack"}) == {"password": "of-the-stacks-context"}
        assert created(POSTGRES) == {"password": "of-the-current-context"}


def test_in_a_pod_without_kubeconfig_the_service_account_reads_the_secret(tmp_path):
    with FakeKubeApi(tls=True, token="service-account-token") as server:
        server.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "kept"})
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text("service-account-token")
        (account / "ca.crt").write_bytes(server.ca_pem)
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": server.url.rsplit(":", 1)[1],
               "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
        assert kept_secret.read_secret(NAMESPACE, "shop-postgres-credentials", None, env, str(account)) == {"password": "kept"}


def test_a_secret_that_cannot_be_read_fails_the_create_instead_of_generating(api, tmp_path, monkeypatch):
    """Generating would replace a password the kept data needs: refused reads, a kubeconfig that does
    not load and an unreachable API server are errors naming the Secret and what to fix."""
    api.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "kept"})
    api.forbidden.add(("get", "secrets"))
    with pytest.raises(KeptSecretError) as caught:
        created(POSTGRES)
    message = str(caught.value)
    assert f"Secret {NAMESPACE}/shop-postgres-credentials" in message and "HTTP 403" in message
    assert f"`get` on secrets in namespace {NAMESPACE}" in message and "the current context of" in message
    api.forbidden.clear()
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "bad-token", token="wrong")))
    kube_tunnel._configurations.clear()
    with pytest.raises(KeptSecretError, match="HTTP 401"):
        created(POSTGRES)
    with pytest.raises(KeptSecretError, match="cannot load the kubeconfig"):
        created({**POSTGRES, "context": "no-such-context"})
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "gone", server="http://127.0.0.1:1")))
    kube_tunnel._configurations.clear()
    with pytest.raises(KeptSecretError, match="cannot read Secret"):
        created(POSTGRES)


def test_a_value_that_is_not_text_is_an_error(api):
    api.add_secret(NAMESPACE, "shop-postgres-credentials", {})
    api.secrets[(NAMESPACE, "shop-postgres-credentials")]["password"] = "/w=="  # base64 of the byte 0xff
    with pytest.raises(KeptSecretError, match="'password' is not base64 of UTF-8 text"):
        created(POSTGRES)


# --- diff, refresh, delete, check --------------------------------------------------------------


def outputs(props: dict, **values) -> dict:
    return {**props, "values": values or {"password": "p"}}


def test_an_unchanged_resource_has_no_diff_and_what_it_generates_replaces():
    provider = KeptSecretProvider()
    same = provider.diff("id", outputs(POSTGRES), dict(POSTGRES))
    assert same.changes is False and same.replaces == []
    for key, value in (("namespace", "other"), ("name", "other-credentials"), ("lengths", {"password": 40}),
                       ("lengths", {"password": 32, "extra": 16}), ("cluster", False), ("context", "another")):
        diff = provider.diff("id", outputs(POSTGRES), {**POSTGRES, key: value})
        assert diff.changes is True and diff.replaces == [key] and diff.delete_before_replace is False, key
    registry = provider.diff("id", outputs(REGISTRY), {**REGISTRY, "htpasswd": {**REGISTRY["htpasswd"], "username": "x"}})
    assert registry.replaces == ["htpasswd"]


def test_refresh_keeps_the_values_and_delete_removes_nothing(api):
    api.add_secret(NAMESPACE, "shop-postgres-credentials", {"password": "edited-since"})
    state = outputs(POSTGRES, password="applied")
    read = KeptSecretProvider().read(f"{NAMESPACE}/shop-postgres-credentials", dict(state))
    assert read.id == f"{NAMESPACE}/shop-postgres-credentials" and read.outs == state
    assert KeptSecretProvider().delete(read.id, state) is None
    assert api.requests == []


def test_check_names_wrong_inputs_and_lets_unknowns_through():
    from pulumi.runtime import rpc

    provider = KeptSecretProvider()
    assert provider.check({}, dict(REGISTRY)).failures == []
    assert provider.check({}, {**POSTGRES, "namespace": rpc.UNKNOWN}).failures == []
    bad = {**REGISTRY, "namespace": "Not_A_Label", "lengths": {"password": 8},
           "htpasswd": {"key": "htpasswd", "username": "pusher", "passwordKey": "missing"}}
    assert {f.property for f in provider.check({}, bad).failures} == {"namespace", "lengths", "htpasswd"}
    with pytest.raises(KeptSecretError, match="lengths"):
        provider.create({**POSTGRES, "lengths": {}})


def test_lengths_arrive_as_doubles_through_the_engine(api):
    """A map's numbers reach a dynamic provider as doubles (components/entity_build.py `job_item_text`)."""
    assert generated(created({**POSTGRES, "lengths": {"password": 32.0}})["password"], 32)


def test_the_provider_is_rebuilt_by_import():
    """As the dynamic-provider host unpickles it (components/dynamic_provider.py)."""
    from cloudstation_tools.mocks import DynamicProviderHost
    from components.dynamic_provider import PROJECT_ROOT, guarded_serialize_provider, load_provider

    assert KeptSecretProvider().__reduce__() == (load_provider, (PROJECT_ROOT, "components.kept_secret", "KeptSecretProvider"))
    assert isinstance(DynamicProviderHost().provider(guarded_serialize_provider(KeptSecretProvider())), KeptSecretProvider)


def test_the_values_are_secret_outputs():
    """`additionalSecretOutputs: [values]`: the engine stores them as secrets (the dynamic-provider host
    returns plain values, its Configure answering acceptSecrets=False), and the program's Outputs are
    secret, as RandomPassword's `result` was."""
    import pulumi

    from cloudstation_tools.mocks import ProgramMocks
    from tests.register_requests import RequestMonitor, decoded

    mocks = ProgramMocks()
    monitor = RequestMonitor(mocks)
    pulumi.runtime.settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project="kept", stack="unit", preview=False, monitor=monitor)
    seen = {}

    @pulumi.runtime.test
    def program():
        kept = kept_secret.KeptSecret("registry-auth-values", kept_secret.KeptSecretArgs(
            "cloudstation", "registry-auth", {"password": 32}, kept_secret.Cluster("ctx"),
            htpasswd=kept_secret.Htpasswd("htpasswd", "pusher", "password")))
        password = kept.value("password")

        def keep(values):
            seen.update(secret=values[0], password=values[1], htpasswd=values[2])

        return pulumi.Output.all(pulumi.Output.from_input(password.is_secret()), password, kept.value("htpasswd")).apply(keep)

    program()
    [request] = [decoded(r) for (type_, _n, _p), r in monitor.requests.items() if type_.endswith(":KeptSecret")]
    assert request["type"] == "pulumi-python:dynamic/secrets:KeptSecret"
    assert request["additionalSecretOutputs"] == ["values"]
    inputs = request["object"]
    assert {k: v for k, v in inputs.items() if k != "__provider"} == {
        "namespace": "cloudstation", "name": "registry-auth", "lengths": {"password": 32.0}, "cluster": True,
        "context": "ctx", "htpasswd": {"key": "htpasswd", "username": "pusher", "passwordKey": "password"}}
    assert seen["secret"] is True and len(seen["password"]) == 32 and seen["htpasswd"].startswith("pusher:$2")
