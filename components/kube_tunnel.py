"""A connection to a pod's port through the Kubernetes API, with nothing listening on this machine.

`PodTunnel(context, namespace, selector, port).dial(timeout)` finds a Running and Ready pod
matching `selector` in `namespace` and opens a connection to `port` of that pod through the API
server's `pods/portforward` subresource (a WebSocket, channel protocol `v4.channel.k8s.io`), with
the kubeconfig and context `kubectl --context <context>` would use (`KUBECONFIG`, else
~/.kube/config; exec plugins, client certificates and tokens as the official client loads them).
The bytes travel inside the connection to the API server (its TLS), which then reaches the pod
through its kubelet; NetworkPolicies do not apply to that last hop (the kubelet connects inside the
pod's network namespace), so the pod need not admit this machine.

Why not the API server's service proxy: kube-apiserver deletes the Authorization header after
authenticating a request (k8s.io/apiserver pkg/endpoints/filters/authentication.go), so a
registry's Basic auth could not reach the registry through it; a port-forward carries opaque bytes.

The registry's Basic credentials cross the API connection: a kubeconfig whose server is plain
`http://` to a non-loopback host is refused, and `insecure-skip-tls-verify: true` logs a warning.

RBAC the deployer needs in `namespace`: `list` on pods, and `get` and `create` on pods/portforward
(a WebSocket upgrade is a GET, authorized as `get`; since Kubernetes 1.35 also as `create`,
feature gate AuthorizePodWebsocketUpgradeCreatePermission, kubernetes/kubernetes#134577).

Upstream behaviour relied on (kubernetes Python client 37.0.1, as installed):
- `kubernetes.stream.portforward(api.connect_get_namespaced_pod_portforward, name, namespace,
  ports="N")` (stream/stream.py `_websocket_request`, stream/ws_client.py `portforward_call`)
  returns a `PortForward` whose `socket(N)` is one end of a `socket.socketpair()`; a daemon thread
  (`PortForward._proxy`) relays it to the WebSocket, channel 0 data, channel 1 errors, each
  channel's first frame the port (little endian). Bytes on the error channel close that socket, so
  the reader sees EOF; closing our end ends the thread and the WebSocket. One PortForward is one
  TCP connection to the pod.
- `_websocket_request` swaps `api_client.call_api` for the duration of the call: any other call
  on that ApiClient meanwhile (a pod list, another port-forward) would go through the swapped one,
  and overlapping swaps can leave it installed, so every call (each list, each port-forward) gets
  its own `ApiClient` over the shared, loaded `Configuration`: no lock, so a hung handshake holds
  up nothing but itself.
- Loading a kubeconfig runs its exec plugin (eks get-token, gke-gcloud-auth-plugin, kubelogin) and
  writes inline CA/certificate data to temp files (config/kube_config.py
  `_create_temp_file_with_content`, which records the file name before writing it, so concurrent
  loads can read a half-written CA file): one load per (kubeconfig, context) per process
  (`load_configuration`, under one lock); the loaded token is refreshed on expiry by the
  Configuration's `refresh_api_key_hook` (kube_config.py `_set_config`).
- Without a kubeconfig file, no context and `KUBERNETES_SERVICE_HOST` set (`pulumi up` in a CI
  pod), the pod's service account is used (config/incluster_config.py `InClusterConfigLoader`:
  https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the token and ca.crt under
  /var/run/secrets/kubernetes.io/serviceaccount), as client-go's `clientcmd` falls back to
  `rest.InClusterConfig` (which pulumi-kubernetes uses).
- A pod port that refuses after the handshake: the kubelet writes the error on the port's error
  channel (kubernetes pkg/kubelet/cri/streaming/portforward/portforward.go
  `handleStreamPortForwardErr`: JSON `{closeConnection, message}`; older kubelets plain text) and
  `PortForward._proxy` stores it (`PortForward.error(port)`) before closing our socket, so at EOF
  the message is there: `_ForwardSocket` raises it as a `TunnelError` naming the pod.
- The WebSocket handshake has no timeout (`create_websocket` passes none to websocket-client,
  whose `WebSocket` then blocks), so it runs in a worker thread that `dial` waits for at most
  `timeout` seconds.
- A refused handshake is raised as `ApiException(status=0, reason=str(e))` from inside the
  `except` (ws_client.py `portforward_call`), so the HTTP status is that of `e`, the
  `WebSocketBadStatusException` (`status_code`) in the exception's `__context__`.
- `KUBE_CONFIG_DEFAULT_LOCATION` is read from KUBECONFIG when the module is imported
  (config/kube_config.py), so the path is passed explicitly, read when the tunnel is made.
"""
from __future__ import annotations

