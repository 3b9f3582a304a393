"""The build provider reaches the registry through its own port-forward through the Kubernetes API
(components/kube_tunnel.py, components/registry_api.py `for_url(dial=...)`), so `pulumi up` in
armada mode needs no registry port-forward on the deployer's machine (docs/builds.md).

Against a fake API server (tests/fake_kube_api.py: bearer token required, pod list, WebSocket
port-forward with v4.channel.k8s.io framing) relaying to a real docker-registry with htpasswd
auth. The client is only given the registry's in-cluster name, which does not resolve here: the
registry is not reachable directly, so every answer came through the tunnel (and the fake counts
the bytes it relayed)."""
from __future__ import annotations

import hashlib
import socket
import threading
import time
from pathlib import Path

import pytest

from components import kube_tunnel, registry_api
from components.entity_build import EntityBuildProvider
from components.kube_tunnel import PodTunnel, TunnelError
from components.registry_api import Credentials, RegistryError
from tests.fake_kube_api import FakeKubeApi, fresh_kube_configurations  # noqa: F401 (autouse fixture)
from tests.registry_server import build_oci_image, free_port, registry  # noqa: F401 (fixture)
from tests.test_entity_build import (  # noqa: F401 (logged is a fixture)
    armada_with, basic, logged, make_context, props_for, push_image, succeeding,
)

NAMESPACE = "cloudstation"
SELECTOR = {"app.kubernetes.io/name": "registry", "app.kubernetes.io/instance": "registry"}
PORT = 5000
IN_CLUSTER_URL = f"http://registry.{NAMESPACE}.svc.cluster.local:{PORT}"
"""What the program passes as registryUrl with a tunnel: only the Host header."""


def _unresolvable(url: str) -> bool:
    host = url.split("//")[1].split(":")[0]
    try:
        socket.getaddrinfo(host, PORT)
    except socket.gaierror:
        return True
    return False


@pytest.fixture
def api(registry, tmp_path, monkeypatch):
    """A fake API server with one Ready registry pod whose port 5000 is the real registry, and
    KUBECONFIG pointing at it (current context `fake`)."""
    assert _unresolvable(IN_CLUSTER_URL), "the in-cluster name must not resolve here, or the test proves nothing"
    with FakeKubeApi() as server:
        server.add_pod("registry-7d9f-abcde", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield server


def tunnel(context=None, namespace=NAMESPACE, selector=SELECTOR) -> PodTunnel:
    return PodTunnel(context, namespace, selector, PORT)


def client(registry, dial) -> registry_api.DistributionRegistry:
    return registry_api.for_url(IN_CLUSTER_URL, Credentials(*registry.auth), dial=dial)


def test_tag_check_blob_upload_and_manifest_digest_go_through_the_tunnel(registry, api, tmp_path):
    through = client(registry, tunnel().dial)
    assert through.manifest_digest("shop/cart", "v1") is None  # the tag check
    data = b"a build context " * 4096
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    through.upload_blob("builds/shop/cart", digest, data)  # POST then PUT to the upload's Location
    assert through.blob_exists("builds/shop/cart", digest)
    pushed = push_image(registry, tmp_path, "shop/cart", "v1")
    assert through.manifest_digest("shop/cart", "v1") == pushed  # the digest read
    # Every byte went through the fake API server, over tunnels to the Ready pod only.
    assert api.tunnels and {t.pod for t in api.tunnels} == {"registry-7d9f-abcde"}
    assert sum(t.sent for t in api.tunnels) > len(data)
    # Kept alive: the connection pool reuses one tunnel for consecutive requests.
    assert len(api.tunnels) == 1
    kinds = [kind for _method, _path, kind in api.requests]
    assert kinds == ["list pods", "create pods/portforward"]


def test_without_the_tunnel_the_registry_is_not_reachable_and_credentials_stay_home(registry, api):
    # No dial: the in-cluster name is refused credentials over plain http (registry_api's rule) ...
    with pytest.raises(RegistryError, match="plain http"):
        registry_api.for_url(IN_CLUSTER_URL, Credentials(*registry.auth))
    # ... and, anonymously, is not reachable at all: a pass above proves the tunnel.
    with pytest.raises(RegistryError, match="cannot reach"):
        registry_api.for_url(IN_CLUSTER_URL).manifest_digest("shop/cart", "v1")
    with pytest.raises(RegistryError, match="plain http only"):
        registry_api.for_url(IN_CLUSTER_URL.replace("http:", "https:"), Credentials(*registry.auth), dial=tunnel().dial)
    assert api.tunnels == []


def test_the_tunnel_carries_only_the_registrys_own_origin(registry, api):
    """A redirect elsewhere is dialled directly, never through the tunnel (and without credentials:
    registry_api `_http`); the tunnel's dial is keyed by the registry's origin only."""
    through = client(registry, tunnel().dial)
    assert set(through.connections.dials) == {("http", f"registry.{NAMESPACE}.svc.cluster.local", PORT)}


def test_no_ready_pod_is_a_clear_error_naming_namespace_selector_and_context(registry, tmp_path, monkeypatch):
    with FakeKubeApi() as server:
        server.add_pod("registry-starting", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)}, ready=False)
        server.add_pod("registry-pending", NAMESPACE, SELECTOR, {}, phase="Pending", ready=False)
        server.add_pod("registry-elsewhere", "other", SELECTOR, {PORT: ("127.0.0.1", registry.port)})
        server.add_pod("not-the-registry", NAMESPACE, {"app.kubernetes.io/name": "web"}, {PORT: ("127.0.0.1", 1)})
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        with pytest.raises(TunnelError) as caught:
            client(registry, tunnel(context="fake").dial).manifest_digest("shop/cart", "v1")
        assert server.tunnels == []
    message = str(caught.value)
    assert "no Running and Ready pod" in message and f"namespace {NAMESPACE}" in message
    assert "app.kubernetes.io/instance=registry,app.kubernetes.io/name=registry" in message
    assert "context fake" in message and str(tmp_path / "kubeconfig") in message
    assert "registry-starting (Running, not Ready)" in message and "registry-pending (Pending, not Ready)" in message
    assert "registry-elsewhere" not in message and "not-the-registry" not in message


