"""Certificates over the cluster's life (issue 35, m3deploy.controller.certs): the dates recorded, a re-run re-issuing
what is inside m3_cert_renew_days, the CA rotated in three deploys with an overlap, `m3deploy certs` and verify's
`cert/...` checks. The roll-out of re-issued files under load: tests/e2e/test_drills_certs.py (the testbed)."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from m3deploy.check.checks import CheckFailed
from m3deploy.check.verify.certs import cert_checks
from m3deploy.controller import certs, deployed, tls
from m3deploy.core import internal_tls
from m3deploy.core.build import build
from m3deploy.core.inventory import InvHost

SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", "m3_auth": True,
       "m3_edge": True, "m3_internal_tls": True, "m3_edge_frontends": 1}


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def plan(**data):
    d = {**SIM, **data}
    return build([InvHost("ctl0", ("control",), {**d, "m3_address": "10.0.0.1"}),
                  InvHost("w0", ("workers",), {**d, "m3_address": "10.0.0.20"})], name="life")


def store():
    return tls.store.load_secrets("life")


def leaves(data):
    return {k: v for k, v in data.items() if k.startswith("tls-cert:") or k == tls.EDGE_CERT}


def record(p):
    """What a deploy that reached every host leaves at its end: each host's deploy record (roles/record.py), in a
    later second than the step its start took (the record's time has whole seconds)."""
    time.sleep(1.05)
    for hp in p.hosts:
        deployed.write_host(p, hp, {})


def test_each_certificate_has_its_dates_and_a_re_run_changes_nothing():
    p = plan()
    assert certs.renew(p) == []  # made, nothing due
    inv = {c.name: c for c in certs.inventory(p)}
    assert set(inv) == {"cluster CA", "edge", "ctl0 etcd", "ctl0 peer", "ctl0 nats", "ctl0 client", "ctl0 gateway", "w0 client",
                        "w0 gateway"}
    assert inv["edge"].hosts == ("ctl0",) and inv["w0 client"].hosts == ("w0",)
    assert 728 <= inv["edge"].days_left <= 730 and 3648 <= inv["cluster CA"].days_left <= 3650
    assert all(c.strict == () and c.issuer == inv["cluster CA"].subject for n, c in inv.items() if n != "cluster CA")
    before = store()
    assert certs.renew(p) == [] and store() == before  # a re-run re-issues nothing


def test_a_re_run_re_issues_every_certificate_inside_the_window():
    short = plan(m3_cert_validity_days=10)  # a drill's setting: inside the 30-day window when made
    certs.renew(short)
    first = leaves(store())
    assert {c.days_left for c in certs.inventory(short) if c.role != "ca"} == {9}
    notes = certs.renew(plan())  # the next deploy, default validity: every one of them re-issued, for 730 days
    assert len(notes) == len(first) and all(n.startswith("re-issue ") for n in notes)
    again = leaves(store())
    assert set(again) == set(first) and not set(again.values()) & set(first.values())
    assert {c.days_left for c in certs.inventory(plan()) if c.role != "ca"} == {729}
    assert certs.renew(plan()) == []


def test_a_certificate_made_before_issue_35_is_re_issued(tmp_path):
    p = plan()
    certs.renew(p)
    data = store()
    # the old way: an empty subject, a non-critical SAN, no key identifiers
    data["tls-cert:w0:gateway"] = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/",
         "-keyout", str(tmp_path / "k"), "-days", "100", "-addext", "subjectAltName=IP:10.0.0.20", "-addext",
         "subjectKeyIdentifier=none", "-addext", "authorityKeyIdentifier=none"],
        capture_output=True, text=True, check=True).stdout
    tls.store.write_secrets("life", data)
    gw = next(c for c in certs.inventory(p) if c.name == "w0 gateway")
    assert "no Subject Key Identifier" in gw.strict
    assert any(n.startswith("re-issue w0 gateway (not strict X.509") for n in certs.renew(p))
    assert next(c for c in certs.inventory(p) if c.name == "w0 gateway").strict == ()


def _verify(tmp_path, bundle: str, leaf: str) -> bool:
    (tmp_path / "b.pem").write_text(bundle)
    (tmp_path / "l.pem").write_text(leaf)
    return subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(tmp_path / "b.pem"),
                           str(tmp_path / "l.pem")], capture_output=True).returncode == 0


