"""The edge (m3_edge, issue 25): the plan's frontends and HAProxy, its files, the keys at the edge, its TLS.

HAProxy itself runs in tests/e2e/test_edge.py (the testbed); here: what the plan and the files say, the key hashes
as HAProxy's `req.fhdr(authorization),sha2(256),hex` computes them, and a real TLS handshake with the certificate
the controller makes (m3deploy.controller.tls) against a client that trusts the cluster CA and one that does not.
"""
from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading

import pytest

from m3deploy.controller import tls
from m3deploy.controller.secrets import api_key, api_keys, read_api_keys
from m3deploy.core import edge
from m3deploy.core.build import build
from m3deploy.core.errors import M3Error, ValidationError
from m3deploy.core.inventory import InvHost
from m3deploy.deploy import edgefiles, hostfiles

SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1"}
KEYS = ["m3k-first-0123456789", "m3k-second-abcdef"]


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


@pytest.fixture
def key_file(tmp_path):
    p = tmp_path / "keys"
    p.write_text("".join(k + "\n" for k in KEYS))
    p.chmod(0o600)
    return p


def hosts(n_control=1, **data):
    d = {**SIM, "m3_edge": True, **data}
    out = [InvHost(name=f"ctl{i}", groups=("control",), data={**d, "m3_address": f"10.0.0.{i + 1}"})
           for i in range(n_control)]
    return out + [InvHost(name=f"w{i}", groups=("workers",), data={**d, "m3_address": f"10.0.0.{20 + i}"})
                  for i in range(2)]


def _fronts(p):
    return [s for h in p.hosts for s in h.services if s.kind == "frontend"]


# ---------------------------------------------------------------------------------------------- the plan
def test_edge_plan_two_frontends_per_control_host_and_the_edge_endpoint():
    p = build(hosts(), name="edge1")
    assert p.endpoint == "https://10.0.0.1:8443/v1"
    ctl = p.host("ctl0")
    fe0, fe1 = _fronts(p)
    assert (fe0.name, fe1.name) == ("m3-frontend", "m3-frontend-1")
    assert [q.port for q in fe0.ports + fe1.ports] == [8000, 8001]
    assert fe1.argv[fe1.argv.index("--http-port") + 1] == "8001" and fe0.argv[fe0.argv.index("--http-port") + 1] == "8000"
    assert dict(fe1.env)["HOME"] == fe1.workdir == "/var/lib/m3/m3-frontend-1" != fe0.workdir
    assert fe1.env_file == "/etc/m3/m3-frontend-1.env" and fe1.readiness.url == "http://10.0.0.1:8001/live"
    e = ctl.service(edge.EDGE_UNIT)
    assert e.kind == "edge" and [(q.address, q.port) for q in e.ports] == [("10.0.0.1", 8443)]
    assert not e.secret_env and not e.env  # nothing secret in the plan
    # the workers still start after the first frontend
    assert all("ctl0/m3-frontend" in s.after for h in p.group("workers") for s in h.services if s.rank == 0)


def test_without_the_edge_nothing_changes():
    p = build(hosts(m3_edge=False), name="noedge")
    assert p.endpoint == "http://10.0.0.1:8000/v1"
    assert [s.name for s in _fronts(p)] == ["m3-frontend"]
    assert not any(s.kind == "edge" for h in p.hosts for s in h.services)


def test_three_control_hosts_every_edge_fronts_every_frontend():
    p = build(hosts(3, m3_edge_frontends=1), name="edge3")
    servers = [(s["address"], s["port"]) for s in edgefiles.servers(p)]
    assert servers == [("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.3", 8000)]
    cfg = edgefiles.config(p, p.host("ctl1").service(edge.EDGE_UNIT)).text
    assert "bind 10.0.0.2:8443 ssl crt /etc/m3/edge.pem" in cfg
    for h in ("ctl0", "ctl1", "ctl2"):
        assert f"server {h}_m3-frontend 10.0.0." in cfg


@pytest.mark.parametrize("data,must", [
    ({"m3_edge_port": 8001}, "key m3_edge_port: 8001 is one of the frontends' ports (8000..8001"),
    ({"m3_tls_cert_file": "/x.pem"}, "keys m3_tls_cert_file / m3_tls_key_file: set both"),
    ({"m3_tls_ca_file": "/ca.pem"}, "key m3_tls_ca_file: only with m3_tls_cert_file"),
    ({"m3_serving": "standalone", "m3_engine": "vllm", "m3_platform": "h200"}, "key m3_edge: the edge fronts Dynamo"),
])
def test_edge_settings_refused_with_the_fix(data, must):
    with pytest.raises(ValidationError) as e:
        build(hosts(**data), name="bad")
    (line,) = [x for x in e.value.problems if must in x]
    assert "Fix:" in line, line


def test_api_key_file_works_for_dynamo_only_with_the_edge(key_file):
    p = build(hosts(m3_api_key_file=str(key_file)), name="keys")
    assert dict(p.settings)["m3_api_key_file"] == str(key_file)
    with pytest.raises(ValidationError, match="m3_edge = true"):
        build(hosts(m3_edge=False, m3_api_key_file=str(key_file)), name="nokeys")


# ---------------------------------------------------------------------------------------------- keys
def test_several_keys_only_with_the_edge(key_file):
    p = build(hosts(m3_api_key_file=str(key_file)), name="keys")
    assert api_keys(p) == KEYS and api_key(p) == KEYS[0]  # our clients send the first
    with pytest.raises(M3Error, match="more than one line .*only by the edge"):
        read_api_keys(str(key_file))


