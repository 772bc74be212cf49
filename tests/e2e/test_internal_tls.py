"""End-to-end: TLS inside the cluster (m3_internal_tls, issue 25) on its own testbed.

    python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_internal_tls.py

Testbed `m3vp2`, 10.141.0.0/24 (M3_ITLS_TESTBED / M3_ITLS_SUBNET move it): 3 control hosts (a 3-member etcd, a
3-node NATS cluster, 3 frontends) and 1 mocker worker host, a private controller config (secrets store, cluster CA)
in a temporary directory, deployed with `--data m3_internal_tls=true` (etcd auth on, the testbed's default).
1. `m3deploy verify` passes, with tls/etcd/* and tls/nats/* (a client without a certificate refused) and the
   frontends listing every worker (Dynamo reached etcd and NATS over TLS with its certificate);
2. from a host: etcd's client and peer ports and NATS's client and route ports refuse a TLS client without a
   certificate and a plain one; NATS's cluster says tls_required and tls_verify, with every route up;
3. nothing but sshd listens on a wildcard address, and no private key or password is in a world-readable file;
4. a killed worker's records are revoked through etcd's TLS port (files/m3-unregister-dead.py with the gateway
   certificate), and the worker is listed again.
4b. etcd's peer port refuses a worker's client certificate (the client port takes it), and the members still
   have a leader and every peer active (issue 35); the edge refuses `openssl s_client -tls1_2 -cipher AES128-SHA`
   and any CBC suite (the TLS profile, data/tls.yaml).
5. the cluster's address (m3_vip, keepalived on the 3 control hosts): the testbed is made with `net-admin`, the
   deploy adds `--data m3_edge=true --data m3_edge_frontends=1 --data m3_vip=<subnet>.200/24`; verify's vip/holder
   (exactly one control host holds it) and the endpoint's checks at it (HTTPS with the CA) pass; the holder's
   keepalived stopped: another control host holds it within 10 s, and keeps it when the first one is back
   (nopreempt). M3_ITLS_VIP=0 leaves the address and the edge out (M3_ITLS_EDGE=1 then deploys the edge alone).
M3_E2E_KEEP=1 keeps the testbed.
"""
from __future__ import annotations

import ipaddress
import json
import os
import tempfile
import time

import pytest
import tbrun

pytestmark = pytest.mark.e2e

