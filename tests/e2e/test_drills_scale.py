"""Scale out and in by editing the inventory (issue 27), under load on the local testbed.

    M3_SCALE_TESTBED=m3sc M3_SCALE_SUBNET=10.152.0.0/24 M3_SCALE_WRONG_TESTBED=m3sd M3_SCALE_WRONG_SUBNET=10.153.0.0/24 \
        python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_scale.py

Opt-in (`-m drills`), in this order (one cluster, each drill starts where the last one ended):
1. 1 control host + 2 mocker workers deployed; a 4th host added to the testbed (`workers`) and the deploy re-run
   under load: 0 failed, and the new worker is listed by the frontend and serves requests.
2. A worker host left out of the inventory (M3_TESTBED_HOSTS, inventories/testbed.py): a deploy re-run warns,
   naming it and `m3deploy prune`, and changes nothing on it (its worker keeps its process and keeps serving).
3. Mistakes tear nothing down: `m3deploy prune` with another cluster's inventory (the testbed m3sd, the same
   cluster name and record) is refused (exit 2), so is `--host` of a host still in the inventory; without --yes it
   only lists.
4. `m3deploy prune --yes` under load: 0 failed; the record no longer lists the host, and nothing its manifest
   named is left on it (units, files, directories, venv, caches, user, packages), nor /etc/m3.
5. A shrinking plan: `--data m3_gpus_per_host=2` (2 workers per host), then the plain plan again under load: 0
   failed, and each worker host's m3-worker@1 (unit, env file, rollback copies) is gone.
Writes benchmarks/results/scale-<UTC start>.md; brings the testbeds down (M3_E2E_KEEP=1 keeps them).
"""
from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import tempfile
import time

import pytest
import tbrun
import test_drills as d

from m3deploy.check import rollout
from m3deploy.check.checks import frontend_url, instance_services, metrics_url
from m3deploy.testbed import core as testbed

pytestmark = [pytest.mark.drills, pytest.mark.e2e]

NAME = os.environ.get("M3_SCALE_TESTBED", "m3sc")
SUBNET = os.environ.get("M3_SCALE_SUBNET", "10.152.0.0/24")
WRONG = os.environ.get("M3_SCALE_WRONG_TESTBED", "m3sd")
WRONG_SUBNET = os.environ.get("M3_SCALE_WRONG_SUBNET", "10.153.0.0/24")
CONFIG = tempfile.mkdtemp(prefix="m3sc-config-")
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1", "M3DEPLOY_CONFIG": CONFIG}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, scratch=(CONFIG,))
STARTED = datetime.datetime.now(datetime.timezone.utc)
ROWS: list[dict] = []


def host(i: int) -> str:
    return f"{NAME}-{i:02d}"


def _env(hosts=(), **extra) -> dict:
    return {**ENV, **({"M3_TESTBED_HOSTS": ",".join(hosts)} if hosts else {}), **extra}


def _plan(env: dict):
    return tbrun.plan(env)


def _cluster(env: dict) -> d.Cluster:
    plan = _plan(env)
    heads = {f"{h.name}/{s.name}": metrics_url(h, s) for h, s in instance_services(plan)}
    return d.Cluster(plan, frontend_url(plan, "/health"), heads, plan.group("control")[0].name,
                     sorted({k.split("/")[0] for k in heads}), env)


