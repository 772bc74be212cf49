"""End-to-end: the testbed's `net-admin` host option (issue 25: what a VRRP address needs on the testbed).

    python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_testbed_net_admin.py

Testbed `m3vp3`, 10.142.0.0/24 (M3_NETADMIN_TESTBED / M3_NETADMIN_SUBNET move it), 2 hosts made with
`options=("net-admin",)` (`m3deploy testbed up --net-admin`: systemd-nspawn `--capability=CAP_NET_ADMIN`).
1. a host can add an address to its eth0 (without the option: "Operation not permitted", docs/OPERATIONS.md);
2. the other host reaches a TCP listener on that address across the bridge (ARP for it is answered), and no longer
   once it is removed: a moving address like keepalived's works on the testbed's bridge;
3. VRRP runs on the bridge: Debian's keepalived (multicast advertisements, 224.0.0.18) on both hosts puts the
   address on one; cutting that host off (its eth0 down, from the machine: `ip netns exec`) moves the address to the
   other within a few advertisement intervals.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import subprocess
import time

import pytest
import tbrun

from m3deploy.testbed import config as tbconfig
from m3deploy.testbed import core as testbed
from roles.hostops import APT_RETRIES

pytestmark = pytest.mark.e2e

NAME = os.environ.get("M3_NETADMIN_TESTBED", "m3vp3")
SUBNET = os.environ.get("M3_NETADMIN_SUBNET", "10.142.0.0/24")
VIP = str(ipaddress.ip_network(SUBNET)[200])
TB = tbrun.Testbed(NAME, SUBNET, 2, options=("net-admin",))

_CONNECT = ("import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], 8999), timeout=3).close(); print('OK')\n"
            "except OSError as e:\n    print('NO', e)")


def run(host: str, cmd: str, timeout: float = 60):
    return testbed.run_on(NAME, host, cmd, timeout=timeout)


@pytest.fixture(scope="module")
def hosts(testbed_up):
    with testbed_up(TB):
        yield [f"{NAME}-01", f"{NAME}-02"]


def test_an_added_address_is_reachable_across_the_bridge(hosts):
    a, b = hosts
    add = run(a, f"ip addr add {VIP}/24 dev eth0")
    assert add.returncode == 0, add.stdout + add.stderr
    listen = run(a, f"systemd-run --unit m3-vip-probe python3 -c {shlex.quote(_LISTEN)} {VIP}")
    assert listen.returncode == 0, listen.stdout + listen.stderr
    for _ in range(40):  # the probe's unit starts asynchronously
        got = run(b, f"python3 -c {shlex.quote(_CONNECT)} {VIP}")
        if got.stdout.startswith("OK"):
            break
        time.sleep(0.25)
    assert got.stdout.startswith("OK"), got.stdout + got.stderr
    assert run(a, f"ip addr del {VIP}/24 dev eth0").returncode == 0
    gone = run(b, f"ip neigh flush all; python3 -c {shlex.quote(_CONNECT)} {VIP}")
    assert gone.stdout.startswith("NO"), gone.stdout


_LISTEN = ("import socket,sys\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind((sys.argv[1], 8999)); s.listen()\nwhile True:\n    c, _ = s.accept(); c.close()")


_KEEPALIVED = """vrrp_instance m3probe {{
  state BACKUP
  interface eth0
  virtual_router_id 51
  priority {prio}
  advert_int 1
  nopreempt
  virtual_ipaddress {{
    {vip}/24 dev eth0
  }}
}}
"""


def _ns(host: str) -> str:
    return tbconfig.netns_name(NAME, int(host.rsplit("-", 1)[1]))


def _has_vip(host: str) -> bool:
    return f" {VIP}/24" in subprocess.run(["ip", "netns", "exec", _ns(host), "ip", "-br", "addr", "show", "eth0"],
                                           capture_output=True, text=True, check=True).stdout


def _wait_vip(host: str, timeout: float = 20) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _has_vip(host):
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"{VIP} not on {host} after {timeout} s")


def test_keepalived_moves_the_address_when_its_host_is_cut_off(hosts):
    for i, h in enumerate(hosts):
        # apt through the testbed's cache, retried as the deploy's own apt operations are (roles/hostops.py
        # APT_RETRIES: a cold cache's first fetch once failed here, unseen); apt's words stay in the failure
        tries, delay = APT_RETRIES["_retries"] + 1, APT_RETRIES["_retry_delay"]
        r = run(h, f"for t in $(seq {tries}); do apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install "
                   f"-y -qq keepalived >/dev/null && break; sleep {delay}; done; dpkg -s keepalived >/dev/null && "
                   "mkdir -p /etc/keepalived && cat > /etc/keepalived/keepalived.conf <<'E'\n"
                   + _KEEPALIVED.format(prio=150 - 50 * i, vip=VIP) + "E\nsystemctl restart keepalived", timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
    _wait_vip(hosts[0])
    assert not _has_vip(hosts[1])  # the advertisements crossed the bridge: the other stayed backup
    subprocess.run(["ip", "netns", "exec", _ns(hosts[0]), "ip", "link", "set", "eth0", "down"], check=True)
    try:
        took = _wait_vip(hosts[1])
    finally:
        subprocess.run(["ip", "netns", "exec", _ns(hosts[0]), "ip", "link", "set", "eth0", "up"], check=True)
    assert took < 10, took  # advert_int 1: master down after 3 intervals plus skew
    print(f"VRRP failover: {VIP} on {hosts[1]} {took:.1f} s after {hosts[0]} was cut off")