import io
import json
import os
import sys
import threading
from typing import Any, Callable, Mapping, Optional
from urllib.parse import urlsplit

DEFAULT_KUBECONFIG = "~/.kube/config"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
IN_CLUSTER = "the pod's service account"
RBAC_HINT = "`list` on pods and `get` and `create` on pods/portforward"


class TunnelError(Exception):
    """No tunnel to the pod; str() names the namespace, selector and context, and what to fix."""


class ForwardClosed(TunnelError, ConnectionResetError):
    """The kubelet closed a port-forward that had carried answers before, with an error message:
    a ConnectionResetError too, so an HTTP client retries a reused idle connection on a new one."""


_configurations: dict[tuple, Any] = {}
_configurations_lock = threading.Lock()


def _warn(message: str) -> None:
    """pulumi.log.warn inside an engine; stderr elsewhere (the engine shows a plugin's stderr)."""
    try:
        import pulumi

        pulumi.log.warn(message)
    except Exception:  # noqa: BLE001 - no engine (tests, scripts): stderr
        print(f"warning: {message}", file=sys.stderr, flush=True)


def in_cluster(kubeconfig: str, context: Optional[str], env: Mapping[str, str]) -> bool:
    """No kubeconfig file, no context asked for, and the pod's API address set: the service account."""
    paths = [os.path.expanduser(p) for p in kubeconfig.split(os.pathsep) if p]
    return not context and bool(env.get("KUBERNETES_SERVICE_HOST")) and not any(os.path.exists(p) for p in paths)


def load_configuration(kubeconfig: str, context: Optional[str], env: Mapping[str, str] = os.environ,
                       service_account_dir: str = SERVICE_ACCOUNT_DIR):
    """The client `Configuration` of `context` in `kubeconfig` (or of the pod's service account, see
    `in_cluster`), loaded once per process (module docstring); raises TunnelError naming what to fix."""
    from kubernetes import client, config
    from kubernetes.config.incluster_config import InClusterConfigLoader

    incluster = in_cluster(kubeconfig, context, env)
    key = ("in-cluster", service_account_dir) if incluster else (kubeconfig, context)
    with _configurations_lock:
        if key in _configurations:
            return _configurations[key]
        configuration = client.Configuration()
        name = IN_CLUSTER if incluster else f"context {context}" if context else "the current context"
        source = service_account_dir if incluster else kubeconfig
        try:
            if incluster:
                InClusterConfigLoader(token_filename=os.path.join(service_account_dir, "token"),
                                      cert_filename=os.path.join(service_account_dir, "ca.crt"),
                                      environ=env).load_and_set(configuration)
            else:
                config.load_kube_config(config_file=os.path.expanduser(kubeconfig), context=context,
                                        client_configuration=configuration, persist_config=False)
        except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as error:
            raise TunnelError(f"cannot load the kubeconfig ({name} of {source}): {error}") from None
        _check_transport(configuration, name, source)
        _serialize_refresh(configuration)
        _configurations[key] = configuration
        return configuration


_refresh_lock = threading.Lock()


