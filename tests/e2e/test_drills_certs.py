"""Drills: certificates over the cluster's life (issue 35) under load, with the edge and TLS inside the cluster.

    python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_certs.py

Opt-in (`-m drills`). Testbed `m3ce`, 10.180.0.0/24 (M3_CERT_TESTBED / M3_CERT_SUBNET move it): 1 control host
(etcd, NATS, 2 frontends, the edge) and 2 mocker workers, a private controller config (secrets store, cluster CA)
in a temporary directory, deployed with `m3_edge`, `m3_internal_tls` and the drills' settings that fast-forward
time: certificates of `m3_cert_validity_days = 10` (inside the 30-day renewal window the day they are made) from a
CA of `m3_ca_validity_days = 100`. Load: tests/e2e/load.py through the edge (HTTPS with the cluster's ca.pem as
it is when the load starts), 4 clients, no retries. In file order:

1. verify: every check passes but the `cert/...` ones of the leaves, which fail inside the window;
2. a re-run of the deploy under load re-issues every certificate (each named in its output) and rolls them out
   (etcd and NATS restarted, frontends drained at the edge, workers rolled, the edge reloaded): 0 failed; the
   edge serves the new certificate, to a client with Python 3.13's strict flags;
3. the CA rotated in three deploys, under load, with the default validity (a CA of 100 days cannot sign a
   certificate of 730: its rotation starts): step 1 (the new CA trusted beside the old one) under a load that
   trusts only the old CA: 0 failed; steps 2 (the new CA signs everything) and 3 (the old CA dropped) under one
   load that took the new ca.pem (both CAs) after step 1: 0 failed; after each step verify passes (every worker
   listed by the frontends, etcd and NATS serving their clients), and at the end the edge's certificate is the
   new CA's and every `cert/...` check passes.
The figures go to benchmarks/results/certs-<UTC start>.md. M3_E2E_KEEP=1 keeps the testbed.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import ssl
import tempfile
import time

import pytest
import tbrun

from load import Load

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_CERT_TESTBED", "m3ce")
SUBNET = os.environ.get("M3_CERT_SUBNET", "10.180.0.0/24")
CONFIG = tempfile.mkdtemp(prefix="m3-e2e-certs-config-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CONFIG": os.path.join(CONFIG, "m3")}
DATA = ("--data", "m3_edge=true", "--data", "m3_internal_tls=true")
SHORT = ("--data", "m3_cert_validity_days=10", "--data", "m3_ca_validity_days=100")
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, scratch=(CONFIG,))
STARTED = datetime.datetime.now(datetime.timezone.utc)
RESULTS: list[dict] = []


def deploy(*data: str) -> str:
    return TB.deploy_ok(*DATA, *data, timeout=1500).stdout


def verify(*data: str) -> dict:
    res = TB.verify(*DATA, *data, "--json", timeout=600)
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else {"results": []}
    return {"rc": res.returncode, "ok": {r["id"]: r["ok"] for r in doc["results"]},
            "bad": [(r["id"], str(r.get("evidence"))[:300]) for r in doc["results"] if not r["ok"]],
            "tail": res.stdout[-3000:] + res.stderr[-2000:]}


def certs(*data: str) -> dict[str, dict]:
    res = TB.m3deploy("certs", tbrun.INVENTORY, *DATA, *data, "--json")
    return {c["name"]: c for c in json.loads(res.stdout)}


def served(p, ca: str) -> tuple[str, str]:
    """(SHA-256 of the certificate the edge serves, its issuer) through a context with Python 3.13's strict
    flags (VERIFY_X509_STRICT | VERIFY_X509_PARTIAL_CHAIN) and the cluster's ca.pem."""
    from cryptography import x509

    host, port = p.endpoint.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca)
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=host) as s:
        der = s.getpeercert(binary_form=True)
    return hashlib.sha256(der).hexdigest(), x509.load_der_x509_certificate(der).issuer.rfc4514_string()


def stored_edge(p) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    data = json.loads(open(os.path.join(ENV["M3DEPLOY_CONFIG"], p.name, "secrets.json")).read())
    der = x509.load_pem_x509_certificate(data["edge-tls-cert"].encode()).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def started(p) -> dict[str, str]:
    """{host/unit: when systemd last started it} for every unit that holds TLS files of the cluster CA."""
    out = {}
    for h in p.hosts:
        units = [s.unit for s in h.services if any(r.startswith("tls-") for _, r in s.secret_files)]
        if units:
            got = TB.on(h.name, "systemctl show -p ActiveEnterTimestampMonotonic " + " ".join(units))
            out.update({f"{h.name}/{u}": v for u, v in zip(units, got.split())})
    return out


def rolled_out(p, before: dict[str, str], out: str) -> str:
    """Every TLS unit restarted since `before`, the frontends drained at the edge, the workers rolled."""
    after = started(p)
    same = [u for u in before if after.get(u) == before[u]]
    assert before and not same, f"not restarted: {same}"
    fronts = sum(1 for h in p.hosts for s in h.services if s.kind == "frontend")
    assert out.count("drained at the edge") >= fronts and "rolled " in out, out[-4000:]
    return f"{len(before)} units restarted ({fronts} frontends drained at the edge, workers rolled)"


def load(p, ca: str) -> Load:
    return Load(p.endpoint, p.served_model_name, concurrency=4, duration_s=1500, ca_file=ca, timeout_s=30)


