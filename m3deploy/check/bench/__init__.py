"""`m3deploy bench INVENTORY`: the seed's benchmark (or a sweep, or your own workload) against a deployed cluster,
gated on readiness, with a report (m3deploy.check.bench.report).

Clients (never a home-made load generator):
- `vllm` (default when the workers run in a container): `vllm bench serve` inside the first worker's own engine
  image, on that worker's host, over SSH: `docker run --rm --network host --entrypoint vllm IMAGE bench serve ...`
  with the worker's HF-cache mount (offline), so nothing new is installed on the cluster. Its
  `--save-result --save-detailed` file is read back and reported as vLLM computed it.
- `aiperf` (default when the workers are native, i.e. the testbed's mocker): NVIDIA AIPerf on the controller
  (scripts/install-deps.sh installs the `bench-client` extra's pin in its own venv), with the plan's tokenizer;
  its per-request export is turned into vLLM's metrics (benchreport.from_aiperf).

Before any load: every planned worker is listed by the frontend's /health on its planned address
(verify's `instances` check), each worker's own /health answers (verify's `health` checks) and real requests
through the endpoint succeed (smoke's models, completions and chat checks), polled until the plan's readiness
timeout (docs/BENCH.md).
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from m3deploy.check.bench import report as benchreport
from m3deploy.check.bench import serverview
from m3deploy.core.build import API_KEY_SECRET
from m3deploy.core.errors import M3Error, plural
from m3deploy.core.model import ClusterPlan, HostPlan, Service

# The seed's benchmark, verbatim (SEED.md): `--profile seed` is exactly this workload.
SEED_COMMAND = ("vllm bench serve --backend vllm --model MiniMaxAI/MiniMax-M3 --endpoint /v1/completions "
                "--dataset-name random --random-input 2048 --random-output 1024 --max-concurrency 10 --num-prompt 100")
ENDPOINTS = {"completions": ("vllm", "/v1/completions"), "chat": ("openai-chat", "/v1/chat/completions")}
RESULT_DIR = "/m3bench"  # inside the client container
SWEEP_CAP = 64


@dataclass(frozen=True)
class Workload:
    input_len: int = 2048
    output_len: int = 1024
    num_prompts: int = 100  # per concurrency level; a sweep's default is 10 x concurrency
    concurrency: int = 10  # a sweep's cap
    endpoint: str = "completions"


SEED = Workload()


def workload(profile: str, input_len=None, output_len=None, num_prompts=None, concurrency=None,
             endpoint=None) -> Workload:
    """The profile's workload with the flags given. `seed` takes no overrides (it is the seed's, exactly)."""
    given = {k: v for k, v in dict(input_len=input_len, output_len=output_len, num_prompts=num_prompts,
                                   concurrency=concurrency, endpoint=endpoint).items() if v is not None}
    if profile == "seed" and given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise M3Error(f"--profile seed is the seed's workload exactly; {flags} change it. "
                      f"Fix: add --profile custom (or drop {flags})")
    w = replace(SEED, **given)
    if profile == "sweep" and concurrency is None:
        w = replace(w, concurrency=SWEEP_CAP)
    if profile == "sweep" and num_prompts is None:
        w = replace(w, num_prompts=0)  # 0: 10 x each level's concurrency
    for k in ("input_len", "output_len", "concurrency"):
        if getattr(w, k) < 1:
            raise M3Error(f"--{k.replace('_', '-')} must be >= 1 (got {getattr(w, k)})")
    if w.num_prompts < 0 or (profile != "sweep" and w.num_prompts < 1):
        raise M3Error(f"--num-prompts must be >= 1 (got {w.num_prompts})")
    if w.endpoint not in ENDPOINTS:
        raise M3Error(f"--endpoint {w.endpoint!r}: use one of {', '.join(ENDPOINTS)}")
    return w


def levels(profile: str, w: Workload) -> list[tuple[int, int]]:
    """(concurrency, prompts) per run: one run, or 1, 2, 4, ... up to the cap (the cap included)."""
    if profile != "sweep":
        return [(w.concurrency, w.num_prompts)]
    out, c = [], 1
    while c < w.concurrency:
        out.append(c)
        c *= 2
    out.append(w.concurrency)
    return [(c, w.num_prompts or 10 * c) for c in out]


# ------------------------------------------------------------------------------------------------ the plan
def base_url(plan: ClusterPlan) -> str:
    """The endpoint without its /v1 (clients add the path)."""
    u = plan.endpoint.rstrip("/")
    return u[: -len("/v1")] if u.endswith("/v1") else u


def bench_host(plan: ClusterPlan) -> tuple[HostPlan, Service]:
    """Where `vllm bench serve` runs on a GPU cluster: the host of worker 0's rank 0, in its engine image."""
    if not plan.workers:
        raise M3Error(f"cluster {plan.name} plans no worker: nothing to benchmark")
    hname, sname = plan.workers[0].services[0].split("/", 1)
    h = plan.host(hname)
    return h, h.service(sname)


