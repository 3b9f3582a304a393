"""A local stand-in for the Armada server's queue REST API, for testing the Queue provider.

It implements what `armada/armada-v0.22.7/pkg/api/api.swagger.json` and armada/NOTES.md §8 say:
`POST /v1/queue` (409 AlreadyExists on a duplicate, 400 InvalidArgument when priorityFactor < 1),
`GET | PUT | DELETE /v1/queue/{name}` (404 NotFound for an unknown queue), `apiQueue` bodies with
empty fields omitted as the gateway does, and `runtimeError` bodies `{code, message, details}`.
Runs on 127.0.0.1 on a free port in a background thread.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import unquote

# google.rpc.Code values and the HTTP statuses grpc-gateway maps them to.
INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED = 3, 5, 6, 7, 16
HTTP_STATUS = {INVALID_ARGUMENT: 400, NOT_FOUND: 404, ALREADY_EXISTS: 409, PERMISSION_DENIED: 403, UNAUTHENTICATED: 401}
QUEUE_KEYS = {
    "name", "priorityFactor", "userOwners", "groupOwners", "resourceLimits", "resourceLimitsByPriorityClassName",
    "permissions", "cordoned", "labelsDeprecated", "labels", "retryPolicies",
}


class ApiError(Exception):
    def __init__(self, code: int, message: str):
        self.code, self.message = code, message


class FakeArmada:
    """`queues` is the server's state; `requests` logs (method, path, body); `deny` names queues
    the caller lacks permission for (403); `unavailable` makes the next N requests answer 503;
    `authorization`, when set, is the only Authorization header accepted (else 401)."""

    def __init__(self):
        self.queues: dict[str, dict] = {}
        self.requests: list[tuple[str, str, Optional[dict]]] = []
        self.deny: set[str] = set()
        self.unavailable = 0
        self.authorization: Optional[str] = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeArmada":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- the API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Optional[dict], authorization: Optional[str] = None) -> tuple[int, dict]:
        with self._lock:
            self.requests.append((method, path, body))
            if self.authorization is not None and authorization != self.authorization:
                return 401, {"code": UNAUTHENTICATED, "message": "Request could not be authenticated", "details": []}
            if self.unavailable:
                self.unavailable -= 1
                return 503, {"code": 14, "message": "server is starting", "details": []}
            try:
                return 200, self._route(method, path, body)
            except ApiError as error:
                return HTTP_STATUS[error.code], {"code": error.code, "message": error.message, "details": []}

    def _route(self, method: str, path: str, body: Optional[dict]) -> dict:
        if path == "/v1/queue" and method == "POST":
            queue = self._valid(body)
            if queue["name"] in self.queues:
                raise ApiError(ALREADY_EXISTS, f"[CreateQueue] error creating queue: Queue {queue['name']} already exists")
            self.queues[queue["name"]] = queue
            return {}
        if path.startswith("/v1/queue/"):
            name = unquote(path[len("/v1/queue/"):])
            if method == "GET":
                return self._existing(name)
            if method == "PUT":
                queue = self._valid(body)
                self._existing(name)
                self.queues[name] = queue
                return {}
            if method == "DELETE":
                self._existing(name)
                del self.queues[name]
                return {}
        raise ApiError(NOT_FOUND, f"Not Found: {method} {path}")

    def _valid(self, body: Optional[dict]) -> dict:
        if not isinstance(body, dict):
            raise ApiError(INVALID_ARGUMENT, "request body must be an apiQueue object")
        unknown = set(body) - QUEUE_KEYS
        if unknown:
            raise ApiError(INVALID_ARGUMENT, f"unknown field(s) {sorted(unknown)} in apiQueue")
        if not body.get("name"):
            raise ApiError(INVALID_ARGUMENT, "[CreateQueue] error validating queue: queue name cannot be empty")
        if body["name"] in self.deny:
            raise ApiError(PERMISSION_DENIED, f"user anonymous lacks permission create_queue for {body['name']}")
        if float(body.get("priorityFactor", 0)) < 1:
            raise ApiError(INVALID_ARGUMENT, "[CreateQueue] error validating queue: priority factor cannot be lower than 1.0")
        return {k: v for k, v in body.items() if v not in (None, [], {}, False, "")}

    def _existing(self, name: str) -> dict:
        if name not in self.queues:
            raise ApiError(NOT_FOUND, f"[GetQueue] error getting queue {name}: queue {name} not found")
        return dict(self.queues[name])

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    status, answer = 400, {"code": INVALID_ARGUMENT, "message": "invalid JSON", "details": []}
                else:
                    status, answer = fake.handle(self.command, self.path, body, self.headers.get("Authorization"))
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

            def log_message(self, *_args) -> None:  # keep test output clean
                pass

        return Handler
