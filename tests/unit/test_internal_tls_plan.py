"""TLS inside the cluster (m3_internal_tls, issue 25): etcd and NATS with client certificates of the cluster CA.

The plan (m3deploy.core.internal_tls), the files (nats.conf, units, the 0600 certificate files), the certificates
the controller signs (m3deploy.controller.tls.cluster_certs) and files/m3-tls-env. etcd, NATS and Dynamo refusing
or taking those certificates run in tests/e2e/test_internal_tls.py (the testbed). The env names Dynamo 1.6.1 reads
are checked against tests/fixtures/dynamo-1.6.1-tls-env.json (strings of the runtime, dynamo/_core.abi3.so, and
dynamo/common/configuration/groups/runtime_args.py) and tests/fixtures/engine-flags/ai-dynamo-1.6.1.json.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from m3deploy.controller import tls
from m3deploy.core import internal_tls
from m3deploy.core.build import AUTH_USER, build
from m3deploy.core.errors import ValidationError
from m3deploy.core.inventory import InvHost
from m3deploy.deploy import hostfiles

REPO = Path(__file__).resolve().parents[2]
SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", "m3_auth": True}
FIX = json.loads((REPO / "tests/fixtures/dynamo-1.6.1-tls-env.json").read_text())


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def hosts(n_control=1, **data):
    d = {**SIM, "m3_internal_tls": True, **data}
    out = [InvHost(name=f"ctl{i}", groups=("control",), data={**d, "m3_address": f"10.0.0.{i + 1}"})
           for i in range(n_control)]
    return out + [InvHost(name=f"w{i}", groups=("workers",), data={**d, "m3_address": f"10.0.0.{20 + i}"})
                  for i in range(2)]


def svc(p, host, kind):
    return next(s for h in p.hosts if h.name == host for s in h.services if s.kind == kind)


def test_off_by_default_nothing_changes():
    p = build(hosts(m3_internal_tls=False), name="t")
    assert p.etcd_endpoints.startswith("http://")
    assert not any(internal_tls.is_tls_ref(r) for h in p.hosts for s in h.services for _, r in s.secret_files)
    assert "--client-cert-auth" not in svc(p, "ctl0", "etcd").argv


def test_refused_without_a_control_plane():
    with pytest.raises(ValidationError) as e:
        build(hosts(m3_serving="standalone", m3_engine="vllm", m3_platform="h200", m3_parallel="tp8"), name="t")
    assert any(p.startswith("key m3_internal_tls:") and "Fix:" in p for p in e.value.problems), e.value.problems


def test_etcd_wants_client_and_peer_certificates():
    p = build(hosts(3), name="t")
    e = svc(p, "ctl1", "etcd")
    a = " ".join(e.argv)
    for flag in ("--client-cert-auth", "--peer-client-cert-auth", "--cert-file /etc/m3/tls/etcd.crt",
                 "--peer-trusted-ca-file /etc/m3/tls/etcd-ca.crt", "--listen-client-urls https://10.0.0.2:2379",
                 "--initial-cluster ctl0=https://10.0.0.1:2380,ctl1=https://10.0.0.2:2380,ctl2=https://10.0.0.3:2380"):
        assert flag in a
    assert "http://10.0.0.2:2379" not in a
    # /health without a certificate only on the metrics listener (no key space): readiness and verify read it
    assert e.readiness.url == "http://10.0.0.2:2381/health" and e.port("metrics").port == 2381
    assert p.etcd_endpoints == "https://10.0.0.1:2379,https://10.0.0.2:2379,https://10.0.0.3:2379"
    first = dict(svc(p, "ctl0", "etcd").env)  # the auth script logs in as a client with the member's certificate
    assert first["M3_ETCD_URL"].startswith("https://") and first["M3_ETCD_CERT"] == "/etc/m3/tls/etcd.crt"


def test_etcd_peers_take_only_the_peer_certificate():
    """etcd's peer port (2380) accepts only the `peer` leaf (CommonName internal_tls.PEER_CN, --peer-cert-allowed-cn);
    a worker's client certificate, the gateway's and NATS's are of the same CA but not that name (issue 35)."""
    from cryptography import x509

    p = build(hosts(3), name="t")
    a = " ".join(svc(p, "ctl1", "etcd").argv)
    assert f"--peer-cert-allowed-cn {internal_tls.PEER_CN}" in a
    assert "--peer-cert-file /etc/m3/tls/etcd-peer.crt --peer-key-file /etc/m3/tls/etcd-peer.key" in a
    assert "--cert-file /etc/m3/tls/etcd.crt" in a  # the client port keeps its own certificate
    certs = tls.cluster_certs(p)
    cn = {ref: x509.load_pem_x509_certificate(pem.encode()).subject.get_attributes_for_oid(
          x509.oid.NameOID.COMMON_NAME) for ref, pem in certs.items() if ref.startswith("tls-cert:")}
    peers = {ref for ref, names in cn.items() if [n.value for n in names] == [internal_tls.PEER_CN]}
    assert peers == {f"tls-cert:ctl{i}:peer" for i in range(3)}, cn


