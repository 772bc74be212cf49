"""End-to-end: the testbed's `net-admin` host option (issue 25: what a VRRP address needs on the testbed).

    python3 -m pytest -p no:cacheprovider -m e2e tests/e2e/test_testbed_net_admin.py

Testbed `m3vp3`, 10.142.0.0/24 (M3_NETADMIN_TESTBED / M3_NETADMIN_SUBNET move it), 2 hosts made with
`options=("net-admin",)` (`m3deploy testbed up --net-admin`: systemd-nspawn `--capability=CAP_NET_ADMIN`).
1. a host can add an address to its eth0 (without the option: "Operation not permitted", docs/OPERATIONS.md);
2. the other host reaches a TCP listener on that address across the bridge (ARP for it is answered), and no longer
   once it is removed: a moving address like keepalived's works on the testbed's bridge.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import time

import pytest

from m3deploy.testbed import core as testbed

pytestmark = pytest.mark.e2e

NAME = os.environ.get("M3_NETADMIN_TESTBED", "m3vp3")
SUBNET = os.environ.get("M3_NETADMIN_SUBNET", "10.142.0.0/24")
VIP = str(ipaddress.ip_network(SUBNET)[200])

_CONNECT = ("import socket,sys\ntry:\n    socket.create_connection((sys.argv[1], 8999), timeout=3).close(); print('OK')\n"
            "except OSError as e:\n    print('NO', e)")


def run(host: str, cmd: str):
    return testbed.run_on(NAME, host, cmd, timeout=60)


@pytest.fixture(scope="module")
def hosts():
    testbed.up(2, name=NAME, subnet=SUBNET, options=("net-admin",), log=lambda *a, **k: None)
    try:
        yield [f"{NAME}-01", f"{NAME}-02"]
    finally:
        if not os.environ.get("M3_E2E_KEEP"):
            testbed.down(name=NAME, log=lambda *a, **k: None)


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
