"""files/m3-etcd-auth.py (etcd.service's ExecStartPost) against a real etcd (Debian 12's etcd-server 3.4, started
here on loopback with the deploy's JWT auth tokens, m3deploy.core.build.etcd_jwt_option): a restart of etcd must
not invalidate the tokens Dynamo's processes hold.

The contract (etcd server/auth/store.go): every auth write (role grant, user changepw, user grant...) bumps the
auth store's revision, and etcd then refuses a token issued at an older revision with "etcdserver: revision of auth
store is old". Dynamo 1.6.1 does not log in again on that error: after a 30 s etcd outage on the testbed the
frontend, which had logged in while this script was still writing, answered /health with no worker until it was
restarted (2026-12-01). So on every start after the first the script must write nothing that is already right.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from m3deploy.core.build import etcd_jwt_keys, etcd_jwt_option

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "files", "m3-etcd-auth.py")
ETCD = shutil.which("etcd") or "etcd"  # Debian's etcd-server, installed by scripts/install-deps.sh
STALE = "revision of auth store is old"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, path: str, body: dict, token: str | None = None) -> tuple[dict | None, str]:
    req = urllib.request.Request(f"{url}/v3/{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **({"Authorization": token} if token else {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"{}"), ""
    except urllib.error.HTTPError as e:
        return None, e.read().decode(errors="replace")


class Etcd:
    def __init__(self, tmp):
        self.dir, self.keys, self.proc = str(tmp / "etcd"), str(tmp / "keys"), None
        self.client, self.peer = _port(), _port()
        self.url = f"http://127.0.0.1:{self.client}"

    def start(self) -> None:
        key, pub = etcd_jwt_keys(self.keys)
        if not os.path.exists(pub):  # the same key pair roles/etcd.py makes on a control host
            os.makedirs(self.keys, exist_ok=True)
            subprocess.run(f"openssl genrsa -out {key} 2048 2>/dev/null && openssl rsa -in {key} -pubout -out {pub} "
                           "2>/dev/null", shell=True, check=True)
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", self.dir, "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer}",
             "--initial-cluster", f"t=http://127.0.0.1:{self.peer}", "--auth-token", etcd_jwt_option(self.keys)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return
            except OSError:
                assert time.monotonic() < deadline, "etcd did not start"
                time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path)
    e.start()
    yield e
    e.stop()


def _env(url: str, password: str = "m3p-dynamo-1") -> dict:
    return {**os.environ, "M3_ETCD_URL": url, "M3_ETCD_ROOT_PASSWORD": "m3p-root", "M3_ETCD_USER": "dynamo",
            "M3_ETCD_PASSWORD": password}


def _run_script(url: str, **kw) -> str:
    res = subprocess.run([sys.executable, SCRIPT], env=_env(url, **kw), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _login(url: str, password: str = "m3p-dynamo-1") -> str:
    res, err = _post(url, "auth/authenticate", {"name": "dynamo", "password": password})
    assert res, err
    return res["token"]


def _read(url: str, token: str) -> str:
    """'' if a range read with the token works, else etcd's error."""
    res, err = _post(url, "kv/range", {"key": base64.b64encode(b"v1/instances/").decode()}, token)
    return "" if res is not None else err


def test_a_rerun_and_a_restart_keep_the_tokens_dynamo_holds(etcd):
    assert "auth enabled; user dynamo ok" in _run_script(etcd.url)  # the first start: turns auth on
    token = _login(etcd.url)
    assert _read(etcd.url, token) == ""
    _run_script(etcd.url)  # ExecStartPost of a later start, nothing to change
    assert _read(etcd.url, token) == ""
    etcd.stop()  # a real restart, with the JWT tokens the deploy configures (`--auth-token jwt,...`)
    etcd.start()
    assert _read(etcd.url, token) == "", "a token from before the restart stopped working"
    _run_script(etcd.url)  # the restart's ExecStartPost, while Dynamo's processes reconnect with their tokens
    assert _read(etcd.url, token) == "", "the script's re-run invalidated the token"


def test_the_contract_an_auth_write_makes_older_tokens_stale(etcd):
    """Why the script must not write: etcd refuses tokens older than its auth revision (store.go)."""
    _run_script(etcd.url)
    token = _login(etcd.url)
    root, err = _post(etcd.url, "auth/authenticate", {"name": "root", "password": "m3p-root"})
    assert root, err
    _, err = _post(etcd.url, "auth/user/changepw", {"name": "dynamo", "password": "m3p-dynamo-1"}, root["token"])
    assert not err, err
    assert STALE in _read(etcd.url, token)


def test_a_new_password_is_still_set_on_a_rerun(etcd):
    """Rotation (a new secret in the env file) still converges: the new password logs in, the old one not."""
    _run_script(etcd.url)
    _run_script(etcd.url, password="m3p-dynamo-2")
    assert _read(etcd.url, _login(etcd.url, "m3p-dynamo-2")) == ""
    assert _post(etcd.url, "auth/authenticate", {"name": "dynamo", "password": "m3p-dynamo-1"})[0] is None