def m3deploy(*args, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return TB.m3deploy(*args, env=env, timeout=timeout, merge=True)


def record() -> dict:
    with open(os.path.join(CONFIG, "testbed", "deployed.json")) as f:
        return json.load(f)


def on(h: str, cmd: str) -> str:
    return d.on(h, cmd, name=NAME)


def started_at(h: str, unit: str) -> str:
    return on(h, f"systemctl show -p ExecMainStartTimestampMonotonic -p MainPID --value {unit}").strip()


@pytest.fixture(scope="module")
def lab(testbed_up):
    with testbed_up(TB, deploy=(), timeout=1500):  # under _env(): ENV
        yield
        _write()
        if not tbrun.keep():
            testbed.down(name=WRONG, log=lambda *a, **k: None)  # test_mistakes_tear_nothing_down's


def _write() -> None:
    if not ROWS:
        return
    commit = tbrun.commit()
    path = os.path.join(d.REPO, "benchmarks", "results", f"scale-{STARTED:%Y-%m-%d-%H%M}.md")
    lines = [f"# Scale out and in by editing the inventory ({STARTED:%Y-%m-%d %H:%M} UTC, commit {commit})", "",
             "`python3 -m pytest -p no:cacheprovider -m drills tests/e2e/test_drills_scale.py`: one 2-core machine "
             "shared with other helpers (`load`: its 1-minute load average), testbed of 1 control host + mocker "
             "workers, tests/e2e/load.py 4 clients, no retries, through the frontend.", "",
             "| drill | sent | ok | failed | seconds | failures | notes |", "|---|---|---|---|---|---|---|"]
    for r in ROWS:
        s = r["stats"]
        if s is None:
            lines.append(f"| {r['drill']} | - | - | - | {r['seconds']:.1f} | - | {r['note']} |")
            continue
        errs = ", ".join(f"{n}x {e}" for e, n in s.errors.most_common()) or "-"
        lines.append(f"| {r['drill']} | {s.sent} | {s.ok} | {s.failed} | {r['seconds']:.1f} | {errs} | {r['note']} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _drill(c: d.Cluster, name: str, action, note: str = ""):
    """tests/e2e/test_drills.drill: steady load, the action (its duration), load after it; every planned worker of
    `c` registered afterwards."""
    out = {}

    def recover(t0):
        out["result"] = action()
        return time.monotonic() - t0
    stats, seconds = d.drill(c, name, lambda: None, recover, note=note)
    d.RESULTS.pop()
    ROWS.append({"drill": name, "stats": stats, "seconds": seconds, "note": f"{note}; load {os.getloadavg()[0]:.1f}"})
    return stats, out["result"]


def _row(name: str, seconds: float, note: str) -> None:
    ROWS.append({"drill": name, "stats": None, "seconds": seconds, "note": f"{note}; load {os.getloadavg()[0]:.1f}"})


def test_add_a_worker_host_under_load(lab):
    before = _cluster(_env())
    testbed.up(4, name=NAME, log=lambda *a, **k: None)
    after = _cluster(_env())
    new = f"{host(4)}/m3-worker@0"
    assert new in after.heads and new not in before.heads, after.heads

    def deploy():
        res = d.pyinfra(env=_env(), timeout=1500)
        assert res.returncode == 0, res.stdout[-5000:]
        # routable: the new worker's process is listed by the frontend and has served requests of the load
        return rollout.wait_routable(new, after.health, after.heads[new], set(), send=lambda: None, timeout_s=120)
    stats, _ = _drill(before, f"add a worker host ({host(4)}) and re-run the deploy", deploy,
                      note="the new worker listed and serving requests of the load before the load stopped")
    assert stats.failed == 0, stats.summary()
    served = sum(rollout.worker_counts(after.heads[new]).values())
    assert served >= 1, f"{new} served no request"
    d.all_registered(after, 60)
    assert host(4) in record()["hosts"]


def test_a_host_left_out_of_the_inventory_is_not_touched(lab):
    gone = host(2)
    before = started_at(gone, "m3-worker@0")
    t0 = time.monotonic()
    res = d.pyinfra(env=_env([host(1), host(3), host(4)]), timeout=900)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-5000:]
    assert f"{gone}: in the deploy record of cluster testbed but not in the inventory" in res.stdout, res.stdout[-3000:]
    assert f"m3deploy prune inventories/testbed.py --host {gone}" in res.stdout
    assert started_at(gone, "m3-worker@0") == before  # the same process: not stopped, not restarted
    full = _cluster(_env())
    d.all_registered(full, 30)  # it is still listed by the frontend under its running process: still serving
    _row(f"deploy re-run with {gone} left out of the inventory", took,
         f"warned, naming {gone} and the prune command; its worker kept its process and stayed listed")


def test_mistakes_tear_nothing_down(lab):
    gone = host(2)
    before = started_at(gone, "m3-worker@0")
    testbed.up(2, name=WRONG, subnet=WRONG_SUBNET, log=lambda *a, **k: None)
    wrong = m3deploy("prune", d.INVENTORY, "--yes", env={**_env(), "M3_TESTBED": WRONG}, timeout=120)
    assert wrong.returncode == 2, wrong.stdout
    assert "share no host" in wrong.stdout and "Nothing was changed" in wrong.stdout, wrong.stdout
    kept = m3deploy("prune", d.INVENTORY, "--host", host(3), "--yes", env=_env([host(1), host(3), host(4)]))
    assert kept.returncode == 2 and f"{host(3)} is still in the inventory" in kept.stdout, kept.stdout
    listed = m3deploy("prune", d.INVENTORY, env=_env([host(1), host(3), host(4)]), timeout=120)
    assert listed.returncode == 0, listed.stdout
    assert f"- {gone} (" in listed.stdout and "nothing was changed" in listed.stdout, listed.stdout
    assert started_at(gone, "m3-worker@0") == before
    assert gone in record()["hosts"]
    _row("prune mistakes: another cluster's inventory; --host of a host still in the inventory; no --yes", 0.0,
         f"exit 2, 2, 0 (listed only); {gone}'s worker kept its process, the record kept it")


def test_prune_drains_and_leaves_nothing(lab):
    gone = host(2)
    manifest = json.loads(on(gone, "cat /etc/m3/manifest.json"))
    assert manifest["units"] and manifest["files"] and manifest["venvs"], manifest
    c = _cluster(_env([host(1), host(3), host(4)]))

    def prune():
        res = m3deploy("prune", d.INVENTORY, "--host", gone, "--yes", env=c.env, timeout=900)
        assert res.returncode == 0, res.stdout[-5000:]
        return res.stdout
    stats, out = _drill(c, f"m3deploy prune --host {gone} --yes", prune,
                        note="drained, torn down by its manifest, dropped from the record")
    assert stats.failed == 0, stats.summary()
    assert "the frontend lists every planned worker (2) and none of the pruned hosts" in out, out[-2000:]
    assert gone not in record()["hosts"]
    paths = [*manifest["files"], *manifest["links"], *manifest["dirs"], *manifest["caches"], *manifest["venvs"],
             "/etc/m3"]
    left = on(gone, "for p in " + " ".join(map(shlex.quote, paths)) + '; do [ -e "$p" ] && echo "$p"; done; true')
    assert left.strip() == "", f"left on {gone}: {left}"
    states = on(gone, "systemctl show -p LoadState --value " + " ".join(map(shlex.quote, manifest["units"])))
    assert set(states.split()) == {"not-found"}, states
    assert on(gone, "ls /etc/systemd/system | grep -E '^m3-' || true").strip() == ""
    for user in manifest["users"]:
        assert on(gone, f"getent passwd {user} || true").strip() == "", user
    for pkg in manifest["packages"]:
        assert "install ok installed" not in on(gone, f"dpkg-query -W -f='${{Status}}' {pkg} 2>/dev/null || true")
    # no Dynamo process left ([d]: the shell running this does not match itself)
    assert on(gone, "ps -eo args= | grep '[d]ynamo' || true").strip() == ""


def _workers_on(h: str) -> list[str]:
    return sorted(on(h, "ls /etc/systemd/system | grep -E '^m3-worker@' || true").split())


def test_a_shrinking_plan_removes_the_leftover_ranks(lab):
    hosts = [host(1), host(3), host(4)]
    wide = _env(hosts)
    t0 = time.monotonic()
    res = d.pyinfra("--data", "m3_gpus_per_host=2", env=wide, timeout=1500)
    assert res.returncode == 0, res.stdout[-5000:]
    _row("grow: m3_gpus_per_host=2 (2 workers per host)", time.monotonic() - t0, "no load")
    for h in hosts[1:]:
        assert _workers_on(h) == ["m3-worker@0.service", "m3-worker@1.service"], _workers_on(h)
    # a changed env file: its previous version is kept in /var/lib/m3/rollback (roles/_units.keep_previous)
    res = d.pyinfra("--data", "m3_gpus_per_host=2", "--data", "m3_mocker_speedup_ratio=8", env=wide, timeout=1500)
    assert res.returncode == 0, res.stdout[-5000:]
    assert "m3-worker@1" in on(hosts[1], "ls /var/lib/m3/rollback")

    def shrink():
        r = d.pyinfra(env=wide, timeout=1500)
        assert r.returncode == 0, r.stdout[-5000:]
        return r.stdout
    stats, out = _drill(_cluster(wide), "shrink: back to 1 worker per host (re-run without m3_gpus_per_host)",
                        shrink, note="m3-worker@1 of each worker host removed by the manifest diff")
    assert stats.failed == 0, stats.summary()
    assert "Stop and disable the m3 units" in out
    for h in hosts[1:]:
        assert _workers_on(h) == ["m3-worker@0.service"], _workers_on(h)
        left = on(h, "ls /etc/m3 /var/lib/m3 /var/lib/m3/rollback 2>/dev/null | grep 'm3-worker@1' || true")
        assert left.strip() == "", f"{h}: {left}"
        assert on(h, "systemctl show -p LoadState --value m3-worker@1").strip() == "not-found"
        assert "m3-worker@1" not in on(h, "cat /etc/m3/manifest.json")
    again = d.pyinfra(env=wide, timeout=900)
    assert again.returncode == 0
    assert "Stop and disable the m3 units" not in again.stdout  # nothing left over: nothing removed again