def test_dynamo_clients_get_the_env_names_dynamo_reads():
    p = build(hosts(), name="t")
    for host, kind in (("ctl0", "frontend"), ("w0", "worker")):
        s = svc(p, host, kind)
        env = dict(s.env)
        assert set(internal_tls.NATS_ENV.values()) <= set(FIX["nats_tls_env"])
        assert set(internal_tls.ETCD_ENV) <= set(FIX["etcd_auth_env"])
        assert env["NATS_TLS_CLIENT_KEY_PATH"] == f"/etc/m3/tls/{s.name}.key"
        assert env["NATS_SERVER"].startswith("tls://") and env["ETCD_ENDPOINTS"].startswith("https://")
        # ETCD_AUTH_* are PEM text: never in the env file, exported by the launcher from the 0600 files; no etcd
        # user or password for Dynamo (with one it ignores the TLS settings): it logs in by its certificate
        assert not set(internal_tls.ETCD_ENV) & set(env)
        assert "ETCD_AUTH_USERNAME" not in env and env["M3_ETCD_USER"] == AUTH_USER == internal_tls.COMMON_NAME["client"]
        assert dict(s.secret_env)["M3_ETCD_PASSWORD"] == "etcd-password" and "NATS_AUTH_PASSWORD" in dict(s.secret_env)
        assert env["M3_ETCD_CERT_FILE"] == f"/etc/m3/tls/{s.name}-gateway.crt"  # the unregister script's
        unit = hostfiles.unit_file(p, s).text
        start = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
        assert start.startswith(f"ExecStart={internal_tls.LAUNCHER} /etc/m3/tls/{s.name}-ca.crt "
                                f"/etc/m3/tls/{s.name}.crt /etc/m3/tls/{s.name}.key ")
    flags = (REPO / "tests/fixtures/engine-flags/ai-dynamo-1.6.1.json").read_text()
    assert "--nats-tls-client-cert-path" in flags and "--nats-tls-ca-cert-path" in flags


def test_nats_verifies_clients_and_routes():
    p = build(hosts(3), name="t")
    conf = hostfiles.nats_conf(p, svc(p, "ctl0", "nats")).text
    assert conf.count("\n  verify: true") + conf.count("\n    verify: true") == 2 and conf.count('cert_file: "/etc/m3/tls/nats.crt"') == 2
    cluster = conf[conf.index("cluster {"):]
    assert cluster.index("tls {") < cluster.index("routes:")


def test_files_are_0600_owned_by_their_reader_and_masked_in_render():
    p = build(hosts(), name="t")
    files = {f.path: f for h in p.hosts for f in hostfiles.host_files(p, h, None)}
    for path, user in (("/etc/m3/tls/etcd.key", "etcd"), ("/etc/m3/tls/nats.key", "nats"),
                       ("/etc/m3/tls/m3-frontend.key", "m3"), ("/etc/m3/tls/m3-worker@0.key", "m3")):
        f = files[path]
        assert (f.mode, f.user, f.group, f.secret) == ("0600", user, user, True)
        assert f.text.startswith("<secret: tls-key:")
    assert files[internal_tls.LAUNCHER].mode == "0755"
    assert "BEGIN" not in json.dumps(p.to_dict())  # no certificate or key in the plan


