"""The TLS profile (m3deploy/core/data/tls.yaml: Mozilla "intermediate" without DHE) in the files of the edge
(HAProxy 2.6), etcd 3.4 and NATS 2.9, each checked by the real tool (issue 35: TLS 1.2 offered CBC and SHA-1
suites). HAProxy: `haproxy -c` of the rendered haproxy.cfg; NATS: `nats-server -t` of the rendered nats.conf;
etcd: the plan's own --cipher-suites started on 127.0.0.1, where `openssl s_client -tls1_2 -cipher AES128-SHA` (a
CBC, SHA-1, RSA-key-exchange suite) gets no handshake and an ECDHE-AES-GCM one does. The edge and etcd on the
testbed: tests/e2e/test_internal_tls.py.

Also the edge's timeouts and buffer (m3_edge_timeout_server_s, m3_edge_retry_body_kb) as haproxy.cfg has them, and
the plan's etcd argv run by a real etcd with the controller's certificates: its peer port refuses a worker's client
certificate in the handshake (--peer-cert-allowed-cn) and serves the peer certificate.
"""
from __future__ import annotations

import datetime
import ipaddress
import socket
import subprocess
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from m3deploy.core import catalog, edge, internal_tls
from m3deploy.core.build import build
from m3deploy.core.inventory import InvHost
from m3deploy.deploy import hostfiles

SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
       "m3_edge": True, "m3_internal_tls": True}
BAD_TLS12 = ("AES128-SHA", "ECDHE-ECDSA-AES128-SHA", "ECDHE-RSA-AES256-SHA384", "DHE-RSA-AES128-GCM-SHA256")


def plan(**data):
    d = {**SIM, **data}
    return build([InvHost("ctl0", ("control",), {**d, "m3_address": "10.0.0.1"}),
                  InvHost("w0", ("workers",), {**d, "m3_address": "10.0.0.20"})], name="tp")


def files(p, host="ctl0") -> dict[str, str]:
    return {f.path: f.text for f in hostfiles.host_files(p, p.host(host))}


@pytest.fixture
def pem(tmp_path):
    """A certificate and key for 127.0.0.1 (EC P-256, as the cluster CA makes), as files and as one PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "t")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False).sign(key, hashes.SHA256()))
    crt, k = tmp_path / "t.crt", tmp_path / "t.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    k.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    both = tmp_path / "both.pem"
    both.write_bytes(crt.read_bytes() + k.read_bytes())
    return {"crt": str(crt), "key": str(k), "pem": str(both)}


def test_the_profile_is_mozilla_intermediate_without_cbc_or_sha1():
    prof = catalog.tls_profile()
    assert prof["name"] == "intermediate" and prof["min_version"] == "TLSv1.2"
    assert all(("GCM" in o or "CHACHA20" in o) and o.startswith("ECDHE-") for o in prof["openssl"]), prof["openssl"]
    for o, g in prof["tls12"]:  # the two spellings name one suite
        assert g.startswith("TLS_ECDHE_") and all((a in o) == (b in g) for a, b in (
            ("ECDSA", "ECDSA"), ("AES128-GCM-SHA256", "AES_128_GCM_SHA256"), ("AES256-GCM-SHA384", "AES_256_GCM_SHA384"),
            ("CHACHA20-POLY1305", "CHACHA20_POLY1305"))), (o, g)
    assert prof["tls13"] == ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"]


def test_haproxy_accepts_the_edge_config(tmp_path, pem):
    text = files(plan())[edge.EDGE_CONF]
    prof = catalog.tls_profile()
    assert f"ssl-default-bind-ciphers {':'.join(prof['openssl'])}" in text
    assert f"ssl-default-bind-ciphersuites {':'.join(prof['tls13'])}" in text
    assert "ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets prefer-client-ciphers" in text
    keys = tmp_path / "keys"
    keys.write_text("00\n")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text.replace(edge.EDGE_PEM, pem["pem"]).replace(edge.EDGE_KEYS, str(keys))
                   .replace(edge.EDGE_SOCKET, str(tmp_path / "admin.sock")))
    r = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_edge_timeout_and_buffer_come_from_their_settings():
    text = files(plan())[edge.EDGE_CONF]
    assert "timeout server 3600s" in text and "timeout client 3600s" in text and "tune.bufsize 65536" in text
    assert "option http-buffer-request" in text and "retry-on conn-failure empty-response 404 500 503" in text
    text = files(plan(m3_edge_timeout_server_s=7200, m3_edge_retry_body_kb=256))[edge.EDGE_CONF]
    assert "timeout server 7200s" in text and "tune.bufsize 262144" in text


def test_nats_server_accepts_the_config_with_the_profile(tmp_path, pem):
    p = plan()
    nats = p.host("ctl0").service("nats")
    conf = files(p)[hostfiles.nats_conf_path(nats)]
    want = "cipher_suites: [" + ", ".join(f'"{c}"' for c in catalog.tls_profile()["go"]) + "]"
    assert want in conf, conf
    paths = internal_tls.paths(nats)
    for kind, path in (("crt", paths["crt"]), ("key", paths["key"]), ("crt", paths["ca"])):
        conf = conf.replace(path, pem[kind])
    cfg = tmp_path / "nats.conf"
    cfg.write_text(conf.replace("$NATS_AUTH_USERNAME", "u").replace("$NATS_AUTH_PASSWORD", "p")
                   .replace(next(ln.split('"')[1] for ln in conf.splitlines() if "store_dir" in ln), str(tmp_path)))
    r = subprocess.run(["nats-server", "-t", "-c", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "is valid" in r.stdout + r.stderr, r.stdout + r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handshake(port: int, *args: str) -> str:
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *args], input="",
                       capture_output=True, text=True, timeout=30)
    return next((ln.strip() for ln in r.stdout.splitlines() if "Cipher is" in ln), "no Cipher line")


def test_etcd_offers_only_the_profile(tmp_path, pem):
    argv = plan().host("ctl0").service("etcd").argv
    ciphers = argv[argv.index("--cipher-suites") + 1]
    assert ciphers == ",".join(catalog.tls_profile()["go"])
    port, peer = _free_port(), _free_port()
    proc = subprocess.Popen(
        ["etcd", "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls", f"https://127.0.0.1:{port}",
         "--advertise-client-urls", f"https://127.0.0.1:{port}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}", "--initial-cluster",
         f"default=http://127.0.0.1:{peer}", "--cert-file", pem["crt"], "--key-file", pem["key"],
         "--cipher-suites", ciphers], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while "Cipher is ECDHE" not in _handshake(port, "-tls1_2") and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        assert _handshake(port, "-tls1_2") == "New, TLSv1.2, Cipher is ECDHE-ECDSA-AES128-GCM-SHA256"
        assert "TLSv1.3" in _handshake(port, "-tls1_3")
        for bad in BAD_TLS12:
            assert _handshake(port, "-tls1_2", "-cipher", bad) == "New, (NONE), Cipher is (NONE)", bad
        assert "TLSv1.1" not in _handshake(port, "-tls1_1")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


_PEER_GET = r"""
import socket, ssl, sys
port, ca, crt, key, path = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
ctx = ssl.create_default_context(cafile=ca)
ctx.load_cert_chain(crt, key)
try:
    with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1") as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        print("ANSWERED", s.recv(200)[:40])
