"""The Armada queue client (components/armada/queue_api.py) keeps credentials to where they are
meant to go and bounds what it waits for and reads (issue 11, items 7 and 8)."""
from __future__ import annotations

import base64
import time
import urllib.parse

import pytest

from components.armada import queue_api
from components.armada.queue_api import QueueApiError, QueueClient
from tests.fake_armada import FakeArmada
from tests.registry_server import DrippingServer, ScriptedServer, drip

BASIC = "Basic " + base64.b64encode(b"armada-user:armada-pw").decode()


def test_any_redirect_is_an_error_and_is_not_followed():
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, b"{}")) as elsewhere:
        for status in (301, 302, 303, 307, 308):
            target = f"{elsewhere.url}/v1/queue/q"
            with ScriptedServer(lambda seen: (status, {"Location": target}, b"")) as server:
                client = QueueClient(server.url, headers={"Authorization": BASIC}, timeout=5)
                with pytest.raises(QueueApiError, match=r"redirects are not followed") as error:
                    client.get("q")
                assert error.value.status == status
    assert elsewhere.seen == []  # the credentials never went there


@pytest.mark.parametrize("url", [
    "http://armada.example:8080", "http://10.0.0.7", "http://armada-server.armada.svc:8080",
    # Host names that merely start like a loopback address (issue 20 finding 8): resolved by DNS to anywhere.
    "http://127.attacker.example:8080", "http://127.0.0.1.nip.io:8080", "http://localhost.attacker.example",
])
def test_basic_auth_is_never_sent_over_plain_http_beyond_loopback(url):
    client = QueueClient(url, headers={"Authorization": BASIC}, timeout=2)
    started = time.monotonic()
    with pytest.raises(QueueApiError, match=r"refusing to send credentials over plain http") as error:
        client.get("q")
    assert error.value.status is None and time.monotonic() - started < 1  # refused before connecting
    assert "armada-pw" not in str(error.value) and BASIC not in str(error.value)


def test_loopback_plain_http_and_no_credentials_still_work():
    with FakeArmada() as server:
        server.authorization = BASIC
        client = QueueClient(server.url.replace("127.0.0.1", "localhost"), headers={"Authorization": BASIC})
        client.create({"name": "q", "priorityFactor": 1.0})
        assert client.get("q")["name"] == "q"
    with ScriptedServer(lambda seen: (404, {"Content-Type": "application/json"}, b'{"code": 5}')) as server:
        assert QueueClient(server.url.replace("127.0.0.1", "localhost")).get("q") is None


@pytest.mark.parametrize("host", ["localhost", "LocalHost", "127.0.0.1", "127.1.2.3", "[::1]"])
def test_loopback_is_decided_by_address_as_the_registry_client_does(host):
    from components import registry_api, transport

    assert transport.is_loopback(urllib.parse.urlsplit(f"http://{host}:8080").hostname)
    assert registry_api.is_loopback is transport.is_loopback  # one helper, not two copies
    assert queue_api.is_loopback is transport.is_loopback


def test_a_huge_answer_is_refused_unread():
    one_mib = 1 << 20  # a queue document is a few hundred bytes
    body = b"[" + b" " * one_mib + b"]"
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, body)) as server:
        with pytest.raises(QueueApiError, match=f"larger than {one_mib} bytes"):
            QueueClient(server.url, timeout=5).get("q")
    assert queue_api.MAX_RESPONSE_BYTES == one_mib


def test_a_dripping_server_cannot_hold_a_call_past_its_deadline():
    drip = [(b"{", 0)] + [(b" ", 0.2)] * 50  # 10 s, each chunk well within the 1 s read timeout
    with ScriptedServer(lambda seen: (200, {"Content-Type": "application/json"}, drip)) as server:
        started = time.monotonic()
        with pytest.raises(QueueApiError):
            QueueClient(server.url, timeout=1, wait_seconds=0).get("q")
        assert time.monotonic() - started < 3


def test_a_server_dripping_its_headers_cannot_hold_a_call_past_its_deadline():
    """Issue 20 finding 7: each header byte arrives well within the 1 s read timeout; the call's
    deadline (timeout after the retry window) covers the status line and headers too."""
    headers = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 40 + b"\r\n"
    with DrippingServer(drip(headers, 0.2)) as server:  # 16 s of headers
        started = time.monotonic()
        with pytest.raises(QueueApiError, match="deadline"):
            QueueClient(server.url, timeout=1, wait_seconds=0).get("q")
        assert time.monotonic() - started < 3


def test_over_https_an_answer_is_read_whole_and_dripped_headers_meet_the_deadline(tmp_path, monkeypatch):
    body = b'{"name": "q", "priorityFactor": 1}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with DrippingServer([(answer, 0)], tls_dir=tmp_path) as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))  # urllib's default context reads it
        assert QueueClient(server.url, headers={"Authorization": BASIC}, timeout=5).get("q")["name"] == "q"
    with DrippingServer(drip(answer, 0.2), tls_dir=tmp_path) as server:
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
        started = time.monotonic()
        with pytest.raises(QueueApiError, match="deadline"):
            QueueClient(server.url, headers={"Authorization": BASIC}, timeout=1, wait_seconds=0).get("q")
        assert time.monotonic() - started < 3
