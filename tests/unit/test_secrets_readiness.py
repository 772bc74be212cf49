import http.server
import json
import os
import stat
import threading

import pytest

from m3deploy.check import readiness
from m3deploy.controller import secrets
from m3deploy.core.errors import M3Error
from m3deploy.core.model import Readiness


def test_secrets_generated_once_0600(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path))
    a = secrets.ensure_secrets("c1")
    b = secrets.ensure_secrets("c1")
    assert a == b and set(a) == set(secrets.KNOWN)
    p = secrets.secrets_path("c1")
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700
    os.chmod(p, 0o644)
    with pytest.raises(M3Error, match="chmod 600"):
        secrets.load_secrets("c1")


@pytest.fixture
def server():
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/health": b'{"health":"true"}', "/fe": json.dumps({"instances": [
                {"endpoint": "generate", "transport": {"tcp": "127.0.0.2:1/x"}}]}).encode()}.get(self.path)
            self.send_response(200 if body else 503)
            self.end_headers()
            self.wfile.write(body or b"down")

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_http_ready_and_json(server):
    r = Readiness("http", url=server + "/health", expect_json=(("health", "true"),), timeout_s=2)
    assert readiness.wait_ready(r) < 2


def test_failure_names_check_and_has_logs(server):
    r = Readiness("http", url=server + "/nope", timeout_s=0.3, interval_s=0.1)
    with pytest.raises(readiness.NotReady) as e:
        readiness.wait_ready(r, what="m3-worker@0.service on w1", logs=lambda: "line1\nboom")
    msg = str(e.value)
    assert "m3-worker@0.service on w1" in msg and "HTTP 503" in msg and "boom" in msg
    assert f"GET {server}/nope answers 200" in msg


def test_only_http_is_polled_from_the_controller():
    """The plan's readiness kinds are http and process (systemd's); nothing plans a tcp check any more."""
    with pytest.raises(M3Error, match="readiness kind 'process' cannot be polled.*supported: http"):
        readiness.check_once(Readiness("process"))


def test_wait_instances(server):
    assert readiness.wait_instances(server + "/fe", 1, timeout_s=1) < 1
    with pytest.raises(readiness.NotReady, match="want 2"):
        readiness.wait_instances(server + "/fe", 2, timeout_s=0.3, interval_s=0.1)
