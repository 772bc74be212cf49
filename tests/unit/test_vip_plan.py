"""The cluster's one address (m3_vip, issue 25): the plan's keepalived, the endpoint, the edge's binds and
certificate, the schema's refusals, and the rendered keepalived.conf checked by Debian's keepalived itself
(`keepalived --config-test`, keepalived 2.2.7 of Debian 12; scripts/install-deps.sh installs it on the controller).

VRRP itself runs in tests/e2e/test_internal_tls.py (3 control hosts, the address held by one) and the drill
tests/e2e/test_drills_edge.py (the holder cut off under load).
"""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from m3deploy.controller import tls
from m3deploy.core import edge, vip
from m3deploy.core.build import build
from m3deploy.core.errors import ValidationError
from m3deploy.core.inventory import InvHost
from m3deploy.deploy import edgefiles, hostfiles, vipfiles

SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1"}
VIP = "10.0.0.200/24"


@pytest.fixture(autouse=True)
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))


def hosts(n_control=3, **data):
    d = {**SIM, "m3_edge": True, "m3_vip": VIP, **data}
    out = [InvHost(name=f"ctl{i}", groups=("control",), data={**d, "m3_address": f"10.0.0.{i + 1}"})
           for i in range(n_control)]
    return out + [InvHost(name=f"w{i}", groups=("workers",), data={**d, "m3_address": f"10.0.0.{20 + i}"})
                  for i in range(2)]


def test_the_endpoint_is_the_vip_and_every_control_host_runs_keepalived_after_its_edge():
    p = build(hosts(), name="vip3")
    assert p.endpoint == "https://10.0.0.200:8443/v1"
    for h in ("ctl0", "ctl1", "ctl2"):
        s = p.host(h).service(vip.VIP_UNIT)
        assert s.kind == "vip" and s.after == (f"{h}/{edge.EDGE_UNIT}",)
        assert s.argv[:3] == ("/usr/sbin/keepalived", "--dont-fork", "--vrrp")
        e = p.host(h).service(edge.EDGE_UNIT)
        assert [(x.address, x.port) for x in e.ports] == [(f"10.0.0.{int(h[-1]) + 1}", 8443), ("10.0.0.200", 8443)]
    assert not any(s.kind == "vip" for h in ("w0", "w1") for s in p.host(h).services)
    assert dict(p.settings)["m3_vip"] == VIP


def test_without_m3_vip_nothing_changes():
    p = build(hosts(m3_vip=None), name="novip")
    assert p.endpoint == "https://10.0.0.1:8443/v1"
    assert "m3_vip" not in dict(p.settings) and "m3_vip_router_id" not in dict(p.settings)
    assert not any(s.kind == "vip" for h in p.hosts for s in h.services)


def test_the_edge_listens_on_the_vip_with_transparent_and_its_certificate_names_it():
    p = build(hosts(), name="vip3")
    cfg = edgefiles.config(p, p.host("ctl1").service(edge.EDGE_UNIT)).text
    assert "bind 10.0.0.2:8443 ssl crt /etc/m3/edge.pem\n" in cfg
    assert "bind 10.0.0.200:8443 transparent ssl crt /etc/m3/edge.pem\n" in cfg
    assert tls.edge_names(p) == ["10.0.0.1", "10.0.0.2", "10.0.0.200", "10.0.0.3"]


def test_keepalived_conf_priorities_unicast_peers_track_script_and_no_secret():
    p = build(hosts(), name="vip3")
    confs = {h: vipfiles.config(p, p.host(h).service(vip.VIP_UNIT), "eth0").text for h in ("ctl0", "ctl1", "ctl2")}
    assert [int(c.split("\n    priority ")[1].split()[0]) for c in confs.values()] == [150, 140, 130]
    c1 = confs["ctl1"]
    assert "unicast_src_ip 10.0.0.2\n" in c1
    peers = c1.split("unicast_peer {")[1].split("}")[0].split()
    assert peers == ["10.0.0.1", "10.0.0.3"]
    assert "virtual_router_id 200\n" in c1  # the address's last octet
    assert "10.0.0.200/24 dev eth0" in c1 and "nopreempt" in c1 and "state BACKUP" in c1
    assert f'script "{vip.VIP_CHECK}"' in c1 and "track_script {\n        m3_edge\n" in c1
    assert "auth_pass" not in c1 and "authentication" not in c1
    files = vipfiles.vip_files(p, p.host("ctl0").service(vip.VIP_UNIT))
    assert [f.path for f in files] == ["/etc/systemd/system/keepalived.service", vip.VIP_CHECK, vip.VIP_CONF,
                                       "/etc/systemd/system/m3-vip.service"]
    assert files[0].link == "/dev/null" and files[1].mode == "0755" and not any(f.secret for f in files)
    assert "interface <interface of 10.0.0.1>" in files[2].text  # render reads no host: the deploy's fact fills it


def test_router_id_can_be_set_and_the_manifest_removes_keepalived():
    p = build(hosts(m3_vip_router_id=17), name="vip3")
    assert "virtual_router_id 17\n" in vipfiles.config(p, p.host("ctl0").service(vip.VIP_UNIT), "eth0").text
    m = hostfiles.manifest(p, p.host("ctl0"))
    assert "keepalived" in m["packages"] and "m3-vip.service" in m["units"]
    assert vip.VIP_CONF in m["files"] and vip.VIP_CHECK in m["files"]
    # teardown accepts the whole manifest, keepalived.service's mask included (refused before the registry named it)
    assert "/etc/systemd/system/keepalived.service" in m["links"]
    assert hostfiles.checked_manifest(m, "ctl0")["links"] == m["links"]


