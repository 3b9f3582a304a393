"""A minimal client of the Armada server's queue REST API (the grpc-gateway on its HTTP port), and the
REST plumbing (`RestClient`) it shares with the jobs client (components/armada/jobs_api.py).

Routes and bodies follow `armada/armada-v0.22.7/pkg/api/api.swagger.json`: `POST /v1/queue`,
`GET | PUT | DELETE /v1/queue/{name}`, body `apiQueue`, errors `runtimeError`
(`{code, message, details}`; grpc-gateway v1 also sent `error`). Standard library only: it runs
inside Pulumi's dynamic-provider process.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Optional

from components.transport import DeadlineHTTPHandler, DeadlineHTTPSHandler, is_loopback

# gRPC status codes (google.rpc.Code) the gateway puts in `code`, for readable errors.
GRPC_CODES = {
    3: "InvalidArgument", 5: "NotFound", 6: "AlreadyExists", 7: "PermissionDenied",
    9: "FailedPrecondition", 13: "Internal", 14: "Unavailable", 16: "Unauthenticated",
}
RETRYABLE_STATUS = (502, 503, 504)
MAX_RESPONSE_BYTES = 1 << 20
"""A queue document or error is a few hundred bytes; a larger answer is refused, not read."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Every 3xx is an error: urllib would otherwise follow it, re-sending the Authorization
    header to wherever Location points (urllib/request.py HTTPRedirectHandler.redirect_request)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


# Answers, status line and headers included, are read by the request's `deadline`
# (components/transport.py): a socket timeout alone bounds one read, not a server dripping bytes.
_OPENER = urllib.request.build_opener(_NoRedirects, DeadlineHTTPHandler, DeadlineHTTPSHandler)


def _read(response, deadline: float) -> bytes:
    """The body, in chunks, within MAX_RESPONSE_BYTES and the call's deadline."""
    chunks, size = [], 0
    while True:
        chunk = response.read1(64 << 10) if hasattr(response, "read1") else response.read(64 << 10)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise ValueError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        if time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive before the deadline")
        chunks.append(chunk)


class ArmadaApiError(Exception):
    """A request the Armada server rejected or could not answer; str() says which and why."""

    api = "Armada API"

    def __init__(self, method: str, url: str, status: Optional[int], message: str, code: Optional[int] = None):
        self.method, self.url, self.status, self.code = method, url, status, code
        self.message = message
        where = f"HTTP {status}" if status is not None else "no answer"
        grpc = f", {GRPC_CODES.get(code, f'gRPC code {code}')}" if code else ""
        super().__init__(f"{self.api} {method} {url} failed ({where}{grpc}): {message}")


class QueueApiError(ArmadaApiError):
    """A queue request the Armada server rejected or could not answer."""

    api = "Armada queue API"


class QueueExists(QueueApiError):
    """409: a queue of that name already exists."""


def error_message(body: bytes) -> tuple[str, Optional[int]]:
    """The server's explanation from a grpc-gateway error body, and its gRPC code."""
    text = body.decode("utf-8", "replace").strip()
    try:
        document = json.loads(text)
    except ValueError:
        return text or "(empty response)", None
    if not isinstance(document, dict):
        return text, None
    message = document.get("message") or document.get("error") or text
    code = document.get("code")
    return str(message), code if isinstance(code, int) else None