except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
    print("REFUSED", e)
"""


def test_a_real_etcd_with_the_plans_flags_takes_only_the_peer_certificate_on_its_peer_port(tmp_path, monkeypatch):
    """The plan's etcd argv (m3_internal_tls), run by etcd 3.4 on 127.0.0.1 with the certificates the controller
    signs: on the peer port a worker's client certificate gets no answer, the peer certificate gets GET /members;
    the worker's certificate still works on the client port (issue 35)."""
    import sys

    from m3deploy.controller import tls

    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    d = {k: v for k, v in SIM.items() if k != "m3_edge"}
    p = build([InvHost("ctl0", ("control",), {**d, "m3_address": "127.0.0.1"}),
               InvHost("w0", ("workers",), {**d, "m3_address": "127.0.0.2"})], name="peer")
    certs = tls.cluster_certs(p)
    etcd = p.host("ctl0").service("etcd")
    for path, ref in etcd.secret_files:
        (tmp_path / path.rsplit("/", 1)[1]).write_text(certs[ref])
    client = {kind: tmp_path / f"w0-{kind}" for kind in ("crt", "key")}
    client["crt"].write_text(certs["tls-cert:w0:client"])
    client["key"].write_text(certs["tls-key:w0:client"])
    ports = {str(n): str(_free_port()) for n in (2379, 2380, 2381)}
    argv = []
    for a in etcd.argv:
        for n, free in ports.items():
            a = a.replace(f":{n}", f":{free}")
        argv.append(a.replace(internal_tls.TLS_DIR, str(tmp_path)).replace("/var/lib/m3/etcd/data",
                                                                          str(tmp_path / "data")))
    i = argv.index("--auth-token")
    del argv[i:i + 2]  # etcd's JWT key files: not what this test is about
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ca = str(tmp_path / "etcd-ca.crt")

    def get(port: str, crt, key, path: str) -> str:
        return subprocess.run([sys.executable, "-c", _PEER_GET, port, ca, str(crt), str(key), path],
                              capture_output=True, text=True, timeout=30).stdout

    try:
        deadline = time.monotonic() + 30
        while "ANSWERED" not in get(ports["2379"], client["crt"], client["key"], "/health"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
            time.sleep(0.3)
        got = get(ports["2380"], client["crt"], client["key"], "/members")
        assert got.startswith("REFUSED") and "SSL" in got, got  # the handshake itself fails (an alert)
        assert "200 OK" in get(ports["2380"], tmp_path / "etcd-peer.crt", tmp_path / "etcd-peer.key", "/members")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
