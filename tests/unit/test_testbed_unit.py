"""Pure parts of m3deploy.testbed: names, addresses, rendered files, parsing, error texts."""

import json

import pytest

from m3deploy.core.errors import M3Error
from m3deploy.testbed import config, core


def test_addresses():
    assert config.bridge_address("10.77.0.0/24") == "10.77.0.1"
    assert config.host_address("10.77.0.0/24", 1) == "10.77.0.10"
    assert config.host_address("10.78.0.0/24", 16) == "10.78.0.25"
    assert config.host_address("10.77.0.0/24", 245) == "10.77.0.254"
    with pytest.raises(M3Error, match="room for 245 hosts"):
        config.host_address("10.77.0.0/24", 246)
    with pytest.raises(M3Error, match="must be a /24"):
        config.parse_subnet("10.77.0.0/16")
    with pytest.raises(M3Error, match="not an IPv4 network"):
        config.parse_subnet("10.77.0.5/24")
    with pytest.raises(M3Error, match="not a private range"):
        config.parse_subnet("8.8.8.0/24")


def test_names_fit_interface_limit_and_prefix_is_exact():
    assert config.check_name("m3tb") == "m3tb"
    for bad in ("", "M3", "3tb", "toolongname", "a-b", "m3_tb"):
        with pytest.raises(M3Error, match="not valid"):
            config.check_name(bad)
    longest = "abcdefgh"
    assert len(config.veth_name(longest, 200)) <= 15 and len(config.bridge_name(longest)) <= 15
    assert config.host_name("m3tb", 3) == "m3tb-03" and config.host_index("m3tb", "m3tb-03") == 3
    assert config.owned_by("m3tb", "m3tb-01") and config.owned_by("m3tb", "m3tb-br")
    assert not config.owned_by("m3tb", "m3tb2-01") and not config.owned_by("m3tb", "m3tb")


def test_ssh_config_and_known_hosts():
    hosts = [{"name": "m3tb-01", "address": "10.77.0.10", "host_key": "ssh-ed25519 AAAAkey1"},
             {"name": "m3tb-02", "address": "10.77.0.11", "host_key": "ssh-ed25519 AAAAkey2"}]
    cfg = config.render_ssh_config("m3tb", hosts, "/s/id_ed25519", "/s/known_hosts", "/s/cm")
    block = cfg.split("Host m3tb-02")[1]
    for line in ("HostName 10.77.0.11", "User root", "IdentityFile /s/id_ed25519",
                 "UserKnownHostsFile /s/known_hosts", "StrictHostKeyChecking yes",
                 "ControlMaster auto", "ControlPath /s/cm/%C", "ControlPersist"):
        assert line in block
    assert cfg.count("\nHost ") + cfg.startswith("Host ") == 2
    kh = config.render_known_hosts(hosts)
    assert kh == "m3tb-01,10.77.0.10 ssh-ed25519 AAAAkey1\nm3tb-02,10.77.0.11 ssh-ed25519 AAAAkey2\n"
    assert config.render_known_hosts([{"name": "x", "address": "1.2.3.4"}]) == ""


def test_apt_proxy_and_acng_conf():
    conf = config.render_apt_proxy_conf("10.77.0.1")
    assert f'Acquire::http::Proxy "http://10.77.0.1:{config.APT_PROXY_PORT}";' in conf
    acng = config.render_acng_conf(conf_dir="/c", cache_dir="/k", log_dir="/l", bind="10.77.0.1",
                              port=3149, pid_file="/r/pid", socket_path="/r/s",
                              security_backend="http://deb.debian.org/debian-security")
    assert "BindAddress: 10.77.0.1" in acng and "Port: 3149" in acng
    assert "file:/c/backends_debian" in acng
    assert "ReuseConnections: 0" in acng.splitlines()  # no host's download queues behind another's upstream


def test_parse_apt_sources_deb822_and_oneline():
    files = {
        "/etc/apt/sources.list.d/debian.sources": (
            "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
            "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
            "Suites: bookworm-security\nComponents: main\n\n"
            "Types: deb\nURIs: http://off.example/x\nSuites: bookworm\nEnabled: no\n"),
        "/etc/apt/sources.list.d/other.list": "deb [arch=amd64] https://x.example/apt stable main\n",
    }
    src = config.parse_apt_sources(files)
    assert ("http://mirror.example/debian", ["bookworm", "bookworm-updates"]) in src
    assert ("https://x.example/apt", ["stable"]) in src
    assert all(uri != "http://off.example/x" for uri, _ in src)
    assert config.pick_mirrors(src) == ("http://mirror.example/debian/", "http://mirror.example/debian-security/")
    assert config.pick_mirrors([]) == ("http://deb.debian.org/debian/", "http://deb.debian.org/debian-security/")
    one = config.parse_apt_sources({"/etc/apt/sources.list": "# c\ndeb http://m.example/debian bookworm main\n"})
    assert config.pick_mirrors(one)[0] == "http://m.example/debian/"


def test_overlapping_interfaces():
    addrs = json.loads('[{"ifname":"eth0","addr_info":[{"family":"inet","local":"10.77.0.5","prefixlen":16}]},'
                       '{"ifname":"m3tb-br","addr_info":[{"family":"inet","local":"10.77.0.1","prefixlen":24}]},'
                       '{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","prefixlen":8}]}]')
    assert config.overlapping_interfaces("10.77.0.0/24", addrs, own_bridge="m3tb-br") == ["eth0 (10.77.0.5/16)"]
    assert config.overlapping_interfaces("10.78.0.0/24", addrs, own_bridge="m3tb-br") == []
    err = config.err_subnet_taken("10.77.0.0/24", ["eth0 (10.77.0.5/16)"], "m3tb")
    assert "eth0" in str(err) and "--subnet" in str(err)


def test_error_messages_name_the_fix(tmp_path):
    assert "sudo" in str(config.err_not_root())
    msg = str(config.err_missing_tools({"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap"}))
    assert "--install-deps" in msg and "apt-get install -y debootstrap systemd-container" in msg
    assert "wait" in str(config.err_locked("pid 1: up 3"))
    with pytest.raises(M3Error, match=r"run `m3deploy testbed up 3`"):
        core.load_state("m3tb", root=str(tmp_path))
    with pytest.raises(M3Error, match=r"up 3 --name other"):
        core.load_state("other", root=str(tmp_path))


def test_image_key_depends_on_include_list_only():
    a = config.image_key(("python3", "iproute2"))
    assert a == config.image_key(("iproute2", "python3"))
    assert a != config.image_key(("python3", "iproute2", "tree"))


def test_inotify_needed():
    assert config.inotify_needed(3) == 128
    assert config.inotify_needed(32) > 128 + 8 * 32 - 64


def test_cli_group_exposes_commands():
    from m3deploy.testbed.cli import testbed
    assert {"up", "down", "status"} <= set(testbed.commands)


def test_not_root_is_refused_before_anything(monkeypatch):
    monkeypatch.setattr(core.os, "geteuid", lambda: 1000)
    for call in (lambda: core.up(3, log=None), lambda: core.down(log=None), lambda: core.status()):
        with pytest.raises(M3Error, match="needs root"):
            call()


def test_missing_tools_error_offers_install_deps(monkeypatch):
    monkeypatch.setattr(core.os, "geteuid", lambda: 0)
    monkeypatch.setattr(core.shutil, "which", lambda t: None if t in ("debootstrap", "apt-cacher-ng") else "/x")
    with pytest.raises(M3Error, match=r"--install-deps.*apt-get install -y apt-cacher-ng debootstrap"):
        core.preflight()
