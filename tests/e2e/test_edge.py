"""End-to-end: the edge (m3_edge, issue 25) on its own testbed, under load.

    python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_edge.py

Testbed `m3eg`, 10.105.0.0/24 (1 control host + 2 mocker workers; M3_EDGE_TESTBED / M3_EDGE_SUBNET move it), a
private controller config (secrets store, cluster CA) in a temporary directory. Deployed with
`--data m3_edge=true --data m3_api_key_file=FILE`: HAProxy on the control host in front of 2 frontends, TLS from
the cluster CA, the file's keys. In file order:

1. `m3deploy verify` passes (HTTPS with the CA; 401 without a key and with a wrong one, 200 with the key);
2. the edge refuses plain HTTP and a client that does not trust the cluster CA;
3. a planned restart of both frontends (their files touched, then the deploy re-run: roles/edge.py drains each
   at the edge, restarts it, waits until it lists every worker, puts it back) under load fails 0 requests;
4. a key rotation by re-runs (file [A] -> [B, A] -> [B]) under load fails 0 requests; then A gets 401, B 200;
5. an unplanned `systemctl restart m3-frontend` (not drained), three times, fails 0 requests.
The figures go to benchmarks/results/edge-<UTC start>.md. M3_E2E_KEEP=1 keeps the testbed.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
import tbrun

from load import Load, Stats

pytestmark = pytest.mark.e2e

NAME = os.environ.get("M3_EDGE_TESTBED", "m3eg")
SUBNET = os.environ.get("M3_EDGE_SUBNET", "10.105.0.0/24")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = tempfile.mkdtemp(prefix="m3-e2e-edge-config-")
KEY_FILE = os.path.join(CONFIG, "api.keys")
KEY_A, KEY_B = "m3k-edge-e2e-A-" + os.urandom(8).hex(), "m3k-edge-e2e-B-" + os.urandom(8).hex()
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CONFIG": os.path.join(CONFIG, "m3")}
DATA = ("--data", "m3_edge=true", "--data", f"m3_api_key_file={KEY_FILE}")
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV)
STARTED = datetime.datetime.now(datetime.timezone.utc)
RESULTS: list[dict] = []
DRAINED_OP = "drained at the edge"
CURRENT = {"key": KEY_A}  # the key the clients send now (the rotation moves them to B)


def write_keys(*keys: str) -> None:
    fd = os.open(KEY_FILE + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(k + "\n" for k in keys))
    os.replace(KEY_FILE + ".tmp", KEY_FILE)


def deploy(timeout: int = 900) -> subprocess.CompletedProcess:
    res = TB.deploy(*DATA, timeout=timeout)
    assert res.returncode == 0, res.stdout[-5000:]
    assert KEY_A not in res.stdout and KEY_B not in res.stdout, "a key in pyinfra's output"
    return res


def plan():
    return TB.plan(DATA)


on = TB.on


@pytest.fixture(scope="module")
def cluster(testbed_up):
    write_keys(KEY_A)
    with testbed_up(TB):
        try:
            deploy()
            p = plan()
            assert p.endpoint.startswith("https://") and p.endpoint.endswith(":8443/v1"), p.endpoint
            ca = os.path.join(ENV["M3DEPLOY_CONFIG"], p.name, "ca.pem")
            assert os.path.isfile(ca), "the controller wrote no CA certificate for the clients"
            yield p, ca
        finally:
            _write_results()


def _write_results() -> None:
    tbrun.write_results(
        "edge", STARTED, "The edge under load",
        "`python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_edge.py` on the local testbed (one 2-core "
        "machine shared with other work; `load`: its 1-minute load average): 1 control host (etcd, NATS, 2 "
        "frontends, HAProxy with TLS from the cluster CA and the API keys) and 2 mocker workers. Load: "
        "tests/e2e/load.py through the edge (HTTPS with the CA, a valid key), 4 concurrent clients, streaming "
        "and non-streaming chat, max_tokens 24, no retries.",
        ["drill", "sent", "ok", "failed", "took s", "failures", "notes"],
        [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['took']:.1f}",
          tbrun.failures(r["stats"], "x"), r["note"]] for r in RESULTS])


def _record(name: str, stats: Stats, took: float, note: str = "") -> None:
    tbrun.record(RESULTS, name, stats, took, note)


def _get(url: str, ca: str | None, key: str | None = None, scheme: str = "Bearer") -> int:
    return tbrun.https_status(url, ca, key, scheme)


def under_load(p, ca: str, key: str, action, settle_s: float = 3.0) -> tuple[Stats, float]:
    with Load(p.endpoint, p.served_model_name, concurrency=4, duration_s=400, api_key=key, ca_file=ca) as load:
        time.sleep(settle_s)
        t0 = time.monotonic()
        action()
        took = time.monotonic() - t0
        time.sleep(settle_s)
        stats = load.stop()
    assert stats.ok > 0, f"the load client got no answer at all: {stats.summary()}"
    return stats, took


# ------------------------------------------------------------------------------------------------ tests
def test_verify_passes(cluster):
    res = TB.verify(*DATA, "--json", timeout=600)
    assert res.returncode == 0, (res.stdout[-4000:], res.stderr[-2000:])
    doc = json.loads(res.stdout)
    ids = {r["id"]: r["ok"] for r in doc["results"]}
    assert ids.get("smoke/api-key") is True, "verify did not check the keys at the edge"
    assert all(ids.get(i) for i in ids if i.startswith("edge/")) and any(i.startswith("edge/") for i in ids), ids
    assert KEY_A not in res.stdout + res.stderr


def test_edge_refuses_plain_http_and_unknown_cas(cluster):
    p, ca = cluster
    url = p.endpoint + "/models"
    assert _get(url, ca, KEY_A) == 200
    assert _get(url, ca) == 401
    assert _get(url, ca, "m3k-wrong") == 401
    # RFC 9110 11.1: the scheme is case-insensitive; the key is not, and nothing may follow it
    assert [_get(url, ca, KEY_A, s) for s in ("bearer", "BEARER", "Bearer ")] == [200, 200, 200]
    assert [_get(url, ca, k, s) for k, s in ((KEY_A.upper(), "Bearer"), (KEY_A, "Basic"), (KEY_A + " x", "Bearer"))] \
        == [401, 401, 401]
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _get(url, None, KEY_A)  # the system's trust store does not know the cluster CA
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=10).read()


def test_planned_frontend_restart_under_load_fails_nothing(cluster):
    p, ca = cluster
    ctl = p.group("control")[0].name
    fronts = [s for s in p.host(ctl).services if s.kind == "frontend"]
    assert len(fronts) == 2
    pids = {s.unit: on(ctl, f"systemctl show -p MainPID --value {s.unit}").strip() for s in fronts}
    out = {}

    def restart():
        # files newer than the processes: the re-run restarts both frontends, as after a change of their files
        on(ctl, "touch " + " ".join(s.env_file for s in fronts))
        out["run"] = deploy().stdout

    stats, took = under_load(p, ca, KEY_A, restart)
    _record("planned restart of both frontends (deploy re-run), behind the edge", stats, took,
            "each drained at the edge, restarted, back once it lists every worker and the model")
    for s in fronts:
        assert f"Restart {s.unit} {DRAINED_OP}" in out["run"], out["run"][-3000:]
        assert on(ctl, f"systemctl show -p MainPID --value {s.unit}").strip() != pids[s.unit], f"{s.unit} not restarted"
    assert stats.failed == 0, stats.summary()


def test_key_rotation_by_rerun_under_load_fails_nothing(cluster):
    p, ca = cluster
    write_keys(KEY_B, KEY_A)  # the new key first: our clients send the first line
    stats, took = under_load(p, ca, KEY_A, deploy)
    _record("key rotation, step 1: add key B (re-run: HAProxy reload), clients on key A", stats, took)
    assert stats.failed == 0, stats.summary()
    assert _get(p.endpoint + "/models", ca, KEY_B) == 200 and _get(p.endpoint + "/models", ca, KEY_A) == 200

    write_keys(KEY_B)
    CURRENT["key"] = KEY_B
    stats, took = under_load(p, ca, KEY_B, deploy)
    _record("key rotation, step 2: remove key A (re-run: HAProxy reload), clients on key B", stats, took)
    assert stats.failed == 0, stats.summary()
    assert _get(p.endpoint + "/models", ca, KEY_A) == 401
    assert _get(p.endpoint + "/models", ca, KEY_B) == 200
    ctl = p.group("control")[0].name
    hashes = on(ctl, "stat -c '%a %U:%G' /etc/m3/edge-api-keys.sha256 /etc/m3/edge.pem").split("\n")
    assert all(h.strip() == "600 root:root" for h in hashes if h.strip()), hashes
    assert KEY_B not in on(ctl, "cat /etc/m3/edge-api-keys.sha256 /etc/m3/haproxy.cfg; journalctl -u m3-edge "
                                "--no-pager -o cat | tail -200")


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_unplanned_frontend_restart_fails_nothing(cluster, attempt):
    """`systemctl restart m3-frontend` by hand (not drained), three times: 0 failed requests. The edge keeps the
    frontend out until `/v1/models/{model}/ready` says it can route the model (it answers 404 "model not found"
    before it has discovered the workers, while /v1/models may already list the model), and a request it answers
    404 or 503, or drops, is retried on the other frontend (`retry-on`, `option redispatch`), its body buffered
    first (`option http-buffer-request`: without it a body that reached HAProxy after the headers made the 404
    final, issue 36)."""
    p, ca = cluster
    ctl = p.group("control")[0].name
    stats, took = under_load(p, ca, CURRENT["key"], lambda: on(ctl, "systemctl restart m3-frontend"), settle_s=8.0)
    _record(f"unplanned `systemctl restart m3-frontend` behind the edge ({attempt} of 3)", stats, took,
            "not drained: back once its readiness route says ready")
    assert stats.failed == 0, stats.summary()


def test_a_rerun_without_change_changes_nothing(cluster):
    """Idempotent with the edge: no reload, no drained restart, no file rewritten (the certificate is not made
    again, the key hashes are the same)."""
    from test_drills import _changed_ops

    out = deploy().stdout
    assert _changed_ops(out) == [], _changed_ops(out)
