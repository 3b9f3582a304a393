"""What the components' HTTP clients share (components/registry_api.py, components/armada/queue_api.py
and jobs_api.py, components/kube_tunnel.py): whether a host is this machine, decided by its address;
and answers read within a deadline over the whole exchange, status line and headers included
(`response_class` for http.client connections, `DeadlineHTTPHandler`/`DeadlineHTTPSHandler` for urllib).

Standard library only: it runs inside Pulumi's dynamic-provider process too.
"""
from __future__ import annotations

import functools
import http.client
import io
import ipaddress
import math
import time
import urllib.request
from typing import Callable, Optional


def is_loopback(hostname: Optional[str]) -> bool:
    """Whether `hostname` (a URL's hostname: no port, IPv6 with or without brackets) is this machine:
    `localhost`, or an IP address in a loopback block (127.0.0.0/8, ::1). Decided by the address,
    never by how the name starts: `127.attacker.example` is a DNS name like any other, resolved to
    wherever its owner points it."""
    if not hostname:
        return False
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname.strip("[]")).is_loopback
    except ValueError:
        return False


# --- answers read within a deadline --------------------------------------------------------------


class _DeadlineReader(io.RawIOBase):
    """The bytes of `sock`, each read waiting at most until `at` (monotonic) and the socket's own
    timeout: a peer that drips one byte per timeout is given up on at `at`, during the status
    line and headers as during the body. `error()` is raised once `at` has passed."""

    def __init__(self, sock, at: float, error: Callable[[], BaseException]):
        super().__init__()
        # socket.makefile holds a reference that keeps the descriptor open after http.client closes
        # the connection of a response it hands over (HTTPConnection.getresponse, will_close).
        self._file = sock.makefile("rb", buffering=0)
        # One read at most per call (a BufferedReader's readinto would wait to fill the buffer).
        self._read = getattr(self._file, "readinto1", self._file.readinto)
        self._sock, self._own, self._at, self._error = sock, sock.gettimeout(), at, error

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self._at - time.monotonic()
        if left <= 0:
            raise self._error()
        self._sock.settimeout(left if self._own is None else min(self._own, left))
        try:
            return self._read(buffer)
        except TimeoutError:
            if self._at - time.monotonic() <= 0:
                raise self._error() from None
            raise

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


class _DeadlineSocket:
    """What http.client.HTTPResponse takes of a socket: `makefile("rb")`, here bounded by `at`."""

    def __init__(self, sock, at: float, error: Callable[[], BaseException]):
        self._sock, self._at, self._error = sock, at, error

    def makefile(self, mode: str = "rb", *_args, **_kwargs):
        return io.BufferedReader(_DeadlineReader(self._sock, self._at, self._error))


class _DeadlineResponse(http.client.HTTPResponse):
    def __init__(self, sock, *args, at: float, error: Callable[[], BaseException], **kwargs):
        super().__init__(_DeadlineSocket(sock, at, error), *args, **kwargs)


def response_class(at: float, error: Callable[[], BaseException]) -> Callable[..., http.client.HTTPResponse]:
    """An `HTTPConnection.response_class` (what `getresponse`, and a proxy's CONNECT, read the answer
    with) whose every read, status line and headers included, ends by `at` (time.monotonic(); inf:
    the socket's timeout only), raising `error()` after it. The socket's timeout bounds one read;
    a server answering one byte per timeout would otherwise hold the exchange for as long as it
    likes: http.client reads the status line and each header with `fp.readline`, which waits for
    the line's end (http/client.py HTTPResponse.begin, parse_headers)."""
    if at == math.inf:
        return http.client.HTTPResponse
    return functools.partial(_DeadlineResponse, at=at, error=error)


class _DeadlineHandler:
    """urllib's do_open with connections whose answers are read by `request.deadline` (monotonic)."""

    def do_open(self, http_class, req, **http_conn_args):
        at = getattr(req, "deadline", math.inf)

        def connection(host, **kwargs):
            made = http_class(host, **kwargs)
            made.response_class = response_class(at, lambda: TimeoutError("the answer did not arrive before the deadline"))
            return made

        return super().do_open(connection, req, **http_conn_args)


class DeadlineHTTPHandler(_DeadlineHandler, urllib.request.HTTPHandler):
    """For `urllib.request.build_opener`: http:// answers read within `request.deadline`."""


class DeadlineHTTPSHandler(_DeadlineHandler, urllib.request.HTTPSHandler):
    """For `urllib.request.build_opener`: https:// answers read within `request.deadline`."""
