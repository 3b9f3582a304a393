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
  and overlapping swaps can leave it installed, so every call on a tunnel's ApiClient holds the
  tunnel's `calls` lock.
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

import json
import os
import threading
from typing import Any, Callable, Mapping, Optional

DEFAULT_KUBECONFIG = "~/.kube/config"
RBAC_HINT = "`list` on pods and `get` and `create` on pods/portforward"

class TunnelError(Exception):
    """No tunnel to the pod; str() names the namespace, selector and context, and what to fix."""


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


def _status_of(error: BaseException) -> int:
    """The HTTP status of an ApiException, or of the WebSocket handshake it wraps (see above)."""
    status = getattr(error, "status", 0) or 0
    cause = error.__cause__ or error.__context__
    return status or getattr(cause, "status_code", 0) or 0


def _message_of(error: BaseException) -> str:
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


class PodTunnel:
    """Connections to `port` of a Ready pod matching `selector` in `namespace` (module docstring).
    Thread-safe; `dial` is the `dial` argument of components/registry_api.py `for_url`."""

    def __init__(self, context: Optional[str], namespace: str, selector: Mapping[str, str], port: int, *,
                 env: Mapping[str, str] = os.environ, request_timeout: float = 30):
        if not selector:
            raise TunnelError(f"no pod selector for the tunnel to namespace {namespace}")
        self.context, self.namespace, self.selector, self.port = context, namespace, dict(selector), int(port)
        self.kubeconfig = kubeconfig_path(env)
        self.request_timeout = request_timeout
        self._api = None
        self._pod: Optional[str] = None
        self._lock = threading.Lock()
        self.calls = threading.Lock()
        """Held by every call on the ApiClient (portforward swaps its call_api, see above)."""

    # --- naming things in errors ---------------------------------------------------------------

    @property
    def where(self) -> str:
        context = f"context {self.context}" if self.context else "the current context"
        return (f"namespace {self.namespace}, pods with labels {selector_text(self.selector)}, {context} "
                f"of {self.kubeconfig}")

    def _refused(self, action: str, error: BaseException) -> TunnelError:
        status = _status_of(error)
        message = _message_of(error)
        if status == 403:
            return TunnelError(f"the Kubernetes API refused to {action} ({self.where}): HTTP 403 {message}. "
                               f"`pulumi up` needs {RBAC_HINT} in namespace {self.namespace}")
        if status == 401:
            return TunnelError(f"the Kubernetes API did not accept the credentials of {self.where} to {action} "
                               f"(HTTP 401 {message}): log in again (e.g. `kubectl get pods -n {self.namespace}`)")
        return TunnelError(f"cannot {action} ({self.where}): {f'HTTP {status} ' if status else ''}{message}")

    # --- the API -----------------------------------------------------------------------------------

    def _core(self):
        """The CoreV1Api of the kubeconfig's context, loaded once (exec plugins run at load)."""
        with self._lock:
            if self._api is None:
                from kubernetes import client, config

                try:
                    api_client = config.new_client_from_config(
                        config_file=os.path.expanduser(self.kubeconfig), context=self.context, persist_config=False)
                except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as error:
                    raise TunnelError(f"cannot load the kubeconfig ({self.where}): {error}") from None
                self._api = client.CoreV1Api(api_client)
            return self._api

    def ready_pod(self) -> str:
        """List the pods now and choose one (`choose`); a clear error when none is Ready."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        core = self._core()
        if not self.calls.acquire(timeout=self.request_timeout):
            raise TunnelError(f"the Kubernetes API of {self.where} is still opening an earlier port-forward "
                              f"after {self.request_timeout:g} s")
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
            self.calls.release()
        name = choose(pods)
        if name is None:
            found = ", ".join(sorted(f"{p['metadata']['name']} ({(p.get('status') or {}).get('phase', '?')}"
                                     f"{', not Ready' if not is_ready(p) else ''})" for p in pods)) or "none"
            raise TunnelError(f"no Running and Ready pod to forward port {self.port} to ({self.where}); "
                              f"pods found: {found}")
        return name

    def _forward(self, pod: str, timeout: float):
        """One port-forward connection to `pod` (see the module docstring for the worker thread)."""
        from kubernetes.stream import portforward

        core = self._core()
        result: dict[str, Any] = {}
        abandoned = threading.Event()

        def open_forward() -> None:
            try:
                with self.calls:
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
        connection = result["forward"].socket(self.port)
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
                if _status_of(error) in (401, 403):
                    raise self._refused(f"open a port-forward to pod {pod} port {self.port}", error) from None
                failure = error
            except (OSError, TimeoutError) as error:
                failure = error
            if attempt == 1:
                self._pod = None
                pod = self.ready_pod()
        raise TunnelError(f"cannot open a port-forward to pod {pod} port {self.port} ({self.where}): "
                          f"{_message_of(failure) if isinstance(failure, ApiException) else failure}")


def dialer(target: Optional[Mapping[str, Any]], *, env: Mapping[str, str] = os.environ,
           timeout: float = 30) -> Optional[Callable[[Optional[float]], Any]]:
    """`PodTunnel(...).dial` for a `{context, namespace, selector, port}` mapping (the build
    provider's `registryTunnel` input); None for no tunnel."""
    if not target:
        return None
    return PodTunnel(target.get("context") or None, target["namespace"], target["selector"], int(target["port"]),
                     env=env, request_timeout=timeout).dial