def test_controller_signs_each_host_once_with_the_cluster_ca(tmp_path):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    p = build(hosts(), name="t")
    certs = tls.cluster_certs(p)
    assert tls.cluster_certs(p) == certs  # a re-run signs nothing
    ca = x509.load_pem_x509_certificate(certs[internal_tls.CA_REF].encode())
    for name, address, usage in (("ctl0:etcd", "10.0.0.1", {"server", "client"}),
                                 ("ctl0:nats", "10.0.0.1", {"server", "client"}), ("w1:client", "10.0.0.21", {"client"}),
                                 ("w1:gateway", "10.0.0.21", {"client"})):
        c = x509.load_pem_x509_certificate(certs[f"tls-cert:{name}"].encode())
        c.verify_directly_issued_by(ca)
        # a Dynamo client logs in to etcd by its CommonName (the Dynamo user); the others have none: etcd 3.4's JSON
        # gateway refuses one (m3deploy.core.internal_tls.COMMON_NAME)
        assert c.subject.rfc4514_string() == ("CN=m3" if name.endswith(":client") else "")
        alt = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(a) for a in alt.get_values_for_type(x509.IPAddress)] == [address]
        eku = set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert eku == {{"server": ExtendedKeyUsageOID.SERVER_AUTH, "client": ExtendedKeyUsageOID.CLIENT_AUTH}[u]
                       for u in usage}
        assert "PRIVATE KEY" in certs[f"tls-key:{name}"]
    moved = build([h if h.name != "w1" else InvHost(h.name, h.groups, {**h.data, "m3_address": "10.0.0.99"})
                   for h in hosts()], name="t")
    again = tls.cluster_certs(moved)  # an address that changed gets a new certificate, the others stay
    assert again["tls-cert:w1:client"] != certs["tls-cert:w1:client"]
    assert again["tls-cert:ctl0:etcd"] == certs["tls-cert:ctl0:etcd"]


def test_launcher_exports_the_files_text_and_execs(tmp_path):
    files = []
    for n in ("ca", "crt", "key"):
        f = tmp_path / n
        f.write_text(f"-----BEGIN {n}-----\nline\n-----END {n}-----\n")
        files.append(str(f))
    out = subprocess.run(["sh", str(REPO / "files/m3-tls-env"), *files, "sh", "-c",
                          'printf "%s|%s|%s" "$ETCD_AUTH_CA" "$ETCD_AUTH_CLIENT_CERT" "$ETCD_AUTH_CLIENT_KEY"'],
                         capture_output=True, text=True, check=True).stdout
    assert out == "|".join(f"-----BEGIN {n}-----\nline\n-----END {n}-----" for n in ("ca", "crt", "key"))
    bad = subprocess.run(["sh", str(REPO / "files/m3-tls-env"), str(tmp_path / "missing"), *files[1:], "true"],
                         capture_output=True, text=True)
    assert bad.returncode != 0  # a missing file never starts the process without its certificate


def test_with_the_edge_every_frontend_is_a_tls_client():
    p = build(hosts(m3_edge=True), name="t")
    fronts = [s for h in p.hosts for s in h.services if s.kind == "frontend"]
    assert len(fronts) == 2 and all(s.launcher for s in fronts)
    assert len({internal_tls.paths(s)["key"] for s in fronts}) == 2  # each its own files
    assert p.endpoint.startswith("https://")


def test_prometheus_scrapes_etcd_on_its_plain_metrics_listener():
    from m3deploy.core import monitor

    p = build(hosts(m3_monitor=True), name="t")
    etcd = [t for t in monitor.targets(p) if t.job == "etcd"]
    assert [t.address for t in etcd] == ["10.0.0.1:2381"]  # not the client port, which wants a certificate


def test_verify_checks_each_control_host_and_each_tls_file():
    from m3deploy.check.verify import all_checks

    p = build(hosts(3), name="t")
    ids = {c.id: c for c in all_checks(p, smoke=False)}
    assert {f"tls/{k}/ctl{i}" for k in ("etcd", "nats") for i in range(3)} <= set(ids)
    assert ids["file/ctl0/etcd/etcd.key"].title == "/etc/m3/tls/etcd.key is 0600 etcd:etcd"
    assert ids["file/w0/m3-worker@0/m3-worker@0-gateway.key"].title.endswith("0600 m3:m3")
    off = build(hosts(m3_internal_tls=False), name="t")
    assert not [c.id for c in all_checks(off, smoke=False) if c.id.startswith("tls/")]
