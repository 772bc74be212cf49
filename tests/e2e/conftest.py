"""The e2e modules' testbed, brought up and down in one place (pytest loads this file for every module here).

A module names its own testbed (a tbrun.Testbed: name, subnet, host count, environment; see its docstring) and
holds it for its tests with the `testbed_up` fixture, a context manager around a fixture's `yield`:

    TB = tbrun.Testbed(NAME, SUBNET, 3, ENV)

    @pytest.fixture(scope="module")
    def cluster(testbed_up):
        with testbed_up(TB, deploy=DATA, timeout=1200) as up:   # then `pyinfra -y inventories/testbed.py deploy.py DATA`
            yield up.deploy.stdout

It fails the test when the machine is not up to it (root, the testbed's tools and the module's own), brings the
testbed up (through its CLI after a `down` of an interrupted run's leftover, or in this process: Testbed.cli),
optionally runs the deploy, which must pass, and brings the testbed down afterwards, also when the deploy or the
module's own set-up failed, and removes the module's scratch directories, unless M3_E2E_KEEP=1 keeps them.
scripts/test_lanes.py runs the modules side by side: each on its own testbed, as its Testbed names it.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

import pytest
import tbrun

from m3deploy.testbed import core

# what `m3deploy testbed up` runs on the machine (m3deploy.testbed.config.TOOLS), with the fix
_FIX = "apt-get install systemd-container debootstrap apt-cacher-ng"
TOOLS = {"systemd-nspawn": _FIX, "debootstrap": _FIX, "apt-cacher-ng": _FIX}


@dataclass
class Up:
    """What testbed_up brought up: `testbed up`'s output (through the CLI; "" in this process), the seconds it took,
    and the deploy's run (stdout and stderr together) when it deployed."""
    out: str
    seconds: float
    deploy: subprocess.CompletedProcess | None = None


def _quiet(*_a, **_k) -> None:
    pass


def _down(tb: tbrun.Testbed) -> None:
    if tb.cli:
        tbrun.testbed_cli("down", "--name", tb.name)
    else:
        core.down(name=tb.name, log=_quiet)


@contextlib.contextmanager
def _testbed_up(tb: tbrun.Testbed, deploy=None, timeout: float = 900, before_up=None):
    """`tb` up for the `with` block, then down (and its scratch removed) unless M3_E2E_KEEP=1. deploy: the data
    (pyinfra's `--data K=V` arguments) of a deploy run once it is up, which must exit 0 within `timeout` seconds;
    before_up: called after a leftover's `down`, just before `up`."""
    if os.geteuid() != 0:
        pytest.fail("the testbed needs root")
    for tool, fix in {**TOOLS, **tb.tools}.items():
        if not shutil.which(tool):
            pytest.fail(f"{tool} missing: {fix}")
    if tb.cli:
        tbrun.testbed_cli("down", "--name", tb.name)  # a leftover of an interrupted run
    if before_up:
        before_up()
    t0 = time.monotonic()
    if tb.cli:
        out = tbrun.testbed_cli("up", str(tb.hosts), "--name", tb.name, "--subnet", tb.subnet,
                                *(f"--{o}" for o in tb.options)).stdout
    else:
        core.up(tb.hosts, name=tb.name, subnet=tb.subnet, options=tb.options, log=_quiet)
        out = ""
    up = Up(out, time.monotonic() - t0)
    try:  # down even when the deploy fails: no testbed is left behind
        if deploy is not None:
            t0 = time.monotonic()
            up.deploy = tb.deploy_ok(*deploy, timeout=timeout)
            print(f"deploy: {time.monotonic() - t0:.0f} s")
        yield up
    finally:
        if not tbrun.keep():
            try:
                _down(tb)
            finally:
                for path in tb.scratch:
                    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def testbed_up():
    """_testbed_up: `with testbed_up(TB[, deploy=DATA, timeout=S, before_up=F]) as up: yield ...` in a module's
    (or session's) fixture holds the module's testbed for its tests."""
    return _testbed_up
