"""`m3deploy bench`: workloads, the commands it runs (dry run, every shipped inventory), and report building.

Contracts checked here, with their sources:
- the seed's benchmark (SEED: "Benchmarking", `vllm bench serve --backend vllm --model MiniMaxAI/MiniMax-M3 ...`)
  is what `--profile seed` sends, flag for flag;
- `docker run --entrypoint vllm IMAGE bench serve ...` replaces the image's ENTRYPOINT (vllm-openai's is
  `vllm serve`, notes/contracts.md), so the arguments after the image are `bench serve ...`;
- vLLM's result file (vllm/benchmarks/serve.py, `result = {"duration", "completed", "failed", ...,
  "ttfts", "itls", ...}` and `p{50,90,99}_{ttft,tpot,itl}_ms` from --metric-percentiles) is read as vLLM wrote it;
- aiperf 0.13.0's exports (a real run on the testbed, tests/fixtures/aiperf-0.13.0-testbed): our TTFT / TPOT /
  ITL percentiles and throughputs equal aiperf's own aggregates of the same run (aiperf's
  `inter_token_latency` is vLLM's TPOT, its `inter_chunk_latency` vLLM's ITL).
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.check import bench
from m3deploy.check.bench import report as benchreport
from m3deploy.cli import main
from m3deploy.core import build as buildmod
from m3deploy.core import inventory as planmod
from m3deploy.core.errors import M3Error

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (ROOT / "inventories").glob("*.py") if p.stem != "testbed")
AIPERF_RUN = ROOT / "tests" / "fixtures" / "aiperf-0.13.0-testbed"
SEED_ARGV = shlex.split(bench.SEED_COMMAND)


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def shipped_plan(name: str):
    hosts = planmod.load_inventory(f"inventories/{name}.py")
    return buildmod.build(hosts, name=planmod.cluster_name(hosts, name))


def mocker_plan():
    """The testbed's plan shape (group_data/testbed.py) on fixed addresses: no testbed needed."""
    hosts = planmod.hosts_from_dict(
        {"control": [("tb-01", {"m3_address": "10.99.0.10"})],
         "workers": [("tb-02", {"m3_address": "10.99.0.11"}), ("tb-03", {"m3_address": "10.99.0.12"})]},
        all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1",
                  "m3_variant": "bf16"})
    return buildmod.build(hosts, name="testbed")


# ------------------------------------------------------------------------------------------------ workloads
def test_seed_profile_is_the_seed_workload():
    w = bench.workload("seed")
    assert (w.input_len, w.output_len, w.num_prompts, w.concurrency, w.endpoint) == (2048, 1024, 100, 10,
                                                                                     "completions")
    assert bench.levels("seed", w) == [(10, 100)]


def test_seed_profile_refuses_overrides_and_names_the_fix():
    with pytest.raises(M3Error, match=r"--output-len.*--profile custom"):
        bench.workload("seed", output_len=16)


def test_custom_profile_is_the_seed_with_the_flags_given():
    w = bench.workload("custom", input_len=64, num_prompts=8, endpoint="chat")
    assert (w.input_len, w.output_len, w.num_prompts, w.concurrency, w.endpoint) == (64, 1024, 8, 10, "chat")


def test_sweep_doubles_concurrency_up_to_the_cap_with_ten_prompts_per_slot():
    assert bench.levels("sweep", bench.workload("sweep")) == [(c, 10 * c) for c in (1, 2, 4, 8, 16, 32, 64)]
    assert [c for c, _ in bench.levels("sweep", bench.workload("sweep", concurrency=12))] == [1, 2, 4, 8, 12]
    assert bench.levels("sweep", bench.workload("sweep", concurrency=4, num_prompts=6)) == [(1, 6), (2, 6), (4, 6)]


@pytest.mark.parametrize("kw, msg", [({"concurrency": 0}, "--concurrency must be >= 1"),
                                     ({"num_prompts": 0}, "--num-prompts must be >= 1"),
                                     ({"endpoint": "embeddings"}, "use one of completions, chat")])
def test_bad_workload_flags_are_clear_errors(kw, msg):
    with pytest.raises(M3Error, match=msg):
        bench.workload("custom", **kw)


