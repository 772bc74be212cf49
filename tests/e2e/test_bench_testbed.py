"""End-to-end: `m3deploy bench` on a deployed testbed (needs root, the testbed's tools and aiperf:
`bash scripts/install-deps.sh --bench` installs it).

One testbed for this module under its own name and range (bnch, 10.83.0.0/24: 1 control + 2 mocker workers),
deployed with the user's command line (`pyinfra -y inventories/testbed.py deploy.py`, M3_TESTBED=bnch). Then, in
file order:

1. a short custom profile (24 requests, 256 -> 64 tokens, concurrency 4) with --compare against the committed
   example seed run: 0 failed, every file written, numbers sane, every request accounted for by the workers' own
   /metrics, and the deltas printed and plotted;
2. --compare of two finished runs (--out an existing run): compares without sending anything;
3. one worker stopped: bench refuses to send load and names the missing worker.

One aiperf run (~10 s) and a 5 s refusal beyond the deploy.
Keep the testbed after the run: M3_E2E_KEEP=1.
"""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import tbrun

from tbssh import ssh_to, state_dir

pytestmark = pytest.mark.e2e

NAME = "bnch"
SUBNET = "10.83.0.0/24"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE_DIR = state_dir(NAME)
ENV = {**os.environ, "M3_TESTBED": NAME, "M3_TESTBED_CONTROL": "1"}
TB = tbrun.Testbed(NAME, SUBNET, 3, ENV, cli=True, tools={"aiperf": "bash scripts/install-deps.sh --bench"})
WORKLOAD = ["--profile", "custom", "--input-len", "256", "--output-len", "64", "--num-prompts", "24",
            "--concurrency", "4"]
PNG = b"\x89PNG\r\n\x1a\n"
EXAMPLES = os.path.join(REPO, "benchmarks", "results", "bench-testbed")


def m3bench(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return TB.m3deploy("bench", "inventories/testbed.py", *args, timeout=timeout)


ssh = ssh_to(NAME)


@pytest.fixture(scope="module")
def bench_testbed(testbed_up):
    """A deployed 3-host testbed (1 control, 2 mocker workers), brought down at the end of the module."""
    with testbed_up(TB, deploy=(), timeout=1200):
        yield NAME


RUNS: dict[str, str] = {}


def test_custom_profile_runs_with_no_failure_and_writes_the_report(bench_testbed, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bench") / "run1")
    t0 = time.monotonic()
    res = m3bench(*WORKLOAD, "--out", out, "--compare", f"{EXAMPLES}/seed")
    took = time.monotonic() - t0
    assert res.returncode == 0, f"exit {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    RUNS["first"] = out
    print(f"bench: {took:.0f} s")
    rep = json.loads(open(f"{out}/report.json").read())
    assert (rep["completed"], rep["failed"]) == (24, 0), rep.get("errors")
    assert rep["total_output_tokens"] == 24 * 64  # the mocker emits exactly max_tokens (no EOS): lengths hold
    # random token ids, decoded then tokenized again by the server: a prompt may gain a token (as with vllm's)
    assert rep["total_input_tokens"] == pytest.approx(24 * 256, rel=0.01)
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        lat = rep[key]
        assert 0 <= lat["p50"] <= lat["p90"] <= lat["p99"], (key, lat)
    assert rep["ttft_ms"]["p50"] > 0 and rep["tpot_ms"]["mean"] > 0
    assert 0 < rep["output_throughput_tok_s"] < rep["total_token_throughput_tok_s"]
    assert rep["request_throughput"] == pytest.approx(rep["output_throughput_tok_s"] / 64, rel=0.01)
    # the router spread the load, and each worker's /metrics counted what it served
    assert sum(rep["workers"].values()) >= 24 and all(n > 0 for n in rep["workers"].values()), rep["workers"]
    cfg = rep["config"]
    assert cfg["plan"]["hosts"] == 3 and cfg["plan"]["workers"] == 2 and cfg["plan"]["dynamo_version"] == "1.6.1"
    assert cfg["client"].startswith("aiperf ") and cfg["workload"]["output_len"] == 64
    assert "bnch-02/m3-worker@0" in (cfg["readiness"] + " ".join(rep["workers"]))
    md = open(f"{out}/report.md").read()
    assert "| 4 | 24 | 0 |" in md
    for png in ("latency.png", "workers.png", "compare.png"):
        assert open(f"{out}/{png}", "rb").read(8) == PNG
    # --compare: the deltas against the committed seed run, and what differs between the two setups
    assert "TTFT p50 (ms)" in res.stderr and "setup differs: workload.input_len: 2048 -> 256" in res.stderr
    assert "| request throughput (req/s) |" in open(f"{out}/compare.md").read()


def test_compare_of_two_finished_runs_sends_nothing(bench_testbed):
    if "first" not in RUNS:
        pytest.fail("the first bench run did not succeed (see the test above)")
    out = RUNS["first"]
    before = os.path.getmtime(f"{out}/report.json")
    res = m3bench("--out", out, "--compare", f"{EXAMPLES}/seed-c20", timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "setup differs: workload.concurrency: 20 -> 4" in res.stderr
    assert os.path.getmtime(f"{out}/report.json") == before and "seed-c20" in open(f"{out}/compare.md").read()


def test_a_missing_worker_stops_the_benchmark_before_any_load(bench_testbed, tmp_path):
    ssh("bnch-03", "systemctl stop m3-worker@0.service")
    out = tmp_path / "run3"
    t0 = time.monotonic()
    res = m3bench(*WORKLOAD, "--out", str(out), "--timeout", "5", timeout=120)
    print(f"bench refused: {time.monotonic() - t0:.0f} s")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "not fully routable" in res.stderr and "bnch-03" in res.stderr, res.stderr
    assert not list(out.glob("aiperf-*")), "load was sent although a worker was missing"
