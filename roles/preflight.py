"""Preflight inside a deploy: gather the GPU-host facts, check them against the host's plan
(m3deploy.check.preflight.check_host) and stop the deploy, before any host is changed, when a check fails.
The first call in a run checks every targeted host at once, so one error names all failing hosts.

Checks the drivers role itself fixes are not fatal here: when no GPU driver answers yet (fresh host)
the GPU checks are left to the drivers role's own check after install/reboot, and "driver too old" /
"reboot pending" are the drivers role's job.

Reads host_plan() (gpu_vendor, gpu_model, gpus, gpu_memory_gb, weights_dir, weights_gb, shm_min_gb,
needs_rdma). Data keys: m3_preflight_ignore (check names not to stop on, e.g. ["disk"]).
"""
from __future__ import annotations

import gevent.pool
from pyinfra import host, state
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from m3deploy.check.preflight import check_host
from m3deploy.core.errors import M3Error, plural
from m3deploy.facts import gather_facts

DRIVER_FIXES = {"driver", "reboot", "gpu-driver-loaded"}
NEEDS_DRIVER = {"gpu-vendor", "gpu-count", "gpu-model", "gpu-mixed", "gpu-memory", "mig", "amd-devices"}
_ATTR = "_m3_preflight_failures"


class PreflightFailed(M3Error, DeployError):
    """Some hosts failed preflight; str() is the report."""


def fatal_checks(hp, facts: dict, ignore=()) -> list:
    no_driver = hp.gpus > 0 and not facts.get("gpu_vendor") and not facts.get("gpu_error")
    out = []
    for c in check_host(hp, facts):
        if c.ok or c.name in ignore or c.name in DRIVER_FIXES or (no_driver and c.name in NEEDS_DRIVER):
            continue
        out.append(c)
    return out


@deploy("Preflight")
def preflight():
    """At its first call in a run, checks every targeted host (facts are read-only), then raises one
    PreflightFailed naming every failing host; later calls (the other hosts) have nothing left to do."""
    from pyinfra.context import ctx_host

    from m3deploy.deploy import context

    if getattr(state, _ATTR, False):
        return
    setattr(state, _ATTR, True)
    targets = [h for h in state.inventory if h in state.active_hosts and state.is_host_in_limit(h)]
    if not any(h.name == host.name for h in targets):
        targets.append(host._get_module() if hasattr(host, "_get_module") else host)
    failures = {}

    def check(h):
        with ctx_host.use(h):
            hp = context.host_plan()
            facts = gather_facts(h, hp.weights_dir or "/", gpu=hp.gpus > 0)
            bad = fatal_checks(hp, facts, set(hp.preflight_ignore))
        if bad:
            failures[h.name] = bad

    # every host at once (pyinfra's connections are gevent-based): one slow host does not add up
    pool = gevent.pool.Pool(size=max(1, int(getattr(state.config, "PARALLEL", 0) or 0) or len(targets)))
    for job in [pool.spawn(check, h) for h in targets]:
        job.join()
        if job.exception is not None:
            raise job.exception
    if failures:
        lines = [f"preflight failed on {plural(len(failures), 'host')}: {', '.join(sorted(failures))}"]
        for name, checks in sorted(failures.items()):
            for c in checks:
                lines.append(f"  {name}: {c.name}: {c.detail}" + (f" -> fix: {c.fix}" if c.fix else ""))
        raise PreflightFailed("\n".join(lines))