def default_client(plan: ClusterPlan) -> str:
    return "vllm" if bench_host(plan)[1].image else "aiperf"


def gpus(plan: ClusterPlan) -> int:
    """GPUs behind the endpoint (a mocker worker counts as one simulated GPU). Standalone serving: the endpoint
    is worker 0's, so only its GPUs take the load."""
    served = plan.workers if plan.serving == "dynamo" else plan.workers[:1]
    return sum(max(w.gpus_per_rank, 1) * len(w.services) for w in served)


def gate_text(plan: ClusterPlan) -> str:
    if plan.serving == "dynamo":
        return (f"the frontend lists all {len(plan.workers)} planned worker(s) on their addresses, each worker's "
                f"/health answers, and {plan.endpoint} answers real requests")
    more = (f"; standalone serving: the endpoint is worker 0's, the other {len(plan.workers) - 1} worker(s) get no "
            f"load from this benchmark" if len(plan.workers) > 1 else "")
    return f"every planned worker's /health answers and {plan.endpoint} answers real requests{more}"


def _hf_mounts(h: HostPlan, s: Service) -> list[str]:
    """The worker's `-v` of the HF cache (the client reads the tokenizer from it, offline)."""
    out, args = [], list(s.docker_args)
    for i, a in enumerate(args[:-1]):
        if a == "-v" and h.weights_dir and args[i + 1].split(":", 1)[0] == h.weights_dir:
            out += ["-v", args[i + 1]]
    return out


def vllm_argv(plan: ClusterPlan, w: Workload, concurrency: int, prompts: int, result_file: str) -> list[str]:
    """`vllm bench serve` for one run: the seed's flags first, in the seed's order and spelling, then where to
    send, what to measure and where to save."""
    backend, path = ENDPOINTS[w.endpoint]
    argv = ["vllm", "bench", "serve", "--backend", backend, "--model", plan.served_model_name, "--endpoint", path,
            "--dataset-name", "random", "--random-input", str(w.input_len), "--random-output", str(w.output_len),
            "--max-concurrency", str(concurrency), "--num-prompt", str(prompts),
            "--base-url", base_url(plan)]
    if plan.model_id and plan.model_id != plan.served_model_name:
        argv += ["--tokenizer", plan.model_id]
    _, s = bench_host(plan)
    if "--trust-remote-code" in s.argv:
        argv.append("--trust-remote-code")
    argv += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
             ",".join(str(p) for p in benchreport.PCTS), "--save-result", "--save-detailed",
             "--result-dir", RESULT_DIR, "--result-filename", result_file]
    return argv


def docker_command(plan: ClusterPlan, w: Workload, concurrency: int, prompts: int, result_file: str,
                   host_dir: str, image: str | None = None) -> list[str]:
    """What runs on the bench host: the client in the worker's engine image, host network, offline HF cache."""
    h, s = bench_host(plan)
    img = image or s.image
    if not img:
        raise M3Error(f"worker {h.name}/{s.name} runs natively (engine {plan.engine}), not in a container: "
                      f"there is no engine image to run `vllm bench serve` in. Fix: --client aiperf "
                      f"(on the controller), or --image IMAGE with vllm inside")
    argv = vllm_argv(plan, w, concurrency, prompts, result_file)
    key = ["-e", "OPENAI_API_KEY"] if key_env(s) else []  # the name only: docker takes the value from its env
    return ["docker", "run", "--rm", "--network", "host", "--entrypoint", "vllm", *_hf_mounts(h, s),
            "-e", "HF_HUB_OFFLINE=1", *key, "-v", f"{host_dir}:{RESULT_DIR}", img, *argv[1:]]


def key_env(s: Service) -> str:
    """The env name the worker reads its API key from (m3_api_key_file), '' when it has none."""
    return next((k for k, n in s.secret_env if n == API_KEY_SECRET), "")