# ------------------------------------------------------------------------------------------------ commands
def test_vllm_argv_on_h200_is_the_seed_command_then_where_to_send_and_save():
    p = shipped_plan("h200")
    argv = bench.vllm_argv(p, bench.SEED, 10, 100, "r.json")
    assert argv[: len(SEED_ARGV)] == SEED_ARGV
    rest = argv[len(SEED_ARGV):]
    assert rest[:2] == ["--base-url", "http://10.30.0.11:8000"]
    for flag in ("--save-result", "--save-detailed"):
        assert flag in rest
    assert rest[rest.index("--metric-percentiles") + 1] == "50,90,99"
    assert set(rest[rest.index("--percentile-metrics") + 1].split(",")) >= {"ttft", "tpot", "itl"}


@pytest.mark.parametrize("inv", SHIPPED)
def test_dry_run_shows_vllm_bench_serve_in_the_workers_engine_image_on_a_worker_host(inv):
    p = shipped_plan(inv)
    h, s = bench.bench_host(p)
    r = CliRunner().invoke(main, ["bench", f"inventories/{inv}.py", "--dry-run", "--out", "/tmp/x-bench"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    cmd = [line for line in r.output.splitlines() if line.startswith("docker run")]
    assert len(cmd) == 1, r.output
    argv = shlex.split(cmd[0])
    assert argv[:7] == ["docker", "run", "--rm", "--network", "host", "--entrypoint", "vllm"]
    img = argv.index(s.image)  # the worker's own engine image: nothing new to install on the host
    assert argv[img + 1: img + 3] == ["bench", "serve"]
    assert f"on {h.name} ({h.address})" in r.output
    assert f"{h.weights_dir}:/root/.cache/huggingface" in argv and "HF_HUB_OFFLINE=1" in argv
    sent = argv[img + 1:]
    model = sent[sent.index("--model") + 1]
    assert model == p.served_model_name
    # the seed's workload, flag for flag, with the plan's served model name
    expect = [model if tok == "MiniMaxAI/MiniMax-M3" else tok for tok in SEED_ARGV[1:]]
    assert sent[: len(expect)] == expect
    assert sent[sent.index("--base-url") + 1] + "/v1" == p.endpoint
    assert "polled until ready" in r.output


def test_dry_run_of_a_sweep_prints_one_command_per_level():
    r = CliRunner().invoke(main, ["bench", "inventories/gb200.py", "--dry-run", "--profile", "sweep",
                                  "--concurrency", "8", "--endpoint", "chat"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    cmds = [shlex.split(x) for x in r.output.splitlines() if x.startswith("docker run")]
    assert [c[c.index("--max-concurrency") + 1] for c in cmds] == ["1", "2", "4", "8"]
    assert all(c[c.index("--backend") + 1] == "openai-chat" and "/v1/chat/completions" in c for c in cmds)


def test_dry_run_seed_with_an_override_is_a_usage_error():
    r = CliRunner().invoke(main, ["bench", "inventories/h200.py", "--dry-run", "--concurrency", "4"])
    assert r.exit_code == 2 and "--profile custom" in r.output


def test_testbed_runs_aiperf_on_the_controller_with_the_same_workload():
    p = mocker_plan()
    assert bench.default_client(p) == "aiperf"
    argv = bench.aiperf_argv(p, bench.SEED, 10, 100, "/tmp/a", "/tok")
    assert argv[1] == "profile"
    opt = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1) if argv[i].startswith("--")
           and not argv[i + 1].startswith("--")}
    assert opt["--url"] == "http://10.99.0.10:8000" and opt["--endpoint-type"] == "completions"
    assert (opt["--synthetic-input-tokens-mean"], opt["--output-tokens-mean"], opt["--concurrency"],
            opt["--request-count"]) == ("2048", "1024", "10", "100")
    # vllm's random dataset: random token ids, fixed lengths (vllm's default --random-range-ratio 0)
    assert (opt["--prompt-corpus"], opt["--random-corpus-style"], opt["--random-range-ratio"]) == ("random", "vllm", "0")
    assert "--streaming" in argv and "--use-server-token-count" in argv  # TTFT/ITL need a stream; usage counts
    with pytest.raises(M3Error, match="--client aiperf"):
        bench.docker_command(p, bench.SEED, 10, 100, "r.json", "/tmp/x")


def test_fingerprint_names_what_the_numbers_depend_on():
    p = shipped_plan("gb200")
    fp = bench.fingerprint(p)
    assert (fp["model"], fp["variant"], fp["parallel"], fp["dynamo_version"], fp["hosts"], fp["gpus"]) == \
        ("nvidia/MiniMax-M3-NVFP4", "nvfp4", "tp8", "1.6.1", 3, 8)
    assert any("@sha256:" in i for i in fp["images"])
    assert "--tensor-parallel-size" in fp["engine_argv"]
    assert bench.fingerprint_hash(fp) == bench.fingerprint_hash(bench.fingerprint(shipped_plan("gb200")))
    assert bench.fingerprint_hash(fp) != bench.fingerprint_hash(bench.fingerprint(shipped_plan("b200")))


# ------------------------------------------------------------------------------------------------ metrics
def test_metrics_follow_vllms_definitions():
    recs = [benchreport.Record(ok=True, ttft_s=0.1, latency_s=1.1, input_tokens=10, output_tokens=11,
                               itls_s=[0.1] * 10),
            benchreport.Record(ok=True, ttft_s=0.3, latency_s=2.3, input_tokens=10, output_tokens=5,
                               itls_s=[0.5] * 4),
            benchreport.Record(ok=False, error="HTTP 503")]
    m = benchreport.metrics(recs, duration_s=4.0)
    assert (m["completed"], m["failed"], m["errors"]) == (2, 1, {"HTTP 503": 1})
    assert m["ttft_ms"]["mean"] == 200.0 and m["ttft_ms"]["p50"] == 200.0
    assert m["tpot_ms"]["p50"] == pytest.approx((100.0 + 500.0) / 2)  # (latency - ttft) / (out - 1) per request
    assert m["itl_ms"]["p50"] == 100.0  # every chunk gap, pooled: 10 x 100 ms + 4 x 500 ms
    assert m["itl_ms"]["p99"] == pytest.approx(500.0)
    assert m["request_throughput"] == 0.5 and m["output_throughput_tok_s"] == 4.0
    assert m["total_token_throughput_tok_s"] == 9.0


def test_aiperf_run_gives_aiperfs_own_numbers():
    m = benchreport.from_aiperf(AIPERF_RUN)
    agg = json.loads((AIPERF_RUN / "profile_export_aiperf.json").read_text())
    assert (m["completed"], m["failed"]) == (agg["request_count"]["avg"], 0)
    for ours, theirs in (("ttft_ms", "time_to_first_token"), ("tpot_ms", "inter_token_latency"),
                         ("itl_ms", "inter_chunk_latency")):
        for q in ("p50", "p90", "p99"):
            assert m[ours][q] == pytest.approx(agg[theirs][q], abs=1e-3), (ours, q)
        assert m[ours]["mean"] == pytest.approx(agg[theirs]["avg"], abs=1e-3)
    assert m["request_throughput"] == pytest.approx(agg["request_throughput"]["avg"], rel=1e-4)
    assert m["output_throughput_tok_s"] == pytest.approx(agg["output_token_throughput"]["avg"], rel=1e-4)
    assert m["total_token_throughput_tok_s"] == pytest.approx(agg["total_token_throughput"]["avg"], rel=1e-4)


def test_aiperf_run_without_exports_names_the_log(tmp_path):
    with pytest.raises(FileNotFoundError, match="logs"):
        benchreport.from_aiperf(tmp_path)


def vllm_result(**over):
    """The shape vllm/benchmarks/serve.py saves with --save-result --save-detailed --percentile-metrics
    ttft,tpot,itl --metric-percentiles 50,90,99 (2 requests, one failed)."""
    doc = {"duration": 2.0, "completed": 1, "failed": 1, "total_input_tokens": 2048, "total_output_tokens": 4,
           "request_throughput": 0.5, "output_throughput": 2.0, "total_token_throughput": 1026.0,
           "input_lens": [2048, 2048], "output_lens": [4, 0], "ttfts": [0.25, 0.0], "itls": [[0.1, 0.1, 0.1], []],
           "errors": ["", "HTTP 503 Service Unavailable"]}
    for name, vals in (("ttft", (250.0, 250.0, 250.0, 250.0)), ("tpot", (100.0,) * 4), ("itl", (100.0,) * 4)):
        doc.update({f"mean_{name}_ms": vals[0], f"median_{name}_ms": vals[1], f"std_{name}_ms": 0.0,
                    f"p50_{name}_ms": vals[1], f"p90_{name}_ms": vals[2], f"p99_{name}_ms": vals[3]})
    doc.update(over)
    return doc


def test_vllm_result_is_read_as_vllm_computed_it():
    m = benchreport.from_vllm_result(vllm_result())
    assert (m["completed"], m["failed"], m["request_throughput"], m["output_throughput_tok_s"]) == (1, 1, 0.5, 2.0)
    assert m["ttft_ms"] == {"p50": 250.0, "p90": 250.0, "p99": 250.0, "mean": 250.0}
    assert m["errors"] == {"HTTP 503 Service Unavailable": 1}
    assert m["distributions"]["itl_ms"] == [100.0, 100.0, 100.0]
    assert m["distributions"]["tpot_ms"] == [pytest.approx(100.0)]


def test_vllm_result_without_percentiles_says_which_flags():
    doc = vllm_result()
    del doc["p90_tpot_ms"]
    with pytest.raises(ValueError, match="--metric-percentiles 50,90,99"):
        benchreport.from_vllm_result(doc)


# ------------------------------------------------------------------------------------------------ reports
def config(**over):
    fp = bench.fingerprint(mocker_plan())
    return {"profile": "custom", "workload": {"input_len": 64, "output_len": 16, "num_prompts": 8, "concurrency": 2,
                                              "endpoint": "completions", "levels": [2]},
            "client": "aiperf", "plan": fp, "plan_fingerprint": bench.fingerprint_hash(fp),
            "started": "2026-12-01T00:00:00+00:00", "finished": "2026-12-01T00:00:09+00:00", **over}


def run_of(conc: int, scale: float = 1.0):
    recs = [benchreport.Record(ok=True, ttft_s=0.05 * scale, latency_s=0.5 * scale, input_tokens=64,
                               output_tokens=16, itls_s=[0.03 * scale] * 15) for _ in range(8)]
    m = benchreport.metrics(recs, duration_s=2.0 * scale)
    m["concurrency"] = conc
    return m


def test_report_json_md_and_plots(tmp_path):
    runs = [run_of(2)]
    report = benchreport.build(runs, config())
    report["workers"] = {"tb-02/m3-worker@0": 5, "tb-03/m3-worker@0": 3}
    files = bench.write(report, runs, tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    for key in ("completed", "failed", "ttft_ms", "tpot_ms", "itl_ms", "request_throughput",
                "output_throughput_tok_s", "total_token_throughput_tok_s", "config"):
        assert key in doc
    assert set(doc["ttft_ms"]) == {"p50", "p90", "p99", "mean"}
    assert doc["config"]["plan"]["dynamo_version"] and doc["config"]["plan"]["hosts"] == 3
    assert "distributions" not in doc["runs"][0]
    md = (tmp_path / "report.md").read_text()
    assert "| concurrency | completed | failed |" in md and "| tb-02/m3-worker@0 | 5 |" in md
    assert {f.name for f in files} == {"report.json", "report.md", "latency.png", "workers.png"}
    for f in files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_report_heads_with_the_highest_concurrency_and_sums_counts(tmp_path):
    runs = [run_of(1), run_of(2, 1.1), run_of(4, 1.3)]
    report = benchreport.build(runs, config(profile="sweep"))
    assert report["completed"] == 24 and report["ttft_ms"] == runs[-1]["ttft_ms"]
    assert [r["concurrency"] for r in report["runs"]] == [1, 2, 4]
    files = bench.write(report, runs, tmp_path)
    assert "sweep.png" in {f.name for f in files}


def test_compare_prints_and_plots_deltas(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for d, scale, over in ((old, 1.0, {}), (new, 2.0, {"client": "aiperf 0.13.0"})):
        runs = [run_of(2, scale)]
        bench.write(benchreport.build(runs, config(**over)), runs, d)
    from rich.console import Console

    con = Console(record=True, width=160)
    rows = bench.compare_dirs(old, new, con)
    by = {r["metric"]: r for r in rows}
    assert by["request_throughput"]["delta_pct"] == -50.0 and by["request_throughput"]["better"] is False
    assert by["ttft_ms.p50"]["delta_pct"] == 100.0 and by["ttft_ms.p50"]["better"] is False
    assert by["failed"]["better"] is None
    out = con.export_text()
    assert "TTFT p50 (ms)" in out and "-50.0 %" in out
    assert (new / "compare.png").read_bytes()[:4] == b"\x89PNG" and "| TTFT p50 (ms) |" in (new / "compare.md").read_text()


def test_compare_of_a_directory_without_a_report_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="report.json does not exist"):
        benchreport.load(tmp_path)


class _Ran:
    def __init__(self, rc=0, stdout="", stderr=""):
        self.rc, self.stdout, self.stderr = rc, stdout, stderr


class FakeHosts:
    """Stands in for verify.Context's SSH (`run(host, command)`): records commands, answers `cat` with a result."""

    def __init__(self, result: dict, rc: int = 0):
        self.result, self.rc, self.ran = result, rc, []

    def run(self, host, command):
        self.ran.append((host, command))
        if command.startswith("cat "):
            return _Ran(stdout=json.dumps(self.result))
        return _Ran(rc=self.rc, stdout="============ Serving Benchmark Result ============\n", stderr="boom")


def test_gpu_run_is_vllm_bench_on_the_bench_host_then_its_result_file_read_back(tmp_path):
    p = shipped_plan("gb200")
    hosts = FakeHosts(vllm_result())
    out = tmp_path / "gb200-x"
    out.mkdir()
    m = bench._run_vllm(p, bench.SEED, 10, 100, out, hosts, None)
    (h1, run), (h2, cat), (h3, rm) = hosts.ran
    assert h1 == h2 == h3 == "gb200-r01-t01" and rm == "rm -rf /tmp/m3bench-gb200-x"
    assert run.startswith("mkdir -p /tmp/m3bench-gb200-x && docker run --rm --network host --entrypoint vllm ")
    assert cat == "cat /tmp/m3bench-gb200-x/vllm-c10.json"
    assert m["completed"] == 1 and (out / "vllm-c10.json").is_file() and (out / "vllm-c10.log").is_file()


def test_gpu_run_that_fails_shows_the_clients_output(tmp_path):
    with pytest.raises(M3Error, match=r"(?s)exited 1 \(concurrency 10\).*boom"):
        bench._run_vllm(shipped_plan("h200"), bench.SEED, 10, 100, tmp_path, FakeHosts({}, rc=1), None)


def test_missing_bench_client_names_the_one_command_that_installs_it(tmp_path, monkeypatch):
    """The demo installs no benchmark client (issue #21): `m3deploy bench` without aiperf says what installs it,
    before any request is sent. PATH holds no aiperf here, and this venv has none beside its python."""
    monkeypatch.setenv("PATH", str(tmp_path))
    if Path(bench.aiperf_exe()).is_file():
        pytest.fail(f"this test needs a Python without aiperf beside it; {bench.aiperf_exe()} exists")
    with pytest.raises(M3Error) as e:
        bench.need_client("aiperf")
    assert "the aiperf client" in str(e.value) and "Fix: bash scripts/install-deps.sh --bench" in str(e.value)
    bench.need_client("vllm")  # `vllm bench serve` runs in the worker's image: nothing more on the controller


def test_missing_matplotlib_is_named_before_any_run(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    with pytest.raises(M3Error, match=r"matplotlib .*Fix: bash scripts/install-deps.sh --bench"):
        bench.need_client("vllm")
