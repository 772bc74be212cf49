"""The edge's haproxy.cfg run by HAProxy itself (Debian's haproxy, scripts/install-deps.sh installs it), in front of
two stand-in frontends on 127.0.0.1 that answer what a Dynamo 1.6.1 frontend answers the moment after its start:
it lists the model in /v1/models and its `<model>-scripted` sibling, but `/v1/models/{model}/ready` says
`"ready": false` and a chat request gets 404 "model not found".

The edge must (issue 36: an unplanned frontend restart behind the edge failed 1-6 requests, each a 404):
- keep such a frontend out until it says it can route the model (the health check), and
- retry a request that one answers 404 on the other frontend, also when the request's body reaches HAProxy after
  its headers (HTTPS clients write them as two TLS records).
The whole drill on the testbed, under load: tests/e2e/test_edge.py.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from m3deploy.controller import tls
from m3deploy.core import edge
from m3deploy.core.build import build
from m3deploy.core.inventory import InvHost
from m3deploy.deploy import edgefiles

MODEL = "MiniMaxAI/MiniMax-M3"
SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", "m3_edge": True}


def _free_port_pair() -> int:
    """A port P with P and P+1 free (the two frontends) and P+10 (the edge)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 10 > 65535:
            continue
        try:
            for q in (p + 1, p + 10):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free ports")


# what a Dynamo 1.6.1 frontend answers a chat request with, by status (500: its words for lib/llm's
# KvSchedulerError::NoEndpoints, which its migration does not retry)
ANSWERS = {
    200: {"choices": [{"message": {"content": "ok"}}]},
    404: {"message": f"Model not found: {MODEL}", "type": "Not Found", "code": 404},
    500: {"message": "Failed to generate completions", "type": "Internal Server Error", "code": 500},
}


class Frontend(ThreadingHTTPServer):
    """A stand-in Dynamo frontend: `ready` is what its readiness route says; `answer`, the status of its answer to
    a chat request (ANSWERS: 200; 404 "model not found", as Dynamo answers before it has discovered the workers;
    500, as Dynamo 1.6.1 answers in the instant a worker set loses its last worker)."""
    daemon_threads = True

    def __init__(self, port: int, ready: bool):
        self.ready, self.answer, self.chats = ready, 200 if ready else 404, 0
        super().__init__(("127.0.0.1", port), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Frontend

    def log_message(self, *a):
        pass

    def _send(self, code: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"status": "healthy", "instances": [{"endpoint": "generate"}]})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": MODEL + "-scripted"}, {"id": MODEL}]})
        elif self.path == edgefiles.ready_uri(MODEL):
            self._send(200, {"model": MODEL, "ready": self.server.ready})
        else:
            self._send(404, {"message": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.chats += 1
        self._send(self.server.answer, ANSWERS[self.server.answer])


@pytest.fixture
def edge_up(tmp_path, monkeypatch):
    """HAProxy with the edge's own config (the plan's, on 127.0.0.1) and two stand-in frontends: yields
    (edge port, [frontend 0, frontend 1]); `start(ready0, ready1)` brings them up and waits for the checks."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(haproxy):
        pytest.fail("haproxy missing: `apt-get install haproxy` (scripts/install-deps.sh installs it)")
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    for name in ("EDGE_PEM", "EDGE_SOCKET"):
        monkeypatch.setattr(edge, name, str(tmp_path / name.lower()))
    port = _free_port_pair()
    data = {**SIM, "m3_address": "127.0.0.1", "m3_frontend_port": port, "m3_edge_port": port + 10}
    p = build([InvHost("ctl0", ("control",), data), InvHost("w0", ("workers",), {**data, "m3_address": "127.0.0.2"})],
              name="edgecheck")
    (tmp_path / "edge_pem").write_text(tls.edge_pem(p))
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(edgefiles.config(p, p.host("ctl0").service(edge.EDGE_UNIT)).text.replace("log /dev/log", "#"))
    check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    fronts: list[Frontend] = []
    procs = []

    def start(*ready: bool):
        for i, r in enumerate(ready):
            fronts.append(Frontend(port + i, r))
            threading.Thread(target=fronts[-1].serve_forever, daemon=True).start()
        procs.append(subprocess.Popen([haproxy, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        time.sleep(2 * edgefiles.CHECK_MS / 1000 + 0.5)  # every server checked (rise 1) at least once
        return fronts

    yield port + 10, start
    for pr in procs:
        pr.terminate()
        pr.wait(10)
    for f in fronts:
        f.shutdown()
        f.server_close()


def _chat(port: int, late_body: bool) -> int:
    """POST a chat request to the edge over TLS; with `late_body` the body follows the headers 0.2 s later (its own
    TLS record). Returns the HTTP status."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, ctx.wrap_socket(raw) as s:
        if late_body:
            s.sendall(head)
            time.sleep(0.2)
            s.sendall(body)
        else:
            s.sendall(head + body)
        status = s.recv(65536).split(b"\r\n", 1)[0]
    return int(status.split()[1])


def test_a_frontend_that_cannot_route_the_model_yet_gets_no_request(edge_up):
    """It lists the model (and `<model>-scripted`) but its readiness route says false: the edge keeps it out."""
    port, start = edge_up
    not_ready, ready = start(False, True)
    assert [_chat(port, late_body=False) for _ in range(8)] == [200] * 8
    assert not_ready.chats == 0 and ready.chats == 8


@pytest.mark.parametrize("status", [404, 500])
def test_a_404_or_500_is_retried_on_the_other_frontend_also_when_the_body_comes_late(edge_up, status):
    """404: a frontend that passed its check but still answers 404 (the moment it comes back). 500: seen in the
    upgrade drill (issue 38): the old generation's last worker drains, and for ~40 ms one frontend's KV router still
    picks that generation's empty worker set ("no endpoints available to route work", not migrated by Dynamo).
    Every request, its body sent after its headers or with them, is answered 200 by the other frontend."""
    port, start = edge_up
    failing, ready = start(True, True)
    failing.answer = status  # says ready, yet answers `status`
    got = [_chat(port, late_body=i % 2 == 0) for i in range(6)]
    assert got == [200] * 6, got
    assert failing.chats > 0, f"no request reached the frontend that answers {status}: nothing was retried"