def test_the_ca_is_rotated_in_three_deploys_with_both_trusted_between(tmp_path):
    p = plan(m3_ca_validity_days=100, m3_cert_validity_days=10)  # a CA of 100 days (a drill's setting)
    certs.renew(p)
    record(p)
    old = store()
    assert certs.renew(p) != [] and tls.NEXT_CERT not in store()  # window 30 + 10 < 99 days left: leaves only
    record(p)
    old = store()
    # with certificates of 80 days the CA can no longer sign a whole one: its rotation starts
    p80 = plan(m3_cert_validity_days=80)
    notes = certs.renew(p80)
    assert notes[0].startswith("CA rotation step 1 of 3") and tls.NEXT_CERT in store()
    step1 = store()
    assert step1[tls.CA_CERT] == old[tls.CA_CERT]  # the old CA still signs
    bundle1 = tls.cluster_certs(p80)[internal_tls.CA_REF]
    assert bundle1.count("BEGIN CERTIFICATE") == 2 and open(tls.ca_file(p80)).read() == bundle1
    # the last step has not reached every host (no deploy record since): the same step again, nothing moves
    assert certs.renew(p80)[0].startswith("CA rotation: the last step has not reached every host")
    assert store() == step1
    record(p80)
    notes = certs.renew(p80)
    assert notes[0].startswith("CA rotation step 2 of 3")
    step2 = store()
    assert step2[tls.CA_CERT] == step1[tls.NEXT_CERT] and step2[tls.PREV_CERT] == step1[tls.CA_CERT]
    assert all(tls.by_ca(step2, k) for k in leaves(step2))  # every certificate re-issued by the new CA
    bundle2 = tls.cluster_certs(p80)[internal_tls.CA_REF]
    assert bundle2 == bundle1  # the bundle's text did not change: only the certificates did
    # the overlap: the hosts still holding step 1's certificates and those holding step 2's trust each other
    assert _verify(tmp_path, bundle2, step1["tls-cert:ctl0:etcd"]) and _verify(tmp_path, bundle2,
                                                                                step2["tls-cert:w0:client"])
    record(p80)
    assert certs.renew(p80)[0].startswith("CA rotation step 3 of 3")
    bundle3 = tls.cluster_certs(p80)[internal_tls.CA_REF]
    assert bundle3 == store()[tls.CA_CERT] and tls.PREV_CERT not in store()
    assert not _verify(tmp_path, bundle3, step1["tls-cert:ctl0:etcd"])  # the old CA's are refused now
    assert _verify(tmp_path, bundle3, store()["tls-cert:ctl0:etcd"])
    record(p80)
    assert certs.renew(p80) == []  # the new CA: 3650 days


def test_verify_checks_each_certificate_and_fails_inside_the_window():
    short = plan(m3_cert_validity_days=10)
    certs.renew(short)
    checks = {c.id: c for c in cert_checks(short)}
    assert set(checks) >= {"cert/cluster-ca", "cert/edge", "cert/ctl0/etcd", "cert/w0/client"}
    assert checks["cert/ctl0/etcd"].target == "ctl0"
    with pytest.raises(CheckFailed, match=r"9 days left, inside the renewal window \(30 days\).*re-run the deploy"):
        checks["cert/edge"].fn(None)
    assert "days left" in checks["cert/cluster-ca"].fn(None)
    certs.renew(plan())
    assert all("729 days left" in c.fn(None) for i, c in
               {c.id: c for c in cert_checks(plan())}.items() if i != "cert/cluster-ca" and
               not i.startswith("cert/served/"))  # (what the edge serves: the next test)


def test_certs_command_lists_them_and_exits_1_inside_the_window(tmp_path):
    from click.testing import CliRunner

    from m3deploy.cli import load_plan, main

    inv = tmp_path / "inv.py"
    inv.write_text(f"control = [('ctl0', {{**{SIM!r}, 'm3_address': '10.0.0.1'}})]\n"
                   f"workers = [('w0', {{**{SIM!r}, 'm3_address': '10.0.0.20'}})]\n")
    r = CliRunner().invoke(main, ["certs", str(inv)])
    assert r.exit_code == 0 and "no certificates" in r.output, r.output  # nothing made yet: certs makes none
    certs.renew(load_plan(str(inv)))  # what the deploy does first
    r = CliRunner().invoke(main, ["certs", str(inv), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {x["name"] for x in rows} >= {"cluster CA", "edge", "w0 client"}
    assert all({"hosts", "not_after", "days_left", "issuer"} <= set(x) for x in rows)
    r = CliRunner().invoke(main, ["certs", str(inv), "--data", "m3_cert_renew_days=800"])
    assert r.exit_code == 1 and "inside the renewal window" in r.output and "edge" in r.output, r.output


def test_validate_refuses_a_ca_that_would_rotate_at_once():
    from m3deploy.core.errors import ValidationError

    with pytest.raises(ValidationError, match=r"key m3_ca_validity_days: 700 days.*= 760 days left\). Fix"):
        plan(m3_ca_validity_days=700)
    plan(m3_ca_validity_days=761)


def test_verify_reads_the_days_left_of_the_certificate_the_edge_serves(tmp_path):
    import socket
    import ssl
    import threading

    def local(**data):
        return build([InvHost("ctl0", ("control",), {**SIM, **data, "m3_address": "127.0.0.1"}),
                      InvHost("w0", ("workers",), {**SIM, **data, "m3_address": "10.0.0.20"})], name="life")

    p = local()
    certs.renew(p)
    pem = tmp_path / "edge.pem"
    pem.write_text(tls.edge_pem(p))
    pem.chmod(0o600)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(str(pem))
    port = next(x.port for h in p.hosts for s in h.services if s.kind == "edge" for x in s.ports)

    def serve(sock, n: int) -> threading.Thread:
        """Answer `n` handshakes on `sock`, in a thread the test joins (no thread may outlive it: pyinfra's gevent
        patches the process in a later test)."""
        def run():
            for _ in range(n):
                try:
                    conn, _ = sock.accept()
                    srv.wrap_socket(conn, server_side=True).close()
                except (ssl.SSLError, OSError):
                    pass
        t = threading.Thread(target=run, daemon=True)
        t.start()
        return t

    served = {c.id: c for c in cert_checks(p)}["cert/served/ctl0"]
    wide = {c.id: c for c in cert_checks(local(m3_cert_renew_days=800))}["cert/served/ctl0"]
    with socket.create_server(("127.0.0.1", port)) as sock:
        t = serve(sock, 2)
        said = served.fn(None)
        with pytest.raises(CheckFailed, match=r"729 days left.*inside the renewal window \(800 days\)"):
            wide.fn(None)
        t.join(10)
    assert not t.is_alive()
    assert "729 days left" in said and "CN=m3deploy edge life" in said