def _serialize_refresh(configuration) -> None:
    """The shared Configuration's token refresh (client/configuration.py `get_api_key_with_prefix`
    calls `refresh_api_key_hook` before every request) re-runs an expired exec plugin and rewrites
    temp files: one thread at a time. kube_config.py `_set_config` installs a new hook on each
    refresh, so it is wrapped again after each."""
    hook = configuration.refresh_api_key_hook
    if hook is None or getattr(hook, "serialized", False):
        return

    def refresh(target) -> None:
        with _refresh_lock:
            hook(target)
            _serialize_refresh(target)

    refresh.serialized = True
    configuration.refresh_api_key_hook = refresh


def _check_transport(configuration, name: str, source: str) -> None:
    """The registry's credentials travel inside the API connection: never in clear to another host."""
    from components.transport import is_loopback

    server = urlsplit(configuration.host)
    if server.scheme == "http" and not is_loopback(server.hostname):
        raise TunnelError(f"the Kubernetes API of {name} ({source}) is {configuration.host}, plain http to a host "
                          f"that is not this machine: the registry's credentials would cross the network in clear. "
                          f"Use the cluster's https address in that kubeconfig, or set platform.registry.pushHost "
                          f"to the registry's https address")
    if server.scheme == "https" and not configuration.verify_ssl:
        _warn(f"{name} ({source}) sets insecure-skip-tls-verify: the registry's credentials go through the "
              f"Kubernetes API at {configuration.host} without checking who answers")


def source_text(kubeconfig: str, context: Optional[str], env: Mapping[str, str],
                service_account_dir: str = SERVICE_ACCOUNT_DIR) -> str:
    """Whose credentials reach the cluster (`load_configuration`), for messages."""
    if in_cluster(kubeconfig, context, env):
        return f"{IN_CLUSTER} ({service_account_dir})"
    return f"{f'context {context}' if context else 'the current context'} of {kubeconfig}"


