"""The cluster's address (m3_vip): Debian's keepalived, run by our m3-vip.service, on every control host.

Reads (through m3deploy.deploy.context): cluster_plan() (the control hosts, settings m3_vip / m3_vip_router_id);
host_plan().services of kind "vip". Files from m3deploy.deploy.vipfiles (the track script, keepalived.conf, the
unit); the interface from the host's fact m3deploy.facts.AddressInterfaces (the one holding its cluster address,
whose prefix must be m3_vip's).

- The package's keepalived.service is masked before the install (ours runs it, with /etc/m3/keepalived.conf).
- A changed unit, config or track script restarts keepalived. A restart of the holder releases the address (the
  next priority takes it within ~3 s); rare: the files change only with the plan.
- `wait_vip()`, after the workers started: the address is held by exactly one control host (each host's
  `ip -o -4 addr show`), within 60 s of the edges having a frontend UP. Runs on the endpoint's owner only.
"""
from __future__ import annotations

import time

import gevent
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from m3deploy.core import components, vip
from m3deploy.core.errors import M3Error
from m3deploy.deploy import vipfiles
from m3deploy.facts import AddressInterfaces, parse_ip_addr
from roles import hostops, lifecycle
from roles.hostops import run_on

WAIT_S = 60


def _interface(cp, hp) -> str:
    """The interface holding this host's cluster address, checked against m3_vip's prefix."""
    where = host.get_fact(AddressInterfaces).get(hp.address)
    want = vip.interface(dict(cp.settings))
    if not where:
        raise M3Error(f"host {hp.name}: no interface holds its cluster address {hp.address} (`ip -o -4 addr show`): "
                      "keepalived has no interface to run VRRP on. Fix: m3_address = the address of its cluster "
                      "interface")
    if where[1] != want.network.prefixlen:
        raise M3Error(f"host {hp.name}: {hp.address}/{where[1]} on {where[0]}, but m3_vip is {want} (prefix "
                      f"/{want.network.prefixlen}). Fix: m3_vip with the subnet's prefix, /{where[1]}")
    return where[0]


@deploy("Deploy the cluster's address")
def deploy_vip():
    cp, hp = lifecycle.plans()
    for s in lifecycle.role_services(hp, __name__):
        _mask, *files = vipfiles.vip_files(cp, s, _interface(cp, hp))  # the mask: install ships it
        lifecycle.install(s.kind, mask_name=f"Mask the package's {components.get(s.kind).package_unit}")
        *confs, unit_op = [hostops.ship(f) for f in files]
        lifecycle.activate(s.unit, unit_op, [unit_op, *confs, lifecycle.changes(s)[0]],
                           why="its unit, config or track script changed")


def holding(cp) -> dict[str, bool]:
    """{control host: does it hold m3_vip now}, asked of every host at once (over the deploy's connections)."""
    address = vip.address(dict(cp.settings))
    names = [h for h, _ in vipfiles.holders(cp)]
    jobs = {h: gevent.spawn(run_on, h, "ip -o -4 addr show") for h in names}
    gevent.joinall(list(jobs.values()))
    return {h: j.value[0] and address in parse_ip_addr(j.value[1]) for h, j in jobs.items()}


def _wait(cp) -> None:
    t0 = time.monotonic()
    while True:
        now = holding(cp)
        held = [h for h, v in now.items() if v]
        if len(held) == 1:
            host.log(f"{vip.address(dict(cp.settings))} held by {held[0]} ({time.monotonic() - t0:.1f} s)")
            return
        if time.monotonic() - t0 > WAIT_S:
            raise M3Error(f"{vip.address(dict(cp.settings))}: held by {held or 'no control host'} after {WAIT_S} s "
                          "(exactly one must). Fix: on the control hosts, `journalctl -u m3-vip` (FAULT: the track "
                          f"script {vip.VIP_CHECK} fails: is the edge UP?); VRRP between them (protocol 112)")
        time.sleep(0.5)


@deploy("Wait for the cluster's address")
def wait_vip():
    from roles.serving import endpoint_owner

    cp, hp = lifecycle.plans()
    if hp.name != endpoint_owner(cp) or not vip.enabled(dict(cp.settings)):
        return
    python.call(name=f"The cluster's address {vip.address(dict(cp.settings))} is held by exactly one control host",
                function=_wait, cp=cp)