@pytest.mark.parametrize("forbidden", [("create", "pods/portforward"), ("list", "pods")])
def test_rbac_refusals_name_the_verbs_pulumi_up_needs(registry, api, forbidden):
    api.forbidden.add(forbidden)
    with pytest.raises(TunnelError) as caught:
        client(registry, tunnel().dial).manifest_digest("shop/cart", "v1")
    message = str(caught.value)
    assert "HTTP 403" in message and f'cannot {forbidden[0]} resource "{forbidden[1]}"' in message  # the server's words
    assert "`list` on pods and `get` and `create` on pods/portforward" in message
    assert f"in namespace {NAMESPACE}" in message
    assert api.tunnels == []


def test_a_wrong_token_is_refused_and_nothing_is_forwarded(registry, api, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(api.write_kubeconfig(tmp_path / "stale", token="an-expired-token")))
    with pytest.raises(TunnelError) as caught:
        client(registry, tunnel().dial).manifest_digest("shop/cart", "v1")
    assert "did not accept the credentials" in str(caught.value) and "HTTP 401" in str(caught.value)
    assert api.tunnels == [] and api.requests  # asked, and refused


def test_the_stack_context_chooses_the_cluster_and_unset_means_the_current_one(registry, api, tmp_path, monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}"
    path = api.write_kubeconfig(tmp_path / "two", current="elsewhere", extra_contexts={"elsewhere": closed})
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert client(registry, tunnel(context="fake").dial).manifest_digest("shop/cart", "nothing") is None
    with pytest.raises(TunnelError) as caught:
        client(registry, tunnel(context=None).dial).manifest_digest("shop/cart", "nothing")
    assert "cannot reach the Kubernetes API" in str(caught.value) and "the current context" in str(caught.value)
    with pytest.raises(TunnelError, match="cannot load the kubeconfig"):
        client(registry, tunnel(context="no-such-context").dial).manifest_digest("shop/cart", "nothing")