def _record(name: str, stats, took: float, note: str = "") -> None:
    tbrun.record(RESULTS, name, stats, took, note)


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=DATA + SHORT, timeout=1500):
        try:
            p = TB.plan(DATA)
            yield p, os.path.join(ENV["M3DEPLOY_CONFIG"], p.name, "ca.pem")
        finally:
            tbrun.write_results(
                "certs", STARTED, "Certificates over the cluster's life under load",
                "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_certs.py` on the local "
                "testbed (one 2-core machine shared with other work; `load`: its 1-minute load average): 1 control "
                "host (etcd, NATS, 2 frontends, HAProxy with TLS from the cluster CA), 2 mocker workers, "
                "`m3_edge` and `m3_internal_tls`; first deployed with m3_cert_validity_days=10 and "
                "m3_ca_validity_days=100 (every certificate inside the 30-day window). Load: tests/e2e/load.py "
                "through the edge (HTTPS with ca.pem as it was when the load started), 4 concurrent clients, "
                "streaming and non-streaming chat, no retries.",
                ["drill", "sent", "ok", "failed", "took s", "failures", "notes"],
                [[r["drill"], r["stats"].sent, r["stats"].ok, r["stats"].failed, f"{r['took']:.1f}",
                  tbrun.failures(r["stats"], "x"), r["note"]] for r in RESULTS])


def test_verify_fails_only_the_certificates_inside_the_window(cluster):
    got = verify(*SHORT)
    bad = {i for i, _ in got["bad"]}
    assert got["rc"] != 0 and bad and all(i.startswith("cert/") for i in bad), got["bad"]
    assert "cert/edge" in bad and any(i.endswith("/etcd") for i in bad), bad
    assert all("inside the renewal window" in e for _, e in got["bad"]), got["bad"]
    listed = certs(*SHORT)
    assert all(c["days_left"] == 9 for n, c in listed.items() if not n.startswith("cluster CA")), listed


def test_re_run_re_issues_every_certificate_under_load(cluster):
    p, ca = cluster
    before, units = certs(*SHORT), started(p)
    with load(p, ca) as ld:
        time.sleep(5)
        t0 = time.monotonic()
        out = deploy(*SHORT)
        took = time.monotonic() - t0
        time.sleep(5)
        stats = ld.stop()
    after = certs(*SHORT)
    leaves = [n for n in before if not n.startswith("cluster CA")]
    how = rolled_out(p, units, out)
    _record("re-run with every certificate inside the window: all re-issued and rolled out", stats, took,
            f"{len(leaves)} certificates re-issued; {how}; the edge reloaded (serves the new one)")
    assert all(f"re-issue {n} (" in out for n in leaves), out[-4000:]
    assert all(after[n]["not_after"] > before[n]["not_after"] for n in leaves), (before, after)
    assert stats.ok > 0 and stats.failed == 0, stats.details[:10]
    assert served(p, ca)[0] == stored_edge(p)  # the edge serves the new one (reloaded), strict flags
    got = verify(*SHORT)
    assert all(i.startswith("cert/") for i, _ in got["bad"]), got["bad"]  # still 10 days: still in the window


def test_ca_rotation_keeps_every_client_connected(cluster):
    p, ca = cluster
    old_issuer = certs()["cluster CA"]["subject"]
    units = started(p)
    with load(p, ca) as ld:  # trusts only the old CA: step 1 changes nothing it sees
        time.sleep(5)
        t0 = time.monotonic()
        out = deploy()
        took = time.monotonic() - t0
        time.sleep(5)
        stats = ld.stop()
    assert "CA rotation step 1 of 3" in out, out[-4000:]
    _record("CA rotation step 1: the new CA trusted beside the old (clients with the old ca.pem)", stats, took,
            rolled_out(p, units, out))
    assert stats.ok > 0 and stats.failed == 0, stats.details[:10]
    assert open(ca).read().count("BEGIN CERTIFICATE") == 2
    got = verify()
    assert got["rc"] == 0, got["bad"]
    took, notes = 0.0, []
    with load(p, ca) as ld:  # the new ca.pem: both CAs
        for step in (2, 3):
            time.sleep(5)
            units = started(p)
            t0 = time.monotonic()
            out = deploy()
            took += time.monotonic() - t0
            assert f"CA rotation step {step} of 3" in out, out[-4000:]
            notes.append(f"step {step}: {rolled_out(p, units, out)}")
            got = verify()
            assert got["rc"] == 0, (step, got["bad"])
            print(f"step {step}: deploy done; verify passes")
        time.sleep(5)
        stats = ld.stop()
    _record("CA rotation steps 2 and 3: the new CA signs everything, then the old one dropped (one load, clients "
            "with ca.pem of step 1)", stats, took, "; ".join(notes) + "; verify passes after each step")
    assert stats.ok > 0 and stats.failed == 0, stats.details[:10]
    listed = certs()
    assert listed["cluster CA"]["subject"] != old_issuer and "cluster CA (previous)" not in listed
    assert all(c["issuer"] == listed["cluster CA"]["subject"] for n, c in listed.items() if n != "cluster CA")
    assert served(p, ca) == (stored_edge(p), listed["cluster CA"]["subject"])
    assert open(ca).read().count("BEGIN CERTIFICATE") == 1
