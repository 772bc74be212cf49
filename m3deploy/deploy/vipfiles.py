"""The cluster address's host files (m3deploy.core.vip), as pure text: part of m3deploy.deploy.hostfiles.host_files.

- the package's keepalived.service masked (a link to /dev/null, first: ours runs it with our config),
- /etc/m3/vip-check (0755 root: keepalived's track script; the edge's runtime API is root only),
- /etc/m3/keepalived.conf (0644: no secret, no VRRP password: m3deploy.core.vip says why),
- /etc/systemd/system/m3-vip.service (keepalived --dont-fork --vrrp; `keepalived -t` first).

The interface keepalived runs VRRP on is the one holding the host's cluster address: a fact of the host
(m3deploy.facts.AddressInterfaces, read by roles/vip.py), so `m3deploy render`, which reads no host, names it
`<interface of ADDRESS>`.
"""
from __future__ import annotations

from m3deploy.core import components, edge, vip
from m3deploy.core.errors import M3Error
from m3deploy.core.model import ClusterPlan, Service
from m3deploy.deploy.hostfile import HostFile, package_mask, unit_path
from m3deploy.deploy.render import render

ADVERT_S = 1  # VRRP advertisement interval: a holder that stops advertising is replaced after ~3 s (3 x + skew)
CHECK = {"check_interval_s": 1, "check_timeout_s": 2, "check_fall": 2, "check_rise": 2}
CHECK_NAME = "m3_edge"


def holders(cp: ClusterPlan) -> list[tuple[str, str]]:
    """(host, address) of every host running keepalived for the cluster's address, in priority order."""
    return [(h.name, h.address) for h in cp.hosts if any(s.kind == "vip" for s in h.services)]


def unknown_interface(address: str) -> str:
    return f"<interface of {address}>"


def config(cp: ClusterPlan, s: Service, interface: str | None) -> HostFile:
    settings = dict(cp.settings)
    peers = holders(cp)
    index = [h for h, _ in peers].index(s.host)
    address = peers[index][1]
    text = render("keepalived.conf.j2", cluster=cp.name, host=s.host, check=vip.VIP_CHECK, check_name=CHECK_NAME,
                  **CHECK, instance=vip.INSTANCE, interface=interface or unknown_interface(address),
                  router_id=vip.router_id(settings), priority=vip.priority(index), advert_s=ADVERT_S,
                  address=address, peers=[a for h, a in peers if h != s.host],
                  vip=str(vip.interface(settings)))
    return HostFile(vip.VIP_CONF, text)


def check_script(cp: ClusterPlan) -> HostFile:
    text = render("m3-vip-check.j2", cluster=cp.name, socket=edge.EDGE_SOCKET, frontend=edge.FRONTEND,
                  backend=edge.BACKEND)
    return HostFile(vip.VIP_CHECK, text, mode="0755")


def unit(cp: ClusterPlan, s: Service) -> HostFile:
    check = ("/usr/sbin/keepalived", "--config-test", "--use-file", vip.VIP_CONF)
    text = render(components.get("vip").template, cluster=cp.name, service=s, check=check,
                  after=" ".join(f"{a.split('/', 1)[1]}.service" for a in s.after),
                  rundir=vip.VIP_RUN.removeprefix("/run/"))
    return HostFile(unit_path(s), text)


def vip_files(cp: ClusterPlan, s: Service, interface: str | None = None) -> list[HostFile]:
    """In deploy order: the mask, the track script (the config names it), the config, the unit."""
    if interface is not None and not interface.replace("-", "").replace(".", "").replace("_", "").isalnum():
        raise M3Error(f"{s.host}: interface {interface!r} of its address is not a plain interface name")
    return [package_mask("vip"), check_script(cp), config(cp, s, interface), unit(cp, s)]