def test_key_hashes_are_what_haproxy_compares_and_hold_no_key():
    text = edge.key_hashes(KEYS)
    lines = text.splitlines()
    # HAProxy: the words of req.fhdr(authorization) after the scheme; sha2(256) then hex (upper case)
    assert lines == [hashlib.sha256(k.encode()).hexdigest().upper() for k in KEYS]
    assert not any(k in text for k in KEYS)


def test_edge_files_modes_masking_and_no_key_anywhere_readable(key_file):
    p = build(hosts(m3_api_key_file=str(key_file)), name="files")
    ctl = p.host("ctl0")
    masked = {f.path: f for f in hostfiles.host_files(p, ctl)}
    secrets = {edge.TLS_SECRET: tls.edge_pem(p), edge.KEYS_SECRET: edge.key_hashes(api_keys(p))}
    real = {f.path: f for f in edgefiles.edge_files(p, ctl.service(edge.EDGE_UNIT), secrets)}
    for path in (edge.EDGE_PEM, edge.EDGE_KEYS):
        assert masked[path].mode == real[path].mode == "0600" and masked[path].secret
        assert masked[path].text.startswith("<secret: ")
    assert "BEGIN CERTIFICATE" in real[edge.EDGE_PEM].text and "PRIVATE KEY" in real[edge.EDGE_PEM].text
    cfg = masked[edge.EDGE_CONF]
    assert cfg.mode == "0644" and not cfg.secret
    assert f"-m str -f {edge.EDGE_KEYS}" in cfg.text and "http-request return status 401" in cfg.text
    assert "http-request del-header authorization" in cfg.text  # the key never reaches a frontend
    assert f"stats socket {edge.EDGE_SOCKET} mode 600 level admin" in cfg.text
    for f in list(real.values()) + list(masked.values()):
        assert not any(k in f.text for k in KEYS), f.path
    assert masked[f"{hostfiles.UNIT_DIR}/haproxy.service"].link == "/dev/null"
    man = hostfiles.manifest(p, ctl)
    assert "haproxy" in man["packages"] and "m3-edge.service" in man["units"]
    assert {edge.EDGE_PEM, edge.EDGE_KEYS, edge.EDGE_CONF} <= set(man["files"])
    assert hostfiles.checked_manifest(man, "ctl0")  # teardown may remove every entry


def test_no_key_file_no_key_check():
    p = build(hosts(), name="open")
    files = {f.path: f for f in hostfiles.host_files(p, p.host("ctl0"))}
    assert edge.EDGE_KEYS not in files and "401" not in files[edge.EDGE_CONF].text


# ---------------------------------------------------------------------------------------------- TLS
def _serve_once(pem_text: str, tmp_path) -> int:
    pem = tmp_path / "edge.pem"
    pem.write_text(pem_text)
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(str(pem))
    sock = socket.create_server(("127.0.0.1", 0))

    def serve():
        for _ in range(2):
            conn, _ = sock.accept()
            try:
                with srv.wrap_socket(conn, server_side=True) as c:
                    c.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass
    threading.Thread(target=serve, daemon=True).start()
    return sock.getsockname()[1]


def test_cluster_ca_certificate_verified_by_our_clients_only(tmp_path):
    # the edge certificate names the control host's address; a client trusting the cluster CA accepts it
    p = build([InvHost(h.name, h.groups, {**h.data, "m3_address": "127.0.0.1" if h.name == "ctl0" else
                                           h.data["m3_address"]}) for h in hosts()], name="tlsca")
    port = _serve_once(tls.edge_pem(p), tmp_path)
    ca = tls.ca_file(p)
    assert ca and os.path.isfile(ca)
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            tls.client_context(p).wrap_socket(raw, server_hostname="127.0.0.1") as c:
        assert c.recv(2) == b"ok"
    with pytest.raises(ssl.SSLCertVerificationError), socket.create_connection(("127.0.0.1", port)) as raw, \
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1"):
        pass


def test_cluster_tls_made_once_and_again_only_when_the_names_change():
    p = build(hosts(), name="tlsonce")
    first = tls.edge_pem(p)
    assert tls.edge_pem(p) == first  # a re-run changes no file
    p3 = build(hosts(3, m3_edge_frontends=1), name="tlsonce")
    again = tls.edge_pem(p3)
    assert again != first
    store = tls.ensure_cluster_tls(p3)
    assert tls._sans(store[tls.EDGE_CERT]) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    path = tls.store.secrets_path("tlsonce")
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_user_certificate_must_be_private(tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n")
    cert.chmod(0o600)
    key.chmod(0o644)
    p = build(hosts(m3_tls_cert_file=str(cert), m3_tls_key_file=str(key)), name="usercert")
    with pytest.raises(M3Error, match=f"key m3_tls_key_file: {key} is readable by others .*chmod 600"):
        tls.edge_pem(p)
    key.chmod(0o600)
    assert tls.edge_pem(p).startswith("-----BEGIN CERTIFICATE-----") and tls.ca_file(p) is None


# ---------------------------------------------------------------------------------------------- bench
def test_bench_through_the_edge_verifies_with_the_ca_or_says_why_not(tmp_path):
    from m3deploy.check import bench

    p = build(hosts(), name="benchedge")
    env = bench.aiperf_env(p)
    assert env["SSL_CERT_FILE"] == tls.ca_file(p) and os.path.isfile(env["SSL_CERT_FILE"])
    assert bench.base_url(p) == "https://10.0.0.1:8443"
    with pytest.raises(M3Error, match="--client aiperf"):
        bench._run_vllm(p, None, 1, 1, tmp_path, None, None)
    assert bench.aiperf_env(build(hosts(m3_edge=False), name="benchplain")) is None
