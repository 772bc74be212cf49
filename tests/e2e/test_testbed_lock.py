"""The testbed's global lock file (m3deploy.testbed.system.locked): a regular file owned by root, never opened
through a symlink, never truncated by a waiting command. Root only: the lock refuses a file that root does not
own, so these run with the root-only suites (tests/e2e), not with the unit tests a non-root user runs."""
import os

import pytest

from m3deploy.core.errors import M3Error
from m3deploy.testbed import config as C
from m3deploy.testbed import core

pytestmark = pytest.mark.e2e


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.fail("the testbed lock tests need root (the lock must be root's)")


@pytest.fixture
def lock_at(tmp_path, monkeypatch):
    path = tmp_path / "run" / "m3deploy-testbed.lock"
    monkeypatch.setattr(C, "LOCK_PATH", str(path))
    return path


def test_lock_is_created_0600_and_held_line_written(lock_at):
    with core.locked("up 3 --name t"):
        assert lock_at.read_text().startswith(f"pid {os.getpid()}: up 3 --name t")
        assert lock_at.stat().st_mode & 0o777 == 0o600
    assert lock_at.read_text() == ""


def test_lock_through_a_symlink_is_refused_and_the_target_untouched(lock_at, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock_at.parent.mkdir()
    lock_at.symlink_to(victim)
    with pytest.raises(M3Error, match="is a symlink.*Fix: remove it"):
        with core.locked("up 3"):
            pass
    assert victim.read_text() == "precious\n"


def test_lock_not_owned_by_root_is_refused(lock_at):
    lock_at.parent.mkdir()
    lock_at.write_text("")
    os.chown(lock_at, 65534, 65534)
    with pytest.raises(M3Error, match="owned by uid 65534, not root"):
        with core.locked("up 3"):
            pass


def test_lock_that_is_a_fifo_is_refused(lock_at):
    lock_at.parent.mkdir()
    os.mkfifo(lock_at)
    with pytest.raises(M3Error, match="not a regular file"):
        with core.locked("up 3", timeout_s=0):
            pass
