"""The post-deploy suite as pytest tests, generated from the plan (same checks as `m3deploy verify`).

    pytest tests/verify --inventory inventories/testbed.py [--verify-host H] [--skip-smoke]

One test per host/service/port/file/health endpoint/smoke request, named by the check id, e.g.
`test_units.py::test_unit[unit/m3tb-01/etcd]`. Not in pyproject's testpaths: plain `pytest` never
collects it, and running it without --inventory is a usage error (never a silent skip).
"""
from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("m3deploy verify")
    g.addoption("--inventory", action="store", default=None, metavar="FILE",
                help="pyinfra inventory of the deployed cluster (e.g. inventories/testbed.py)")
    g.addoption("--verify-host", action="store", default=None, metavar="HOST",
                help="only this host's units, ports, files and health checks")
    g.addoption("--skip-smoke", action="store_true", default=False, help="no requests through the frontend")


HERE = Path(__file__).resolve().parent
USAGE = "pytest tests/verify --inventory inventories/<cluster>.py"


def _inside(path: Path) -> bool:
    try:
        path.resolve().relative_to(HERE)
        return True
    except ValueError:
        return False


def pytest_configure(config):
    if config.getoption("--inventory"):
        _suite(config)  # the plan, and nothing deployed is one line at once (a usage error), as `m3deploy verify`
        return
    asked = [a for a in config.args if _inside(Path(str(config.invocation_params.dir), a.split("::")[0]))]
    if asked:  # tests/verify named explicitly: a usage error, not a skip
        raise pytest.UsageError(f"tests/verify checks a deployed cluster and needs its inventory: {USAGE}")


def pytest_ignore_collect(collection_path, config):
    # reached only through a parent directory (e.g. `pytest tests`): leave the suite out, and say so
    if not config.getoption("--inventory") and _inside(Path(collection_path)) and Path(collection_path) != HERE:
        config._m3_verify_left_out = True
        return True
    return None


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "_m3_verify_left_out", False):
        terminalreporter.write_line(f"tests/verify not collected: it needs a deployed cluster ({USAGE})",
                                    yellow=True)


class _Suite:
    def __init__(self, config):
        from m3deploy.check import verify
        from m3deploy.core import build as planmod
        from m3deploy.core import inventory

        inv_path = config.getoption("--inventory")
        self.inventory = inventory.load_inventory(inv_path)
        self.plan = planmod.build(self.inventory, name=Path(inv_path).stem)
        missing = verify.nothing_deployed(self.plan, config.getoption("--verify-host"), inv_path)
        if missing:  # as `m3deploy verify`: one line, no checks against services that were never installed
            raise pytest.UsageError(missing)
        self.checks = verify.all_checks(self.plan, self.inventory, config.getoption("--verify-host"),
                                        smoke=not config.getoption("--skip-smoke"))


def _suite(config) -> _Suite:
    s = getattr(config, "_m3_verify_suite", None)
    if s is None:
        s = config._m3_verify_suite = _Suite(config)
    return s


def pytest_generate_tests(metafunc):
    if "check" not in metafunc.fixturenames:
        return
    groups = getattr(metafunc.function, "groups", None) or getattr(metafunc.module, "GROUPS")
    checks = [c for c in _suite(metafunc.config).checks if c.group in groups]
    if not checks:
        reason = ("--skip-smoke given" if "smoke" in groups and metafunc.config.getoption("--skip-smoke")
                  else f"the plan has no {'/'.join(groups)} checks" + (
                      " for --verify-host" if metafunc.config.getoption("--verify-host") else ""))
        metafunc.parametrize("check", [pytest.param(None, marks=pytest.mark.skip(reason=reason))], ids=["none"])
        return
    metafunc.parametrize("check", checks, ids=[c.id for c in checks])


@pytest.fixture(scope="session")
def vctx(request):
    from m3deploy.check import verify

    s = _suite(request.config)
    ctx = verify.Context(s.plan, s.inventory)
    yield ctx
    ctx.close()


@pytest.fixture
def run_check(vctx):
    from m3deploy.check import verify

    def run(check):
        r = verify.run_check(check, vctx)
        assert r.ok, f"{r.title}: {r.evidence}\n  reproduce: {r.reproduce}"
        return r
    return run