def selector_text(selector: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def kubeconfig_path(env: Mapping[str, str] = os.environ) -> str:
    """What kubectl reads: $KUBECONFIG (a list of files, merged), else ~/.kube/config."""
    return env.get("KUBECONFIG") or DEFAULT_KUBECONFIG


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready and not being deleted (the endpoints controller's notion of a serving pod)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def choose(pods: list[Mapping[str, Any]]) -> Optional[str]:
    """The pod to forward to: the first Ready one by name (deterministic, so every dial of a run
    reaches the same pod while it serves)."""
    names = sorted(p["metadata"]["name"] for p in pods if is_ready(p))
    return names[0] if names else None


def status_of(error: BaseException) -> int:
    """The HTTP status of an ApiException, or of the WebSocket handshake it wraps (see above)."""
    status = getattr(error, "status", 0) or 0
    cause = error.__cause__ or error.__context__
    return status or getattr(cause, "status_code", 0) or 0


def message_of(error: BaseException) -> str:
    """The API server's own message (a Status object's `message`), else the exception's reason."""
    cause = error.__cause__ or error.__context__
    body = getattr(error, "body", None) or getattr(cause, "resp_body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message or getattr(error, "reason", None) or error)[:300]


class _ForwardSocket:
    """Our end of one port-forward (`PortForward.socket(port)`): at EOF (or a send refused since the
    relay closed our socket), a message the kubelet wrote
    on the port's error channel is raised (module docstring) and the pod is forgotten (`on_error`),
    so the next dial lists the pods again. `makefile` reads through `recv_into` (http.client reads
    answers through `sock.makefile("rb")`)."""

    def __init__(self, forward, port: int, where: str, on_error: Callable[[], None]):
        self._forward, self._socket, self._port = forward, forward.socket(port), port
        self._where, self._on_error = where, on_error
        self._received = 0

    def __getattr__(self, name: str):
        return getattr(self._socket, name)

    def _eof(self) -> None:
        error = self._forward.error(self._port)
        if not error:
            return
        try:
            message = json.loads(error).get("message") or error  # kubelet's {closeConnection, message}
        except (ValueError, AttributeError):
            message = error
        self._on_error()
        kind = ForwardClosed if self._received else TunnelError
        raise kind(f"the port-forward to {self._where} closed: {str(message).strip()[:300]}")

    def sendall(self, data, flags: int = 0) -> None:
        try:
            self._socket.sendall(data, flags)
        except OSError:  # EPIPE: the relay closed our socket, after storing the kubelet's error if any
            self._eof()
            raise

    def send(self, data, flags: int = 0) -> int:
        try:
            return self._socket.send(data, flags)
        except OSError:
            self._eof()
            raise

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:
        try:
            size = self._socket.recv_into(buffer, nbytes, flags)
        except ConnectionError:  # the relay closed our socket with our request unread: a reset, not EOF
            self._eof()
            raise
        if size:
            self._received += size
        elif len(buffer) and nbytes >= 0:
            self._eof()
        return size

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        buffer = bytearray(bufsize)
        return bytes(buffer[:self.recv_into(buffer, bufsize, flags)])

    def makefile(self, mode: str = "r", buffering: Optional[int] = None, **_kwargs):
        if mode != "rb":
            return self._socket.makefile(mode, buffering, **_kwargs)
        return io.BufferedReader(_Reader(self), buffering or io.DEFAULT_BUFFER_SIZE)


class _Reader(io.RawIOBase):
    def __init__(self, sock: _ForwardSocket):
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


class PodTunnel:
    """Connections to `port` of a Ready pod matching `selector` in `namespace` (module docstring).
    Thread-safe; `dial` is the `dial` argument of components/registry_api.py `for_url`."""

    def __init__(self, context: Optional[str], namespace: str, selector: Mapping[str, str], port: int, *,
                 env: Mapping[str, str] = os.environ, request_timeout: float = 30,
                 service_account_dir: str = SERVICE_ACCOUNT_DIR):
        if not selector:
            raise TunnelError(f"no pod selector for the tunnel to namespace {namespace}")
        self.context, self.namespace, self.selector, self.port = context, namespace, dict(selector), int(port)
        self.env = env
        self.kubeconfig = kubeconfig_path(env)
        self.service_account_dir = service_account_dir
        self.request_timeout = request_timeout
        self._pod: Optional[str] = None

    # --- naming things in errors ---------------------------------------------------------------

    @property
    def where(self) -> str:
        return (f"namespace {self.namespace}, pods with labels {selector_text(self.selector)}, "
                f"{source_text(self.kubeconfig, self.context, self.env, self.service_account_dir)}")

    def _refused(self, action: str, error: BaseException) -> TunnelError:
        status = status_of(error)
        message = message_of(error)
        if status == 403:
            return TunnelError(f"the Kubernetes API refused to {action} ({self.where}): HTTP 403 {message}. "
                               f"`pulumi up` needs {RBAC_HINT} in namespace {self.namespace}")
        if status == 401:
            return TunnelError(f"the Kubernetes API did not accept the credentials of {self.where} to {action} "
                               f"(HTTP 401 {message}): log in again (e.g. `kubectl get pods -n {self.namespace}`)")
        return TunnelError(f"cannot {action} ({self.where}): {f'HTTP {status} ' if status else ''}{message}")

    # --- the API -----------------------------------------------------------------------------------

    def _core(self):
        """A CoreV1Api on a new ApiClient (one per call: portforward swaps its call_api, see the
        module docstring) over the process's loaded Configuration."""
        from kubernetes import client

        configuration = load_configuration(self.kubeconfig, self.context, self.env, self.service_account_dir)
        return client.CoreV1Api(client.ApiClient(configuration))

    def ready_pod(self) -> str:
        """List the pods now and choose one (`choose`); a clear error when none is Ready."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        core = self._core()
        try:
            answer = core.list_namespaced_pod(self.namespace, label_selector=selector_text(self.selector),
                                              _preload_content=False, _request_timeout=self.request_timeout)
            pods = json.loads(answer.data).get("items") or []
        except ApiException as error:
            raise self._refused("list pods", error) from None
        except (OSError, ValueError, HTTPError) as error:  # refused, timed out, TLS, not JSON
            raise TunnelError(f"cannot reach the Kubernetes API of {self.where}: {type(error).__name__}: "
                              f"{str(error)[:200]}") from None
        finally:
            core.api_client.close()
        name = choose(pods)
        if name is None:
            found = ", ".join(sorted(f"{p['metadata']['name']} ({(p.get('status') or {}).get('phase', '?')}"
                                     f"{', not Ready' if not is_ready(p) else ''})" for p in pods)) or "none"
            raise TunnelError(f"no Running and Ready pod to forward port {self.port} to ({self.where}); "
                              f"pods found: {found}")
        return name

    def _forget(self, pod: str) -> None:
        if self._pod == pod:
            self._pod = None

    def _forward(self, pod: str, timeout: float):
        """One port-forward connection to `pod` (see the module docstring for the worker thread)."""
        from kubernetes.stream import portforward

        core = self._core()
        result: dict[str, Any] = {}
        abandoned = threading.Event()

        def open_forward() -> None:
            try:
                forward = portforward(core.connect_get_namespaced_pod_portforward, pod, self.namespace,
                                      ports=str(self.port))
                if abandoned.is_set():
                    forward.close()  # dial gave up meanwhile: end the WebSocket too
                result["forward"] = forward
            except BaseException as error:  # noqa: BLE001 - handed to dial
                result["error"] = error

        worker = threading.Thread(target=open_forward, daemon=True,
                                  name=f"port-forward {self.namespace}/{pod}:{self.port}")
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            abandoned.set()
            raise TimeoutError(f"the Kubernetes API did not open the port-forward within {timeout:g} s")
        if "error" in result:
            raise result["error"]
        connection = _ForwardSocket(result["forward"], self.port, f"pod {self.namespace}/{pod} port {self.port}",
                                    lambda: self._forget(pod))
        connection.settimeout(timeout)
        return connection

    def dial(self, timeout: Optional[float] = None):
        """A connected socket to the pod's port. The pod chosen first is reused while it accepts;
        when a forward to it fails (it may have been deleted or rescheduled), the pods are listed
        again once and the new choice tried."""
        from kubernetes.client.exceptions import ApiException

        # http.client passes its own default (a sentinel object) when it was given no timeout.
        timeout = timeout if isinstance(timeout, (int, float)) and timeout > 0 else self.request_timeout
        pod = self._pod or self.ready_pod()
        for attempt in (1, 2):
            try:
                connection = self._forward(pod, timeout)
                self._pod = pod
                return connection
            except ApiException as error:
                if status_of(error) in (401, 403):
                    raise self._refused(f"open a port-forward to pod {pod} port {self.port}", error) from None
                failure = error
            except (OSError, TimeoutError) as error:
                failure = error
            if attempt == 1:
                self._pod = None
                pod = self.ready_pod()
        raise TunnelError(f"cannot open a port-forward to pod {pod} port {self.port} ({self.where}): "
                          f"{message_of(failure) if isinstance(failure, ApiException) else failure}")


def dialer(target: Optional[Mapping[str, Any]], *, env: Mapping[str, str] = os.environ,
           timeout: float = 30) -> Optional[Callable[[Optional[float]], Any]]:
    """`PodTunnel(...).dial` for a `{context, namespace, selector, port}` mapping (the build
    provider's `registryTunnel` input); None for no tunnel."""
    if not target:
        return None
    return PodTunnel(target.get("context") or None, target["namespace"], target["selector"], int(target["port"]),
                     env=env, request_timeout=timeout).dial
