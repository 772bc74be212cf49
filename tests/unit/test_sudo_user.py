"""A non-root login user with sudo (issue 36): what m3deploy runs itself over a host's connection runs under sudo
when the host's data says `_sudo` (pyinfra's own operations do already). The real deploy and verify as such a user:
tests/e2e/test_newcomer_testbed.py."""
from __future__ import annotations

import shlex
import subprocess

from m3deploy.check.checks import ssh_command
from m3deploy.controller import deployed
from m3deploy.core.build import InvHost
from m3deploy.core.connection import sudo_args
from m3deploy.testbed import config
from roles.weights import push_argv


def test_sudo_args_are_pyinfras_privilege_data_that_is_set():
    assert sudo_args({"_sudo": True, "_sudo_user": "root", "ssh_user": "deploy", "_sudo_password": "x"}) == \
        {"_sudo": True, "_sudo_user": "root"}
    assert sudo_args({"_sudo": False}) == {} and sudo_args({}) == {}


def test_the_deploy_record_keeps_how_to_become_root_never_the_password():
    got = deployed.connection({"ssh_user": "deploy", "_sudo": True, "_sudo_password": "secret"})
    assert got == {"ssh_user": "deploy", "_sudo": True}


def test_the_weights_push_runs_the_remote_side_under_sudo():
    data = {"ssh_hostname": "10.0.0.2", "ssh_user": "deploy", "_sudo": True}
    argv = push_argv("/cache/models--a--b", "/var/lib/m3/hf", "a/b", data, "w1")
    remote = next(a for a in argv if a.startswith("--rsync-path="))
    assert remote.startswith("--rsync-path=sudo -n mkdir -p ") and " && sudo -n flock " in remote
    assert argv[-1].startswith("deploy@10.0.0.2:")
    root = push_argv("/cache/models--a--b", "/var/lib/m3/hf", "a/b", {"ssh_hostname": "10.0.0.2"}, "w1")
    assert "sudo" not in " ".join(root)


def test_verify_reproduce_commands_say_sudo():
    h = InvHost("a", (), {"ssh_hostname": "10.0.0.1", "ssh_user": "deploy", "_sudo": True})
    cmd = shlex.split(ssh_command(h, "ss -ltnp 'sport = :2379'"))
    assert cmd[-2] == "deploy@10.0.0.1" and cmd[-1] == "sudo sh -c 'ss -ltnp '\"'\"'sport = :2379'\"'\"''"


def test_the_testbed_sudo_user_option_adds_sudo_to_the_image_and_a_valid_script():
    assert config.check_options(["sudo-user"]) == ("sudo-user",)
    assert config.image_include(config.BASE_INCLUDE, ("sudo-user",)) == (*config.BASE_INCLUDE, "sudo")
    assert config.image_include(config.BASE_INCLUDE, ()) == config.BASE_INCLUDE  # the shared image is unchanged
    script = config.sudo_user_script()
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0
    assert "NOPASSWD: ALL" in script and "visudo -cqf" in script and "--groups sudo m3admin" in script
