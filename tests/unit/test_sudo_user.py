"""A non-root login user with sudo (issue 36): what m3deploy runs itself over a host's connection runs under sudo
when the host's data says `_sudo` (pyinfra's own operations do already). The real deploy and verify as such a user:
tests/e2e/test_newcomer_testbed.py."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from m3deploy.check.checks import ssh_command
from m3deploy.controller import deployed
from m3deploy.core import connection
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


def test_global_args_are_pyinfras_and_a_near_miss_is_refused_naming_the_fix(tmp_path):
    from pyinfra.api.arguments import all_argument_meta

    assert connection.GLOBAL_ARGS == set(all_argument_meta) - {"name"}
    inv = tmp_path / "mine.py"
    inv.write_text('control = [("c1", {"ssh_hostname": "10.0.0.1"})]\n'
                   'workers = [("w1", {"ssh_hostname": "10.0.0.2", "m3_platform": "h200", "ssh_user": "deploy", '
                   '"_sduo": True, "_my_helper": 1})]\n')
    r = subprocess.run([sys.executable, "-m", "m3deploy.cli", "validate", str(inv)], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "key _sduo is not a pyinfra global argument (did you mean _sudo?)" in r.stderr and "w1" in r.stderr
    assert "_my_helper" not in r.stderr and "Traceback" not in r.stderr