NAME = os.environ.get("M3_ITLS_TESTBED", "m3vp2")
VIP_ON = os.environ.get("M3_ITLS_VIP", "1") == "1"  # m3_vip: keepalived's address in front of the edge
EDGE = VIP_ON or os.environ.get("M3_ITLS_EDGE") == "1"  # m3_edge: HAProxy with the cluster CA before the frontends
SUBNET = os.environ.get("M3_ITLS_SUBNET", "10.141.0.0/24")
VIP = str(ipaddress.ip_network(SUBNET)[200])
CONFIG = tempfile.mkdtemp(prefix="m3-e2e-itls-config-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "3", "M3DEPLOY_CONFIG": os.path.join(CONFIG, "m3")}
DATA = ("--data", "m3_internal_tls=true") + (("--data", "m3_edge=true") if EDGE else ()) + (
    ("--data", "m3_edge_frontends=1", "--data", f"m3_vip={VIP}/{ipaddress.ip_network(SUBNET).prefixlen}")
    if VIP_ON else ())
TB = tbrun.Testbed(NAME, SUBNET, 4, ENV, options=("net-admin",) if VIP_ON else ())

# on a host (python3 is on every host): connect to HOST:PORT, TLS with the CA only (no client certificate), send a
# request; prints what came back, or the error. A refusal prints REFUSED.
_ANON = r"""
import socket, ssl, sys
host, port, ca, preamble = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
ctx = ssl.create_default_context(cafile=ca)
try:
    with socket.create_connection((host, port), timeout=10) as raw:
        if preamble:
            raw.recv(4096)
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" if not preamble else b"PING\r\n")
            s.settimeout(10)
            got = s.recv(4096)
    print("ANSWERED" if got else "REFUSED closed", got[:80])
except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
    print("REFUSED", type(e).__name__, str(e)[:80])
"""
_PLAIN = r"""
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
with socket.create_connection((host, port), timeout=10) as s:
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    s.settimeout(10)
    try:
        got = s.recv(4096)
    except (ConnectionResetError, TimeoutError):
        got = b""
print("ANSWERED 200" if b" 200 " in got.split(b"\r\n", 1)[0] else "NO 200", got[:60])
"""


def plan():
    return TB.plan(DATA)


on = TB.on


def py(host: str, script: str, *args) -> str:
    import shlex

    return on(host, "python3 -c " + shlex.quote(script) + " " + " ".join(shlex.quote(str(a)) for a in args))


@pytest.fixture(scope="module")
def cluster(testbed_up):
    with testbed_up(TB, deploy=DATA, timeout=1500) as up:
        assert "PRIVATE KEY" not in up.deploy.stdout, "a private key in pyinfra's output"
        yield plan()


def _svc(p, kind):
    return [(h, s) for h in p.hosts for s in h.services if s.kind == kind]


def test_verify_passes_with_tls_checks(cluster):
    res = TB.verify(*DATA, "--json", timeout=600)
    doc = json.loads(res.stdout)
    bad = [(r["id"], r["evidence"]) for r in doc["results"] if not r["ok"]]
    assert res.returncode == 0 and doc["ok"], (bad, res.stderr[-2000:])
    ids = {r["id"] for r in doc["results"]}
    control = [h.name for h in cluster.hosts if any(s.kind == "etcd" for s in h.services)]
    assert {f"tls/{k}/{h}" for k in ("etcd", "nats") for h in control} <= ids
    assert any(i.startswith("instances/") for i in ids) and "smoke/chat" in ids
    if VIP_ON:
        assert cluster.endpoint == f"https://{VIP}:8443/v1", cluster.endpoint
        assert {"vip/holder", "edge/tls"} <= ids, ids


def test_etcd_and_nats_refuse_clients_without_a_certificate(cluster):
    worker = next(h.name for h in cluster.hosts if any(s.kind == "worker" for s in h.services))
    ca = f"/etc/m3/tls/{next(s.name for h in cluster.hosts if h.name == worker for s in h.services)}-ca.crt"
    for h, s in _svc(cluster, "etcd"):
        for port in ("client", "peer"):
            p = s.port(port)
            assert py(worker, _ANON, p.address, p.port, ca, 0).startswith("REFUSED"), (h.name, port)
            assert "ANSWERED 200" not in py(worker, _PLAIN, p.address, p.port), (h.name, port)
    for h, s in _svc(cluster, "nats"):
        for port in ("client", "cluster"):
            p = s.port(port)
            assert py(worker, _ANON, p.address, p.port, ca, 1 if port == "client" else 0).startswith("REFUSED"), (
                h.name, port)
        m = s.port("monitor")
        varz = json.loads(py(worker, "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read()"
                                     ".decode())", f"http://{m.address}:{m.port}/varz"))
        assert varz["tls_required"] and varz["tls_verify"], varz
        assert varz["cluster"]["tls_required"] and varz["cluster"]["tls_verify"], varz["cluster"]
        routez = json.loads(py(worker, "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read()"
                                       ".decode())", f"http://{m.address}:{m.port}/routez"))
        assert routez["num_routes"] == len(_svc(cluster, "nats")) - 1, routez  # the routes came up over TLS


# on a host: TLS to HOST:PORT with a client certificate (CRT, KEY) of the cluster CA, then GET PATH
_WITH_CERT = r"""
import socket, ssl, sys
host, port, ca, crt, key, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
ctx = ssl.create_default_context(cafile=ca)
ctx.load_cert_chain(crt, key)
try:
    with socket.create_connection((host, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            s.settimeout(10)
            got = s.recv(4096)
    print("ANSWERED" if got else "REFUSED closed", got[:80])
except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
    print("REFUSED", type(e).__name__, str(e)[:80])
"""


def test_etcd_peers_refuse_a_workers_certificate_and_still_form_the_cluster(cluster):
    """Issue 35: a worker's client certificate (of the same cluster CA) got GET /members 200 on etcd's peer port.
    Now the peer port takes only the peer leaf (--peer-cert-allowed-cn); the same certificate still works on the
    client port, and the members still elect a leader over their peer certificates."""
    h, w = _svc(cluster, "worker")[0]
    files = dict((path, ref) for path, ref in w.secret_files)
    crt = next(p for p, r in files.items() if r.startswith("tls-cert:") and r.endswith(":client"))
    key = next(p for p, r in files.items() if r.startswith("tls-key:") and r.endswith(":client"))
    ca = next(p for p, r in files.items() if r == "cluster-ca-cert")
    for c, e in _svc(cluster, "etcd"):
        peer, client = e.port("peer"), e.port("client")
        got = py(h.name, _WITH_CERT, peer.address, peer.port, ca, crt, key, "/members")
        assert got.startswith("REFUSED SSL"), (c.name, got)  # the handshake fails (an alert), not an empty answer
        got = py(h.name, _WITH_CERT, client.address, client.port, ca, crt, key, "/health")
        assert got.startswith("ANSWERED") and " 200 " in got, (c.name, got)  # a valid certificate, on its port
        m = e.port("metrics")
        metrics = py(h.name, "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())",
                     f"http://{m.address}:{m.port}/metrics")
        assert "etcd_server_has_leader 1" in metrics, c.name
        peers = [ln for ln in metrics.splitlines() if ln.startswith("etcd_network_active_peers{")]
        assert len(peers) == len(_svc(cluster, "etcd")) - 1 and all(ln.endswith(" 1") for ln in peers), peers


def _s_client(address: str, port: int, *args: str) -> str:
    """openssl s_client on the controller (it reaches the testbed's bridge): the negotiated cipher line."""
    import subprocess

    r = subprocess.run(["openssl", "s_client", "-connect", f"{address}:{port}", *args], input="",
                       capture_output=True, text=True, timeout=30)
    return next((ln.strip() for ln in r.stdout.splitlines() if "Cipher is" in ln), "no Cipher line")


@pytest.mark.skipif(not EDGE, reason="M3_ITLS_VIP=0 and no M3_ITLS_EDGE: no edge in this run")
def test_the_edge_offers_only_the_tls_profile(cluster):
    """data/tls.yaml (Mozilla intermediate): TLS 1.2 with ECDHE + AEAD only, TLS 1.3; no CBC/SHA-1 suite."""
    for h, s in _svc(cluster, "edge"):
        p = s.port("https")
        assert _s_client(p.address, p.port, "-tls1_2", "-cipher", "AES128-SHA") == "New, (NONE), Cipher is (NONE)"
        assert _s_client(p.address, p.port, "-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA") == (
            "New, (NONE), Cipher is (NONE)"), h.name
        assert _s_client(p.address, p.port, "-tls1_2").startswith("New, TLSv1.2, Cipher is ECDHE-ECDSA-"), h.name
        assert "TLSv1.3" in _s_client(p.address, p.port, "-tls1_3"), h.name
        assert "TLSv1.1" not in _s_client(p.address, p.port, "-tls1_1"), h.name


def test_only_sshd_on_wildcard_and_no_secret_world_readable(cluster):
    for h in cluster.hosts:
        wild = [ln for ln in on(h.name, "ss -ltnpH").splitlines()
                if ln.split()[3].rsplit(":", 1)[0] in ("0.0.0.0", "[::]", "*") and '"sshd"' not in ln]
        assert not wild, (h.name, wild)
        # every TLS key 0600; no world-readable file under /etc/m3 holds a private key
        out = on(h.name, "stat -c '%a %U %n' /etc/m3/tls/*.key; "
                         "for f in $(find /etc/m3 /usr/local/lib/m3 -type f -perm -o+r); do "
                         "grep -l 'PRIVATE KEY' \"$f\" || true; done")
        lines = out.splitlines()
        assert lines and all(ln.startswith("600 ") for ln in lines if ln.endswith(".key")), (h.name, lines)
        assert not [ln for ln in lines if not ln.endswith(".key") or not ln.startswith("600 ")], (h.name, lines)


def test_a_killed_worker_is_unregistered_through_tls(cluster):
    h, s = _svc(cluster, "worker")[0]
    on(h.name, f"systemctl kill -s KILL {s.unit}")
    deadline, log = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        log = on(h.name, f"journalctl -u {s.unit} --no-pager -o cat -n 200 | grep -a m3-unregister-dead || true")
        if "revoked lease" in log or "no record" in log:
            break
        time.sleep(1)
    assert "revoked lease" in log or "no record" in log, log
    assert "not reachable" not in log.splitlines()[-1], log
    from m3deploy.check import readiness

    fe = _svc(cluster, "frontend")[0][1]
    port = fe.port("http")
    readiness.wait_instances(f"http://{port.address}:{port.port}/health", 2, timeout_s=120)


def _holders(p) -> list[str]:
    return [h.name for h in p.group("control") if f" {VIP}/" in on(h.name, "ip -o -4 addr show")]


def _wait_holder(p, not_on: str, timeout: float = 10) -> str:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = _holders(p)
        if len(now) == 1 and now[0] != not_on:
            return now[0]
        time.sleep(0.2)
    checks = {h.name: on(h.name, "/etc/m3/vip-check >/dev/null 2>&1 && echo ok || echo failed").strip()
              for h in p.group("control")}
    raise AssertionError(f"{VIP} held by {_holders(p)} {timeout} s after keepalived stopped on {not_on or 'none'} "
                         f"(the track script /etc/m3/vip-check: {checks})")


@pytest.mark.skipif(not VIP_ON, reason="M3_ITLS_VIP=0: no m3_vip in this run")
def test_the_address_moves_when_its_holder_stops_and_stays_when_it_is_back(cluster):
    # held by one control host first: the track script releases it while the edge has no frontend UP (in a cold CI
    # run, right after the killed-worker test above, no host held it at the first look)
    first = _wait_holder(cluster, not_on="", timeout=30)
    on(first, "systemctl stop m3-vip")
    try:
        second = _wait_holder(cluster, not_on=first)
    finally:
        on(first, "systemctl start m3-vip")
    ca = os.path.join(ENV["M3DEPLOY_CONFIG"], cluster.name, "ca.pem")
    import ssl
    import urllib.request

    with urllib.request.urlopen(cluster.endpoint + "/models", timeout=30,
                                context=ssl.create_default_context(cafile=ca)) as r:
        assert r.status == 200  # the address answers HTTPS with the CA, from the host that took it
    time.sleep(5)  # keepalived on the first host is back (BACKUP) within a few advertisements
    assert _holders(cluster) == [second]  # nopreempt: the address did not move back