class RestClient:
    """What every client of the server's REST API shares: bounded waits and reads, no redirects,
    credentials only over https or to loopback, grpc-gateway error bodies made readable.

    Connection failures and 502/503/504 are retried for `wait_seconds` (the server may still be
    starting during the `pulumi up` that installs it); answers such as 400/403/409 are not. A
    request that is not safe to send twice (`resend=False`, e.g. a job submission) is retried only
    when the connection was refused, i.e. nothing reached the server.
    """

    error: type = ArmadaApiError
    url_hint = "armada.queueApi.url; see docs/armada-queues.md"
    """Where the user sets the URL, named in the error when the server cannot be reached."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 30,
        wait_seconds: float = 0,
        headers: Optional[dict[str, str]] = None,
        retry_interval: float = 2,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.wait_seconds = wait_seconds
        self.headers = headers or {}
        self.retry_interval = retry_interval

    def _failure(self, method: str, url: str, status: Optional[int], message: str, code: Optional[int] = None):
        return self.error(method, url, status, message, code)

    def _request(self, method: str, path: str, body: Optional[dict] = None, *, resend: bool = True,
                 read=None) -> Any:
        """One call; the answer's JSON, or what `read(response, deadline)` makes of the answer."""
        url = self.base_url + path
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **self.headers}
        if data is not None:
            headers["Content-Type"] = "application/json"
        parts = urllib.parse.urlsplit(url)
        if any(k.lower() == "authorization" for k in headers) and parts.scheme != "https" and not is_loopback(
            parts.hostname
        ):
            raise self._failure(
                method, url, None, "refusing to send credentials over plain http to a host other than loopback; "
                f"use an https:// URL ({self.url_hint}) or a port-forward to localhost"
            )
        deadline = time.monotonic() + self.wait_seconds
        overall = deadline + self.timeout  # no call waits longer than this in all, slow answers included
        while True:
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            request.deadline = overall
            try:
                timeout = max(min(self.timeout, overall - time.monotonic()), 0.001)
                with _OPENER.open(request, timeout=timeout) as response:
                    if read is not None:
                        return read(response, overall)
                    payload = _read(response, overall)
                    return json.loads(payload) if payload.strip() else {}
            except urllib.error.HTTPError as error:
                if 300 <= error.code < 400:
                    where = error.headers.get("Location", "(no Location)")
                    raise self._failure(method, url, error.code, f"redirects are not followed (to {where})") from None
                try:
                    message, code = error_message(_read(error, overall))
                except (ValueError, TimeoutError, OSError) as problem:
                    message, code = str(problem), None
                failure = self._failure(method, url, error.code, message, code)
                if error.code not in RETRYABLE_STATUS or not resend:
                    raise failure from None
            except ValueError as error:  # too large (json errors are ValueErrors too: the server's fault)
                raise self._failure(method, url, None, str(error)) from None
            except (urllib.error.URLError, OSError) as error:
                reason = getattr(error, "reason", error)
                failure = self._failure(
                    method, url, None, f"{reason} — is the server reachable at {self.base_url}? ({self.url_hint})"
                )
                if not resend and not isinstance(reason, ConnectionRefusedError):
                    raise failure  # it may have reached the server: sending it again could repeat it
            if time.monotonic() + self.retry_interval > deadline:
                raise failure
            time.sleep(self.retry_interval)


class QueueClient(RestClient):
    """CRUD of Armada queues at `base_url` (e.g. `http://localhost:8080`)."""

    error = QueueApiError

    def _failure(self, method: str, url: str, status: Optional[int], message: str, code: Optional[int] = None):
        return (QueueExists if status == 409 else QueueApiError)(method, url, status, message, code)

    def create(self, queue: dict) -> None:
        """POST /v1/queue; raises QueueExists on 409."""
        self._request("POST", "/v1/queue", queue)

    def get(self, name: str) -> Optional[dict]:
        """GET /v1/queue/{name}; None when the server answers 404."""
        try:
            return self._request("GET", self._path(name))
        except QueueApiError as error:
            if error.status == 404:
                return None
            raise

    def update(self, queue: dict) -> None:
        """PUT /v1/queue/{name}: replaces the queue's settings."""
        self._request("PUT", self._path(queue["name"]), queue)

    def delete(self, name: str) -> None:
        """DELETE /v1/queue/{name}; a queue that is already gone is fine."""
        try:
            self._request("DELETE", self._path(name))
        except QueueApiError as error:
            if error.status != 404:
                raise

    @staticmethod
    def _path(name: str) -> str:
        return "/v1/queue/" + urllib.parse.quote(name, safe="")