def key_prefix(plan: ClusterPlan) -> str:
    """Shell prefix of the bench host's command: OPENAI_API_KEY (what `vllm bench serve` sends as its Bearer:
    vllm/benchmarks/lib/endpoint_request_func.py `_get_headers`) read on the host from the worker's own 0600 env
    file, so the key crosses no command line and no SSH session."""
    _, s = bench_host(plan)
    name = key_env(s)
    return f"OPENAI_API_KEY=\"$(sed -n 's/^{name}=//p' {shlex.quote(s.env_file)})\" " if name else ""


def aiperf_argv(plan: ClusterPlan, w: Workload, concurrency: int, prompts: int, artifact_dir: str,
                tokenizer: str) -> list[str]:
    """`aiperf profile` with the same workload: vllm's random dataset (`--prompt-corpus random` in aiperf's `vllm`
    style: random ids from the non-special vocabulary, lengths fixed by range ratio 0 as vllm's default), streaming,
    token counts from the server's usage (as vllm bench), no warm-up."""
    if dict(plan.settings).get("m3_api_key_file"):
        # aiperf/config/flags/cli_config.py: `--api-key` (argv) or a YAML config's api_key; aiperf 0.13.0's CLI
        # reads no environment variable for it (common/endpoint_credentials.py uses OPENAI_API_KEY only to
        # rehydrate a key already configured)
        raise M3Error("m3_api_key_file is set, and aiperf 0.13.0 takes an API key only on its command line (where "
                      "`ps` shows it). Fix: --client vllm (`vllm bench serve` in the worker's image reads it from "
                      "the environment)")
    return [aiperf_exe(), "profile", "--model", plan.served_model_name, "--url", base_url(plan),
            "--endpoint-type", w.endpoint, "--streaming", "--tokenizer", tokenizer,
            "--synthetic-input-tokens-mean", str(w.input_len), "--output-tokens-mean", str(w.output_len),
            "--prompt-corpus", "random", "--random-corpus-style", "vllm", "--random-range-ratio", "0",
            "--concurrency", str(concurrency), "--request-count", str(prompts), "--use-server-token-count",
            "--random-seed", "0", "--artifact-dir", artifact_dir, "--ui-type", "none", "--no-gpu-telemetry",
            "--no-server-metrics"]


def fingerprint(plan: ClusterPlan, image_ids: dict[str, str] | None = None) -> dict[str, Any]:
    """What the numbers depend on, from the plan: model, variant, parallel, engine flags, images, Dynamo, hosts."""
    h, s = bench_host(plan)
    images = sorted({x for hp in plan.hosts for sv in hp.services for x in (sv.image, sv.base_image) if x})
    return {
        "cluster": plan.name, "model": plan.model_id, "served_model_name": plan.served_model_name,
        "platform": plan.platform, "variant": plan.variant, "parallel": plan.parallel, "engine": plan.engine,
        "serving": plan.serving, "features": list(plan.features), "engine_argv": list(s.argv),
        "engine_env": {k: v for k, v in s.env if not k.startswith(("ETCD_", "NATS_", "DYN_TCP", "DYN_EVENT_PLANE_HOST",
                                                                   "DYN_SYSTEM_HOST"))},
        "images": images, "image_ids": dict(image_ids or {}), "dynamo_version": plan.dynamo_version,
        "hosts": len(plan.hosts), "workers": len(plan.workers), "gpus": gpus(plan),
        "endpoint": plan.endpoint,
    }


def fingerprint_hash(fp: dict[str, Any]) -> str:
    keep = {k: v for k, v in fp.items() if k not in ("endpoint", "cluster")}
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ readiness
def wait_routable(plan: ClusterPlan, ctx, timeout_s: float, on_wait: Callable[[str], None] = lambda m: None,
                  clock=time.monotonic, sleep=time.sleep) -> str:
    """Every planned worker is listed by the frontend (on its planned address), each worker's /health answers,
    and real requests are answered; polled until timeout_s. Returns the evidence; raises M3Error naming what is
    missing. `on_wait` hears each new reason to wait."""
    from m3deploy.check import verify
    from m3deploy.check.verify import smoke

    workers = {f"health/{k}" for w in plan.workers for k in w.services}
    wanted = {"instances", "smoke/models", "smoke/completions", "smoke/chat", *workers}
    checks = [c for c in verify.controller_checks(plan) + smoke.smoke_checks(plan)
              if c.group in wanted or c.id in wanted]
    start, said = clock(), ""
    while True:
        results = [verify.run_check(c, ctx) for c in checks]
        bad = [r for r in results if not r.ok]
        if not bad:
            return "; ".join(f"{r.id}: {r.evidence}" for r in results)
        if clock() - start >= timeout_s:
            raise M3Error(f"cluster {plan.name} is not fully routable after {timeout_s:.0f} s, so no load was sent "
                          f"(a run with missing workers reports less throughput than the cluster has):\n"
                          + "\n".join(f"  - {r.id}: {r.evidence}\n    reproduce: {r.reproduce}" for r in bad)
                          + "\n  fix: m3deploy verify INVENTORY shows what is down; bring it up and run again")
        if bad[0].id != said:
            said = bad[0].id
            on_wait(f"waiting: {bad[0].id}: {bad[0].evidence[:120]}")
        sleep(1.0)


