"""files/m3-unregister-dead.py (a Dynamo worker unit's ExecStopPost) against a real etcd with the deploy's auth
(Debian 12's etcd-server 3.4, started on loopback as in test_etcd_auth_script.py).

The contract, read on the testbed's etcd after a SIGKILL of a mocker worker (Dynamo 1.6.1, 2026-12-02): each
endpoint of a process is a key `v1/instances/<ns>/<component>/<endpoint>/<instance id hex>` attached to the
process's primary lease (granted TTL 30 s), the value naming the address the frontend connects to in
`transport.tcp`; the process's model card (`v1/mdc/...`) and event channels hang on the same lease. A killed
process's keys stay until the lease expires, and the frontend kept routing to them: after a crash loop, a request that
met 4 of them in a row was answered 503 ("migration retries exhausted"). The script must revoke exactly the leases of
this host's records whose port has no listener, and leave live records and other hosts' records alone.
"""
from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import time

import pytest
from test_etcd_auth_script import Etcd, _login, _post, _run_script
from test_etcd_auth_script import _port as _free_port  # bound and closed again: nobody listens on it

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "files", "m3-unregister-dead.py")
PASSWORD = "m3p-dynamo-1"


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _register(url: str, token: str, host: str, port: int) -> str:
    """What a Dynamo 1.6.1 worker writes (the testbed's records, shortened): an instance record and its model card,
    both on one lease. Returns the lease id."""
    lease, err = _post(url, "lease/grant", {"TTL": 30}, token)
    assert lease, err
    lid = lease["ID"]
    hexid = format(int(lid), "x")
    inst = {"type": "Endpoint", "component": "backend", "endpoint": "generate", "namespace": "dynamo",
            "instance_id": int(lid), "transport": {"tcp": f"{host}:{port}/{hexid}/dynamo/backend/generate"},
            "device_type": "cuda", "request_plane_codec": "msgpack"}
    mdc = {"type": "Model", "namespace": "dynamo", "component": "backend", "endpoint": "generate",
           "instance_id": int(lid), "card_json": {"display_name": "MiniMaxAI/MiniMax-M3"}}
    for key, value in ((f"v1/instances/dynamo/backend/generate/{hexid}", inst),
                       (f"v1/mdc/dynamo/backend/generate/{hexid}", mdc)):
        _, err = _post(url, "kv/put", {"key": _b64(key), "value": _b64(json.dumps(value)), "lease": lid}, token)
        assert not err, err
    return lid


def _keys(url: str, token: str) -> list[str]:
    res, err = _post(url, "kv/range", {"key": _b64("\0"), "range_end": _b64("\0"), "keys_only": True}, token)
    assert res is not None, err
    return [base64.b64decode(kv["key"]).decode() for kv in res.get("kvs", [])]


def _env_file(tmp_path, url: str, host: str = "127.0.0.1", dialect: str = "systemd") -> str:
    """The worker's env file as the deploy writes it (m3deploy.core.control.dynamo_env; the endpoint list is
    comma-separated with 3 control hosts: a dead first endpoint must not stop it)."""
    dead = f"http://127.0.0.1:{_free_port()}"
    p = tmp_path / "m3-worker@0.env"
    p.write_text("# Managed by m3deploy: environment of m3-worker@0.service. Mode 0600 root: may hold secrets.\n"
                 f"ETCD_ENDPOINTS={dead},{url}\nETCD_AUTH_USERNAME=dynamo\nDYN_REQUEST_PLANE=tcp\n"
                 f"DYN_TCP_RPC_HOST={host}\n"
                 + (f"ETCD_AUTH_PASSWORD={PASSWORD}\n" if dialect == "docker" else f'ETCD_AUTH_PASSWORD="{PASSWORD}"\n'))
    p.chmod(0o600)
    return str(p)


def _run(env_file: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, env_file, *extra], capture_output=True, text=True, timeout=60)


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path)
    e.start()
    _run_script(e.url)  # auth on, user dynamo (files/m3-etcd-auth.py, as etcd.service's ExecStartPost)
    yield e
    e.stop()


@pytest.mark.parametrize("dialect", ["systemd", "docker"])
def test_revokes_only_this_hosts_records_without_a_listener(etcd, tmp_path, dialect):
    token = _login(etcd.url)
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        live_lease = _register(etcd.url, token, "127.0.0.1", live.getsockname()[1])
        dead_lease = _register(etcd.url, token, "127.0.0.1", _free_port())
        other_lease = _register(etcd.url, token, "10.9.9.9", _free_port())  # another host's: never judged here
        before = _keys(etcd.url, token)
        assert len(before) == 6
        res = _run(_env_file(tmp_path, etcd.url, dialect=dialect), dialect)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"revoked lease {dead_lease}" in res.stdout, res.stdout
    after = _keys(etcd.url, token)
    hexes = {lid: format(int(lid), "x") for lid in (live_lease, dead_lease, other_lease)}
    assert not [k for k in after if k.endswith(hexes[dead_lease])], after  # the instance and its model card
    assert len([k for k in after if k.endswith(hexes[live_lease])]) == 2, after
    assert len([k for k in after if k.endswith(hexes[other_lease])]) == 2, after
    assert PASSWORD not in res.stdout + res.stderr


def test_nothing_dead_changes_nothing(etcd, tmp_path):
    token = _login(etcd.url)
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        _register(etcd.url, token, "127.0.0.1", live.getsockname()[1])
        res = _run(_env_file(tmp_path, etcd.url))
    assert res.returncode == 0 and "no record of 127.0.0.1 without a listener" in res.stdout, res.stdout
    assert len(_keys(etcd.url, token)) == 2


def test_etcd_unreachable_never_blocks_the_restart(tmp_path):
    """The unit's restart waits for ExecStopPost: with etcd away the script must end soon, and say why."""
    t0 = time.monotonic()
    res = _run(_env_file(tmp_path, f"http://127.0.0.1:{_free_port()}"))
    assert res.returncode == 0
    assert "etcd not reachable, the records expire with their lease" in res.stdout, res.stdout
    assert time.monotonic() - t0 < 10
    assert PASSWORD not in res.stdout + res.stderr