def test_a_pod_that_went_away_is_replaced_by_listing_the_pods_again(registry, api):
    api.add_pod("registry-zz-second", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
    dial = tunnel().dial
    first = dial(5)
    first.close()
    api.remove_pod("registry-7d9f-abcde")  # deleted, e.g. rescheduled
    through = client(registry, dial)
    assert through.manifest_digest("shop/cart", "nothing") is None
    assert [t.pod for t in api.tunnels] == ["registry-7d9f-abcde", "registry-zz-second"]
    assert [kind for _m, _p, kind in api.requests].count("list pods") == 2  # listed again once


@pytest.mark.parametrize("error_format", ["json", "text"])
def test_a_pod_port_that_refuses_names_the_pod_and_the_next_dial_lists_again(registry, api, error_format):
    """The kubelet answers a refused pod port on the error channel after the handshake (JSON
    {closeConnection, message} from handleStreamPortForwardErr; plain text from older kubelets):
    the request fails with that message and the pod's name, and the pod is no longer the chosen one."""
    api.error_format = error_format
    api.pods[0].ports = {PORT: ("127.0.0.1", free_port())}  # the container does not listen (yet)
    api.add_pod("registry-zz-second", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
    through = client(registry, tunnel().dial)
    with pytest.raises(TunnelError) as caught:
        through.manifest_digest("shop/cart", "nothing")
    message = str(caught.value)
    assert f"pod {NAMESPACE}/registry-7d9f-abcde port {PORT}" in message
    assert "error forwarding port 5000 to pod registry-7d9f-abcde" in message and "Connection refused" in message
    assert "closeConnection" not in message  # the kubelet's message, not its JSON
    api.pods[0].ready = False  # what its readiness probe reports meanwhile
    assert through.manifest_digest("shop/cart", "nothing") is None
    assert [t.pod for t in api.tunnels] == ["registry-zz-second"]
    assert [kind for _m, _p, kind in api.requests].count("list pods") == 2


def test_a_kept_alive_tunnel_the_kubelet_closed_with_an_error_is_replaced(registry, api):
    """A pooled connection whose forward broke while idle (the kubelet's error, then close): the
    request is retried on a new connection (ForwardClosed is a ConnectionResetError, registry_api
    STALE), which lists the pods again since the broken pod is forgotten."""
    through = client(registry, tunnel().dial)
    assert through.manifest_digest("shop/cart", "nothing") is None
    api.add_pod("registry-zz-second", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
    api.pods[0].ready = False
    api.fail_tunnels("error forwarding port 5000 to pod registry-7d9f-abcde, uid u: read: connection reset by peer")
    assert through.manifest_digest("shop/cart", "nothing") is None
    assert [t.pod for t in api.tunnels] == ["registry-7d9f-abcde", "registry-zz-second"]
    assert [kind for _m, _p, kind in api.requests].count("list pods") == 2


def test_concurrent_dials_each_get_a_websocket_tunnel_and_share_one_config_load(registry, api, monkeypatch):
    """kubernetes.stream.portforward swaps ApiClient.call_api while it runs (stream/stream.py
    `_websocket_request`): every list and port-forward gets its own ApiClient, or a pod list goes
    out through the port-forward call (`Missing required parameter ports`). The kubeconfig is loaded
    once for all (an exec plugin runs per load; kube_config `_create_temp_file_with_content` races).
    Eight threads, each with its own PodTunnel (one per provider operation), listing and forwarding."""
    from kubernetes import config

    loads = []
    real = config.load_kube_config

    def counting(*args, **kwargs):
        loads.append(kwargs.get("context"))
        threading.Event().wait(0.2)  # a slow exec plugin: the others arrive meanwhile
        return real(*args, **kwargs)

    monkeypatch.setattr(config, "load_kube_config", counting)
    results, errors = [], []

    def one():
        try:
            results.append(client(registry, tunnel().dial).manifest_digest("shop/cart", "nothing"))
        except Exception as error:  # noqa: BLE001 - collected
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and results == [None] * 8
    assert len(api.tunnels) == 8
    assert loads == [None]
    assert tunnel().ready_pod() == "registry-7d9f-abcde"  # a plain list still works


def test_token_refreshes_of_the_shared_configuration_run_one_at_a_time(api, monkeypatch):
    """The loaded Configuration is shared by every request; its refresh hook (an expired exec
    plugin's token is fetched again, kube_config.py `_set_config`, which installs a new hook each
    time) runs in one thread at a time, also after it replaced itself."""
    from kubernetes import config

    inside, most = [0], [0]
    lock = threading.Lock()

    def install(configuration):
        def hook(target):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.05)  # an exec plugin run
            with lock:
                inside[0] -= 1
            install(target)  # as kube_config's _set_config does

        configuration.refresh_api_key_hook = hook

    real = config.load_kube_config

    def loading(*args, **kwargs):
        real(*args, **kwargs)
        install(kwargs["client_configuration"])

    monkeypatch.setattr(config, "load_kube_config", loading)
    configuration = kube_tunnel.load_configuration(kube_tunnel.kubeconfig_path(), None)
    threads = [threading.Thread(target=lambda: [configuration.get_api_key_with_prefix("BearerToken")
                                                for _ in range(3)]) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most == [1]


def test_a_hung_handshake_does_not_hold_up_the_next_dial(registry, api):
    """No lock across port-forwards: while one handshake hangs, another dial of the same tunnel
    opens its own at once; the hung one gives up at its timeout."""
    pods = tunnel()
    assert pods.ready_pod() == "registry-7d9f-abcde"
    pods._pod = "registry-7d9f-abcde"
    api.handshake_delays = [4.0]
    hung: list = []
    first = threading.Thread(target=lambda: hung.append(_outcome(pods.dial, 1.5)))
    first.start()
    while not any(kind == "create pods/portforward" for _m, _p, kind in api.requests):
        time.sleep(0.01)
    started = time.monotonic()
    second = pods.dial(3)
    assert time.monotonic() - started < 1.0
    second.close()
    first.join(10)
    assert hung and not isinstance(hung[0], Exception)  # its retry (the second attempt) got through
    hung[0].close()


def _outcome(dial, timeout):
    try:
        return dial(timeout)
    except Exception as error:  # noqa: BLE001 - returned
        return error


def test_a_pod_list_while_a_port_forward_opens_goes_out_as_a_list(registry, api):
    """Deterministic overlap of the two: a slow port-forward handshake, and a list meanwhile on the
    same tunnel's client (what a re-list does while another connection opens). Without the tunnel's
    `calls` lock the list would go through portforward's swapped call_api and fail."""
    pods = tunnel()
    assert pods.ready_pod() == "registry-7d9f-abcde"
    api.handshake_delay = 0.5
    opened = []
    opening = threading.Thread(target=lambda: opened.append(pods.dial(5)))
    opening.start()
    while not any(kind == "create pods/portforward" for _m, _p, kind in api.requests):
        threading.Event().wait(0.01)
    assert pods.ready_pod() == "registry-7d9f-abcde"
    opening.join(10)
    # The fake, as the kubelet, sends the port frames before it connects to the pod's port: the
    # dial may return before the relay is recorded.
    deadline = time.monotonic() + 5
    while not api.tunnels and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert len(opened) == 1 and len(api.tunnels) == 1
    opened[0].close()


# --- the build provider ----------------------------------------------------------------------------


def test_the_build_provider_builds_through_the_tunnel_with_no_registry_url_it_could_reach(
        registry, api, tmp_path, logged):
    context = make_context(tmp_path / "cart", extra="// tunnel\n")
    pushed: dict[str, str] = {}
    push = lambda item: pushed.setdefault("digest", push_image(  # noqa: E731 - the in-cluster executor's push
        registry, tmp_path, "shop/cart", item["labels"]["cloudstation.io/content-tag"]))
    target = {"namespace": NAMESPACE, "selector": SELECTOR, "port": float(PORT)}  # numbers arrive as doubles
    with armada_with(succeeding(push)) as armada:
        props = props_for(context, IN_CLUSTER_URL, basic(registry), armada.url, registryTunnel=target)
        assert EntityBuildProvider().check({}, props).failures == []
        result = EntityBuildProvider().create(props)
    assert result.outs["digest"] == pushed["digest"] == registry.digest_of("shop/cart", props["contentTag"])
    # The context went up through the tunnel; a refresh reads through it too.
    assert registry.digest_of("builds/shop/cart", props["contentTag"])
    assert sum(t.sent for t in api.tunnels) >= len(context.joinpath("src", "index.js").read_bytes())
    before = len(api.tunnels)
    read = EntityBuildProvider().read(result.id, result.outs)
    assert read.outs["digest"] == pushed["digest"] and len(api.tunnels) > before


def test_the_tunnel_is_no_replacing_input_and_a_bad_one_is_refused(tmp_path):
    old = props_for(make_context(tmp_path / "cart"), IN_CLUSTER_URL, "Basic eDp5", "http://127.0.0.1:2")
    provider = EntityBuildProvider()
    tunnel_input = {"namespace": NAMESPACE, "selector": SELECTOR, "port": PORT}
    for news in ({**old, "registryTunnel": tunnel_input}, {**old, "registryTunnel": {**tunnel_input, "context": "x"}}):
        diff = provider.diff("id", {**old, "registryTunnel": {**tunnel_input, "port": 5001}}, news)
        assert diff.changes is True and diff.replaces == []  # an update: refresh must get the new tunnel
    same = {**old, "registryTunnel": {**tunnel_input, "port": float(PORT)}}  # numbers arrive as doubles
    assert provider.diff("id", same, {**old, "registryTunnel": tunnel_input}).changes is False
    for bad in ({"namespace": NAMESPACE, "selector": {}, "port": PORT}, {"namespace": "", "selector": SELECTOR, "port": 1},
                {"namespace": NAMESPACE, "selector": SELECTOR, "port": 70000}, "cloudstation/registry"):
        failures = provider.check({}, {**old, "registryTunnel": bad}).failures
        assert [f.property for f in failures] == ["registryTunnel"], bad


def test_a_stack_built_before_the_tunnel_updates_its_outputs_so_refresh_uses_the_tunnel(
        registry, api, tmp_path, logged):
    """Outputs from before the tunnel existed (registryUrl http://localhost:32000, no
    registryTunnel): a same step would keep them and refresh would go there (pulumi step.go
    SameStep.Apply keeps old outputs; dynamic/__main__.py Read gets them). The diff is an update,
    which finds the tag through the tunnel (no job) and writes outputs a refresh then uses."""
    context = make_context(tmp_path / "cart", extra="// before the tunnel\n")
    stale = f"http://127.0.0.1:{free_port()}"  # the old port-forward, gone
    old_props = props_for(context, stale, basic(registry), "http://127.0.0.1:1")  # Armada: any job would fail
    digest = push_image(registry, tmp_path, "shop/cart", old_props["contentTag"], b"before the tunnel")
    old_outs = {**old_props, "digest": digest, "ref": "old", "jobId": "j-1"}
    resource_id = f"shop/cart:{old_props['contentTag']}"
    with pytest.raises(RegistryError, match="cannot reach"):
        EntityBuildProvider().read(resource_id, old_outs)
    target = {"namespace": NAMESPACE, "selector": SELECTOR, "port": float(PORT)}
    news = {**old_props, "registryUrl": IN_CLUSTER_URL, "registryTunnel": target}
    diff = EntityBuildProvider().diff(resource_id, old_outs, news)
    assert diff.changes is True and diff.replaces == []
    updated = EntityBuildProvider().update(resource_id, old_outs, news)
    assert updated.outs["digest"] == digest and updated.outs["jobId"] == ""
    assert updated.outs["registryTunnel"] == target and api.tunnels
    before = len(api.tunnels)
    assert EntityBuildProvider().read(resource_id, updated.outs).outs["digest"] == digest
    assert len(api.tunnels) > before


def test_in_a_pod_without_kubeconfig_the_service_account_is_used(registry, tmp_path, monkeypatch):
    """client-go's fallback (pulumi-kubernetes): no kubeconfig file, no context, KUBERNETES_SERVICE_HOST
    set -> https://host:port with the service account's token and CA (InClusterConfigLoader)."""
    with FakeKubeApi(tls=True, token="service-account-token") as server:
        server.add_pod("registry-7d9f-abcde", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text("service-account-token")
        (account / "ca.crt").write_bytes(server.ca_pem)
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": server.url.rsplit(":", 1)[1],
               "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"), "HOME": str(tmp_path)}
        pods = PodTunnel(None, NAMESPACE, SELECTOR, PORT, env=env, service_account_dir=str(account))
        assert client(registry, pods.dial).manifest_digest("shop/cart", "nothing") is None
        assert [t.pod for t in server.tunnels] == ["registry-7d9f-abcde"]
        # A context asked for, or a kubeconfig that exists, is not the pod's account.
        named = PodTunnel("ci", NAMESPACE, SELECTOR, PORT, env=env, service_account_dir=str(account))
        with pytest.raises(TunnelError, match="cannot load the kubeconfig"):
            named.dial(5)
        assert not kube_tunnel.in_cluster(str(server.write_kubeconfig(tmp_path / "kubeconfig")), None, env)
        assert not kube_tunnel.in_cluster(env["KUBECONFIG"], None, {})
        # A wrong CA is refused (the in-cluster connection is verified TLS).
        (account / "ca.crt").write_bytes(kube_tunnel_other_ca())
        kube_tunnel._configurations.clear()
        with pytest.raises(TunnelError, match="cannot reach the Kubernetes API"):
            PodTunnel(None, NAMESPACE, SELECTOR, PORT, env=env, service_account_dir=str(account)).dial(5)


def kube_tunnel_other_ca() -> bytes:
    from tests.fake_kube_api import _self_signed

    return _self_signed("127.0.0.1")[0]


def test_plain_http_to_another_host_is_refused_before_any_credential_is_sent(api, tmp_path, monkeypatch):
    path = api.write_kubeconfig(tmp_path / "clear", server="http://kube.example.com:8080")
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(TunnelError) as caught:
        tunnel(context="fake").dial(5)
    message = str(caught.value)
    assert "context fake" in message and "http://kube.example.com:8080" in message and "plain http" in message
    assert "https" in message and "platform.registry.pushHost" in message
    assert api.requests == []


def test_an_unverified_api_server_gets_a_warning(registry, tmp_path, monkeypatch, capsys):
    """Through pulumi.log.warn (the engine shows it), else on stderr (no engine)."""
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    with FakeKubeApi(tls=True) as server:
        server.add_pod("registry-7d9f-abcde", NAMESPACE, SELECTOR, {PORT: ("127.0.0.1", registry.port)})
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "insecure", insecure=True)))
        assert client(registry, tunnel().dial).manifest_digest("shop/cart", "nothing") is None
        [message] = warned
        assert "insecure-skip-tls-verify" in message and "without checking who answers" in message
        assert "the current context" in message and server.url in message
        # Verified TLS (the CA inline) warns nothing.
        monkeypatch.setenv("KUBECONFIG", str(server.write_kubeconfig(tmp_path / "verified")))
        assert client(registry, tunnel().dial).manifest_digest("shop/cart", "nothing") is None
        assert len(warned) == 1
    # Outside an engine pulumi.log may raise: the warning still reaches stderr.
    monkeypatch.setattr(pulumi.log, "warn", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no engine")))
    capsys.readouterr()
    kube_tunnel._warn("credentials to an unverified peer")
    assert "warning: credentials to an unverified peer" in capsys.readouterr().err


def test_the_dialer_reads_kubeconfig_when_the_tunnel_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "a"))
    assert kube_tunnel.dialer(None) is None
    dial = kube_tunnel.dialer({"namespace": NAMESPACE, "selector": SELECTOR, "port": 5000.0, "context": "c"})
    assert (dial.__self__.kubeconfig, dial.__self__.context, dial.__self__.port) == (str(tmp_path / "a"), "c", 5000)


@pytest.mark.parametrize("through_tunnel", [False, True], ids=["direct", "tunnel"])
def test_a_blob_over_the_answer_cap_is_found_by_its_head(registry, api, through_tunnel):
    """A retried build whose context (> 1 MiB) is already uploaded skips the upload: the HEAD's
    Content-Length is the blob's size (no body follows), never held against the 1 MiB answer cap."""
    data = hashlib.sha256(b"seed").digest() * (2 * 1024 * 1024 // 32)  # 2 MiB
    assert len(data) > registry_api.MAX_SMALL_ANSWER_BYTES
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    regs = client(registry, tunnel().dial) if through_tunnel else registry_api.for_url(
        registry.url, Credentials(*registry.auth))
    repository = f"builds/shop/big-{'tunnel' if through_tunnel else 'direct'}"  # one registry per module
    assert regs.blob_exists(repository, digest) is False
    regs.upload_blob(repository, digest, data)
    assert regs.blob_exists(repository, digest) is True
    assert regs.blob_exists(repository, digest) is True  # the connection is still usable afterwards
    assert bool(api.tunnels) is through_tunnel