def gate_timeout(plan: ClusterPlan) -> int:
    """How long the gate waits by default: the frontend's readiness timeout (else the bench worker's) from the plan."""
    from m3deploy.check.checks import frontend

    fe = frontend(plan)
    r = fe[1].readiness if fe else bench_host(plan)[1].readiness
    return r.timeout_s if r else 120


def worker_requests(plan: ClusterPlan, ctx) -> dict[str, float]:
    """{"host/service": generate requests so far} from each planned worker's /metrics (none: {})."""
    from m3deploy.check.checks import instance_services, metrics_url
    from m3deploy.check.verify import smoke

    if not any(metrics_url(h, s) for h, s in instance_services(plan)):
        return {}
    return smoke.request_counters(ctx)


# ------------------------------------------------------------------------------------------------ running
class _Poller(threading.Thread):
    """Reads the workers' request counters every `every` s while a run goes (progress on the terminal)."""

    def __init__(self, read: Callable[[], float], update: Callable[[float], None], every: float = 0.5):
        super().__init__(daemon=True)
        self.read, self.update, self.every = read, update, every
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(self.every):
            try:
                self.update(self.read())
            except Exception:  # noqa: BLE001 - progress is best effort; the report reads the counters again
                pass


def _run_aiperf(plan, w, conc, prompts, out: Path, tokenizer: str) -> dict[str, Any]:
    art = out / f"aiperf-c{conc}"
    argv = aiperf_argv(plan, w, conc, prompts, str(art), tokenizer)
    log = out / f"aiperf-c{conc}.log"
    with open(log, "w") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        res = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             timeout=max(600, prompts * 60 // max(conc, 1)), env=aiperf_env(plan))
    if res.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise M3Error(f"aiperf exited {res.returncode} (concurrency {conc}); its log {log} ends:\n{tail}")
    return benchreport.from_aiperf(art)


def aiperf_env(plan: ClusterPlan) -> dict[str, str] | None:
    """aiperf's environment: through the edge (HTTPS) SSL_CERT_FILE names the cluster's CA (aiperf 0.13.0's
    aiohttp connector verifies with `ssl=True`, aiohttp's default context, which OpenSSL fills from it)."""
    from m3deploy.controller import tls

    ca = tls.ca_file(plan)
    return {**os.environ, "SSL_CERT_FILE": ca} if ca else None


def _run_vllm(plan, w, conc, prompts, out: Path, ctx, image: str | None) -> dict[str, Any]:
    if plan.endpoint.startswith("https://"):
        raise M3Error("the endpoint is the edge (m3_edge), and `vllm bench serve` runs on a worker host, which has "
                      "neither the cluster's CA nor the edge's API keys. Fix: --client aiperf (on the controller, "
                      "verifying with the CA; without m3_api_key_file)")
    h, _ = bench_host(plan)
    remote = f"/tmp/m3bench-{out.name}"
    name = f"vllm-c{conc}.json"
    cmd = docker_command(plan, w, conc, prompts, name, remote, image)
    r = ctx.run(h.name, f"mkdir -p {shlex.quote(remote)} && {key_prefix(plan)}{shlex.join(cmd)}")
    (out / f"vllm-c{conc}.log").write_text("$ " + shlex.join(cmd) + "\n" + r.stdout + r.stderr)
    if r.rc != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-25:])
        raise M3Error(f"`vllm bench serve` on {h.name} exited {r.rc} (concurrency {conc}):\n{tail}")
    got = ctx.run(h.name, f"cat {shlex.quote(remote + '/' + name)}")
    if got.rc != 0:
        raise M3Error(f"{h.name}: no result file {remote}/{name}: {got.stderr.strip()[:300]}")
    (out / name).write_text(got.stdout)
    ctx.run(h.name, f"rm -rf {shlex.quote(remote)}")
    return benchreport.from_vllm_result(json.loads(got.stdout))


