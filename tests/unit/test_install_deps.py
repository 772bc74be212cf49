"""scripts/install-deps.sh from a second clone (issue 36): it refuses, without --yes and without a terminal, to
re-point a venv whose m3deploy is another clone's, names both and the fix, and changes nothing; with M3DEPLOY_VENV
unset the venv is the shared /opt/m3deploy/venv, so this runs it against the venv the test run itself uses.
Root only (the script refuses others: apt-get and the testbed need root)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _owner(venv: Path) -> str:
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import m3deploy; print(m3deploy.__file__)"],
                       cwd="/", capture_output=True, text=True)
    return r.stdout.strip()


def test_a_second_clone_does_not_take_over_the_venv_unasked(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("scripts/install-deps.sh runs as root only: run the tests as root (README)")
    venv = Path(sys.prefix)  # the venv this test runs in: an editable install of REPO
    before = _owner(venv)
    assert before.startswith(str(REPO)), (before, REPO)
    clone = tmp_path / "other-clone"
    (clone / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "install-deps.sh", clone / "scripts")
    env = {**os.environ, "M3DEPLOY_VENV": str(venv), "M3DEPLOY_PYTHON": sys.executable}
    env.pop("CI", None)
    r = subprocess.run(["bash", str(clone / "scripts" / "install-deps.sh")], stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"runs m3deploy from {REPO}" in r.stderr and str(clone) in r.stderr and "--yes" in r.stderr, r.stderr
    assert "pip install" not in r.stdout, r.stdout
    assert _owner(venv) == before
