"""Connection data is checked like every other key (issue 36): an ssh_* key pyinfra does not know gets a
did-you-mean (pyinfra ignores it without a word: `ssh_usr` connects as root), and the files pyinfra connects with
(ssh_key, ssh_config_file, ssh_known_hosts_file) must exist on the controller, be files, and a private key must be
private; `m3deploy validate` refuses with exit 2 naming host, key, file and fix, and `pyinfra INVENTORY deploy.py`
stops before it connects. `plan` and `render` do not read the files (they may run where the keys are not)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from m3deploy.core import connection

REPO = Path(__file__).resolve().parents[2]


def test_the_known_keys_are_pyinfras_own():
    from pyinfra.connectors.ssh import ConnectorData

    assert connection.SSH_KEYS == set(ConnectorData.__annotations__)


def _inv(tmp_path: Path, **worker) -> Path:
    inv = tmp_path / "mine.py"
    inv.write_text(f'control = [("c1", {{"ssh_hostname": "10.0.0.1"}})]\n'
                   f'workers = [("w1", {{"ssh_hostname": "10.0.0.2", "m3_platform": "h200", **{worker!r}}})]\n')
    return inv


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "m3deploy.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def _key(tmp_path: Path, mode: int) -> str:
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(mode)
    return str(key)


@pytest.mark.parametrize("case", ["typo", "missing", "directory", "readable", "known-hosts-missing"])
def test_validate_refuses_with_host_key_and_fix(case, tmp_path):
    worker, words = {
        "typo": ({"ssh_usr": "ubuntu"}, ["key ssh_usr", "did you mean ssh_user?"]),
        "missing": ({"ssh_key": str(tmp_path / "nope")}, ["key ssh_key", "does not exist", "ssh-keygen"]),
        "directory": ({"ssh_key": str(tmp_path)}, ["key ssh_key", "is a directory"]),
        "readable": ({"ssh_key": _key(tmp_path, 0o644)}, ["key ssh_key", "mode 644", "chmod 600"]),
        "known-hosts-missing": ({"ssh_known_hosts_file": str(tmp_path / "kh")}, ["ssh_known_hosts_file",
                                                                                  "does not exist"]),
    }[case]
    r = _run("validate", str(_inv(tmp_path, **worker)))
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "w1" in out and "mine.py" in out and "Traceback" not in out, out
    for w in words:
        assert w in out, (w, out)


def test_a_private_key_of_ones_own_is_valid(tmp_path):
    r = _run("validate", str(_inv(tmp_path, ssh_key=_key(tmp_path, 0o600), ssh_user="ubuntu")))
    assert r.returncode == 0, r.stdout + r.stderr


def test_plan_does_not_need_the_key_file(tmp_path):
    r = _run("plan", str(_inv(tmp_path, ssh_key=str(tmp_path / "elsewhere"))))
    assert r.returncode == 0, r.stdout + r.stderr


def test_pyinfra_stops_before_connecting(tmp_path):
    pyinfra = shutil.which("pyinfra", path=os.path.dirname(sys.executable)) or shutil.which("pyinfra")
    r = subprocess.run([pyinfra, "-y", str(_inv(tmp_path, ssh_key=str(tmp_path / "nope"))), "deploy.py"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "nothing was changed" in out and "key ssh_key" in out, out
    assert "Connecting" not in out.split("nothing was changed")[0].split("Loading config")[-1], out