@pytest.mark.parametrize("data,n,must", [
    ({"m3_vip": "10.0.0.200"}, 3, "key m3_vip: '10.0.0.200' has no prefix length"),
    ({"m3_vip": "10.0.0.300/24"}, 3, "key m3_vip: '10.0.0.300/24' is not an IPv4 address with its prefix"),
    ({"m3_vip": "10.9.0.200/24"}, 3, "key m3_vip: 10.9.0.200/24 is not in control host ctl0's subnet"),
    ({"m3_vip": "10.0.0.2/24"}, 3, "key m3_vip: 10.0.0.2 is host ctl1's own address"),
    ({"m3_vip": "10.0.0.21/24"}, 3, "key m3_vip: 10.0.0.21 is host w1's own address"),
    ({"m3_vip": "10.0.0.255/24"}, 3, "key m3_vip: 10.0.0.255 is the broadcast address of 10.0.0.0/24"),
    ({}, 1, "key m3_vip: 1 control host: nothing to move the address to"),
    ({"m3_edge": False}, 3, "key m3_vip: the address is the edge's"),
    ({"m3_vip": None, "m3_vip_router_id": 9}, 3, "key m3_vip_router_id: only with m3_vip"),
    ({"m3_vip_router_id": 256}, 3, "m3_vip_router_id"),
])
def test_m3_vip_refused_with_the_key_and_the_fix(data, n, must):
    with pytest.raises(ValidationError) as e:
        build(hosts(n, **data), name="bad")
    (line,) = [x for x in e.value.problems if must in x]
    assert "Fix:" in line or "range" in line, line


KEEPALIVED = shutil.which("keepalived") or ("/usr/sbin/keepalived" if os.path.exists("/usr/sbin/keepalived") else "")


@pytest.mark.skipif(not KEEPALIVED, reason="Debian's keepalived is not installed (scripts/install-deps.sh --test)")
def test_rendered_keepalived_conf_passes_keepalived_config_test(tmp_path):
    """keepalived 2.2.7's own parser (`--config-test`: exit status 0 and no warning for our config); it must also
    reject a broken one, so the test can fail."""
    p = build(hosts(), name="vip3")
    s = p.host("ctl1").service(vip.VIP_UNIT)
    files = {f.path: f for f in vipfiles.vip_files(p, s, "eth0")}
    script = tmp_path / "vip-check"
    script.write_text(files[vip.VIP_CHECK].text)
    script.chmod(0o755)
    for d in (tmp_path, *tmp_path.parents):  # enable_script_security: no one but root may write the path
        if d.stat().st_mode & 0o022 and not d.stat().st_mode & 0o1000:
            pytest.skip(f"{d} is group/world-writable: keepalived's script security would refuse any script in it")
    conf = tmp_path / "keepalived.conf"
    conf.write_text(files[vip.VIP_CONF].text.replace(vip.VIP_CHECK, str(script)))

    def check(path) -> subprocess.CompletedProcess:
        return subprocess.run([KEEPALIVED, "--config-test", "--use-file", str(path)], capture_output=True, text=True,
                              timeout=30, check=False)

    ok = check(conf)
    assert ok.returncode == 0, ok.stderr
    assert "unknown keyword" not in ok.stderr.lower() and "warning" not in ok.stderr.lower(), ok.stderr
    bad = tmp_path / "bad.conf"
    bad.write_text(conf.read_text().replace("virtual_router_id 200", "virtual_router_id 300"))
    assert check(bad).returncode != 0


# `ip -o -4 addr show` on a testbed control host holding the address (iproute2 6.1, Debian 12)
IP_ADDR = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: eth0@if41    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever preferred_lft forever
2: eth0@if41    inet 10.0.0.200/24 scope global secondary eth0\\       valid_lft forever preferred_lft forever
"""


def test_ip_addr_fact_finds_the_interface_and_prefix_of_each_address():
    from m3deploy.facts import parse_ip_addr

    got = parse_ip_addr(IP_ADDR)
    assert got["10.0.0.2"] == ("eth0", 24) and got["10.0.0.200"] == ("eth0", 24) and got["127.0.0.1"] == ("lo", 8)
    assert parse_ip_addr("") == {}


@pytest.mark.parametrize("held_by,ok", [(["ctl1"], True), ([], False), (["ctl0", "ctl2"], False)])
def test_verify_vip_holder_wants_exactly_one_control_host(held_by, ok):
    from types import SimpleNamespace

    from m3deploy.check.checks import CheckFailed
    from m3deploy.check.verify.edge import _vip_holder, edge_checks

    p = build(hosts(), name="vip3")
    assert "vip/holder" in [c.id for c in edge_checks(p)]
    asked = []

    def run(name, command):
        asked.append(name)
        out = IP_ADDR if name in held_by else IP_ADDR.replace("10.0.0.200/24", "10.0.0.9/24")
        return SimpleNamespace(rc=0, stdout=out, stderr="")

    ctx = SimpleNamespace(plan=p, run=run)
    if ok:
        assert _vip_holder(ctx).startswith("10.0.0.200 held by ctl1")
    else:
        with pytest.raises(CheckFailed, match="exactly one must"):
            _vip_holder(ctx)
    assert asked == ["ctl0", "ctl1", "ctl2"]