def _image_ids(plan: ClusterPlan, ctx, image: str | None) -> dict[str, str]:
    h, s = bench_host(plan)
    img = image or s.image
    r = ctx.run(h.name, f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(img)}")
    return {img: r.stdout.strip()} if r.rc == 0 else {}


def run(plan: ClusterPlan, inventory, profile: str, w: Workload, out: Path, client: str, console,
        image: str | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from m3deploy.check.checks import Context
    from m3deploy.check.verify.smoke import deltas

    ctx = Context(plan, inventory, request_timeout=120.0)
    try:
        out.mkdir(parents=True, exist_ok=True)
        wait_s = timeout_s if timeout_s is not None else gate_timeout(plan)
        with console.status(f"waiting until all {plural(len(plan.workers), 'worker')} of {plan.name} are routable"):
            gate = wait_routable(plan, ctx, wait_s, on_wait=lambda m: console.log(m))
        console.log(f"routable: {len(plan.workers)} of {plural(len(plan.workers), 'worker')} listed, requests answered")
        tokenizer = ""
        if client == "aiperf":
            tokenizer = _tokenizer(plan)
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t_start = time.time()
        runs = []
        steps = levels(profile, w)
        before_all = worker_requests(plan, ctx)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as prog:
            for conc, prompts in steps:
                task = prog.add_task(f"{client}: concurrency {conc}, {prompts} x {w.input_len}->{w.output_len} "
                                     f"tokens", total=prompts)
                before = worker_requests(plan, ctx)
                poll = _Poller(lambda b=before: sum(deltas(b, worker_requests(plan, ctx)).values()),
                               lambda n, t=task, total=prompts: prog.update(t, completed=min(n, total)))
                if before:
                    poll.start()
                try:
                    if client == "aiperf":
                        m = _run_aiperf(plan, w, conc, prompts, out, tokenizer)
                    else:
                        m = _run_vllm(plan, w, conc, prompts, out, ctx, image)
                finally:
                    poll.stop.set()
                    if poll.is_alive():
                        poll.join()
                m["concurrency"] = conc
                m["workers"] = deltas(before, worker_requests(plan, ctx))
                prog.update(task, completed=m["completed"] + m["failed"])
                runs.append(m)
        workers = deltas(before_all, worker_requests(plan, ctx))
        ids = _image_ids(plan, ctx, image) if client == "vllm" else {}
    finally:
        ctx.close()
    fp = fingerprint(plan, ids)
    config = {"profile": profile, "workload": {**asdict(w), "levels": [c for c, _ in steps]},
              "client": _client_name(client, plan, image), "plan": fp, "plan_fingerprint": fingerprint_hash(fp),
              "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "readiness": gate, "seed_command": SEED_COMMAND}
    report = benchreport.build(runs, config)
    report["workers"] = workers
    report["server"] = serverview.collect(plan, t_start, time.time())  # m3_monitor: Prometheus's view of the run
    write(report, runs, out)
    return report


def _client_name(client: str, plan: ClusterPlan, image: str | None) -> str:
    if client == "aiperf":
        r = subprocess.run([aiperf_exe(), "--version"], capture_output=True, text=True, timeout=60)
        return f"aiperf {(r.stdout.strip().splitlines() or ['?'])[-1]} on the controller"
    h, s = bench_host(plan)
    return f"vllm bench serve in {image or s.image} on {h.name}"


def _tokenizer(plan: ClusterPlan) -> str:
    """The tokenizer aiperf builds prompts with: the mock model's (testbed), else the HF repo id."""
    if plan.engine == "mocker":
        from m3deploy.controller import mockmodel

        return str(mockmodel.ensure_model_dir(plan.served_model_name or mockmodel.NAME))
    return plan.model_id


def write(report: dict[str, Any], runs: list[dict[str, Any]], out: Path) -> list[Path]:
    """report.json, report.md and the plots; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(benchreport.markdown(report))
    fp = report["config"]["plan"]
    title = (f"{fp['cluster']}: {fp['model']} {fp['variant']} {fp['parallel']} "
             f"({fp['engine']}, {report['config']['profile']})")
    files = [out / "report.json", out / "report.md",
             benchreport.plot_latency(runs, out / "latency.png", title)]
    if report.get("workers"):
        files.append(benchreport.plot_workers(report["workers"], out / "workers.png",
                                              f"requests per worker (their /metrics)\n{title}"))
    if len(runs) > 1:
        files.append(benchreport.plot_sweep(runs, fp["gpus"], out / "sweep.png", title))
    server = serverview.plot(report.get("server") or {}, out / "server.png", f"server side (Prometheus)\n{title}")
    files += [server] if server else []
    return files


def compare_dirs(old_dir: Path, new_dir: Path, console) -> list[dict[str, Any]]:
    """Print and plot (compare.png, compare.md in new_dir) the deltas of new_dir's run against old_dir's."""
    from rich.table import Table

    old, new = benchreport.load(old_dir), benchreport.load(new_dir)
    rows = benchreport.compare(old, new)
    notes = benchreport.compare_notes(old, new)
    t = Table(title=f"{new_dir} vs {old_dir}")
    for col in ("metric", "old", "new", "delta", "delta %"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for r in rows:
        style = {True: "green", False: "red", None: ""}[r["better"]]
        pct = "-" if r["delta_pct"] is None else f"{r['delta_pct']:+.1f} %"
        t.add_row(r["label"], benchreport.fmt(r["old"]), benchreport.fmt(r["new"]), f"{r['delta']:+,.2f}",
                  f"[{style}]{pct}[/]" if style else pct)
    console.print(t)
    for n in notes:
        console.print(f"  setup differs: {n}")
    (new_dir / "compare.md").write_text(benchreport.compare_markdown(rows, notes, str(old_dir), str(new_dir)))
    benchreport.plot_compare(rows, new_dir / "compare.png", f"{new_dir.name} vs {old_dir.name}")
    return rows


# ------------------------------------------------------------------------------------------------ dry run
def dry_run_text(plan: ClusterPlan, profile: str, w: Workload, client: str, image: str | None, out: Path) -> str:
    lines = [f"# m3deploy bench {plan.name} --profile {profile} (dry run: nothing is sent)",
             f"# first, polled until ready: {gate_text(plan)}", f"# report: {out}"]
    h, _ = bench_host(plan)
    for conc, prompts in levels(profile, w):
        if client == "vllm":
            cmd = docker_command(plan, w, conc, prompts, f"vllm-c{conc}.json", f"/tmp/m3bench-{out.name}", image)
            lines.append(f"# on {h.name} ({h.address}), concurrency {conc}:")
            lines.append(key_prefix(plan) + shlex.join(cmd))
        else:
            cmd = aiperf_argv(plan, w, conc, prompts, str(out / f"aiperf-c{conc}"), _tokenizer_hint(plan))
            lines.append(f"# on the controller, concurrency {conc}:")
            lines.append(shlex.join(cmd))
    return "\n".join(lines)


def _tokenizer_hint(plan: ClusterPlan) -> str:
    return "<the mock model's directory in the controller cache>" if plan.engine == "mocker" else plan.model_id


def aiperf_exe() -> str:
    """aiperf's console script: next to this Python (installed in the same environment), else on PATH
    (scripts/install-deps.sh puts it in its own venv, /opt/m3deploy/aiperf-VERSION, linked from /usr/local/bin:
    aiperf pins rich~=14.1, pandas, pillow, ... which must not replace the controller's own)."""
    here = Path(sys.executable).with_name("aiperf")
    return str(here) if here.is_file() else (shutil.which("aiperf") or "aiperf")


INSTALL_HINT = "bash scripts/install-deps.sh --bench"  # the one command that installs what `m3deploy bench` needs


def need_client(client: str) -> None:
    """What a run needs on the controller, before any request is sent: matplotlib (the report's plots) and, for the
    aiperf client, aiperf. The demo installs neither; the message names the one command that does."""
    import importlib.util

    missing = [] if importlib.util.find_spec("matplotlib") else [f"matplotlib (not importable by {sys.executable})"]
    if client == "aiperf":
        exe = aiperf_exe()
        if not (os.path.isfile(exe) or shutil.which(exe)):
            missing.append(f"the aiperf client (no `aiperf` next to {sys.executable} or on PATH)")
    if missing:
        raise M3Error(f"`m3deploy bench` needs {' and '.join(missing)}, which are not installed. Fix: {INSTALL_HINT} "
                      f"(matplotlib into m3deploy's venv, and the aiperf version pinned in pyproject's `bench-client` "
                      f"extra into its own venv); by hand: pip install 'm3deploy[bench,bench-client]'")
