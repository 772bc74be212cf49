"""m3_api_key_file: the endpoint's API key, read from a 0600 controller file, carried as secret env where the server
itself checks it (standalone vLLM: VLLM_API_KEY), refused where nothing would (the Dynamo 1.6.1 frontend, SGLang,
TensorRT-LLM), and sent by every client of ours: verify's smoke checks, the deploy's serving check, the rollout's
request, `m3deploy bench`.

No vLLM runs here (no GPU), so the clients are tested against a stub server holding vLLM's contract, as read in
vllm-project/vllm `vllm/entrypoints/serve/utils/server_utils.py` (AuthenticationMiddleware, installed by
`vllm/entrypoints/openai/api_server.py` build_app when `--api-key` or env VLLM_API_KEY is set): paths under /v1
need `Authorization: Bearer KEY` and get 401 `{"error": "Unauthorized"}` without it; /health stays open.
docs/CONTRACTS.md "API keys" has the sources.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from m3deploy.check.checks import Context
from m3deploy.check.verify import run_check
from m3deploy.check.verify.smoke import smoke_checks
from m3deploy.controller.secrets import read_api_key
from m3deploy.core.build import API_KEY_SECRET, build
from m3deploy.core.errors import M3Error, ValidationError
from m3deploy.core.inventory import InvHost, load_inventory

ROOT = Path(__file__).resolve().parents[2]
KEY = "m3k-UnitTestApiKeyDoNotLeak-0123456789abcdef"
MODEL = "MiniMaxAI/MiniMax-M3"


@pytest.fixture
def key_file(tmp_path) -> Path:
    p = tmp_path / "api.key"
    p.write_text(KEY + "\n")  # `openssl rand -hex 32 > FILE` leaves a newline
    p.chmod(0o600)
    return p


def _inv(name: str, **override):
    return load_inventory(ROOT / "inventories" / f"{name}.py", override_data=override)


# ---------------------------------------------------------------------------------------------- the file
def test_key_file_read_stripped(key_file):
    assert read_api_key(str(key_file)) == KEY


@pytest.mark.parametrize("content,mode,must", [
    (KEY, 0o644, ("readable by others (mode 644)", "chmod 600")),
    (KEY, 0o640, ("readable by others (mode 640)", "chmod 600")),
    ("", 0o600, ("is empty", "chmod 600")),
    ("\n  \n", 0o600, ("is empty",)),
    (KEY + "\nsecond line", 0o600, ("more than one line",)),
    ("has a space", 0o600, ("spaces",)),
])
def test_bad_key_file_refused_naming_key_file_and_fix(tmp_path, content, mode, must):
    p = tmp_path / "k"
    p.write_text(content)
    p.chmod(mode)
    with pytest.raises(M3Error) as e:
        read_api_key(str(p))
    msg = str(e.value)
    assert msg.startswith(f"key m3_api_key_file: {p} ") and "Fix" in msg, msg
    assert all(m in msg for m in must), msg
    assert KEY not in msg and "second line" not in msg  # never the content


def test_missing_key_file(tmp_path):
    with pytest.raises(M3Error, match=r"m3_api_key_file: .*/nope does not exist .*chmod 600"):
        read_api_key(str(tmp_path / "nope"))


def test_validate_exits_2_on_a_world_readable_key_file(key_file):
    from m3deploy.cli import main

    ok = CliRunner().invoke(main, ["validate", str(ROOT / "inventories/h200.py"), "--data",
                                   f"m3_api_key_file={key_file}"])
    assert ok.exit_code == 0, ok.output
    key_file.chmod(0o644)
    bad = CliRunner().invoke(main, ["validate", str(ROOT / "inventories/h200.py"), "--data",
                                    f"m3_api_key_file={key_file}"])
    assert bad.exit_code == 2
    assert f"key m3_api_key_file: {key_file} is readable by others" in bad.output
    assert f"chmod 600 {key_file}" in bad.output


# ---------------------------------------------------------------------------------------------- where
SIM = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1"}
SIM_HOSTS = [InvHost(name="ctl", groups=("control",), data={**SIM, "m3_address": "10.0.0.1"}),
             InvHost(name="w1", groups=("workers",), data={**SIM, "m3_address": "10.0.0.2"})]


@pytest.mark.parametrize("hosts,override,why", [
    (SIM_HOSTS, {}, "the Dynamo 1.6.1 frontend has no API-key option"),  # the testbed's serving path
    ("h200", {"m3_serving": "dynamo"}, "the Dynamo 1.6.1 frontend has no API-key option"),
    ("h200", {"m3_engine": "sglang"}, "SGLang reads its API key only from --api-key on its command line"),
    ("h200", {"m3_engine": "trtllm", "m3_features": ["text-only"]}, "trtllm-serve has no API-key option"),
])
def test_refused_where_no_server_checks_the_key(hosts, override, why):
    override = {"m3_api_key_file": "/etc/m3/k", **override}
    hosts = _inv(hosts, **override) if isinstance(hosts, str) else [
        InvHost(h.name, h.groups, {**h.data, **override}) for h in hosts]
    with pytest.raises(ValidationError) as e:
        build(hosts, name="refused")
    (line,) = [p for p in e.value.problems if "m3_api_key_file" in p]
    assert why in line and "Fix: remove m3_api_key_file" in line and "reverse proxy" in line, line


def test_standalone_vllm_carries_the_key_as_secret_env_only(key_file):
    from m3deploy.cli import render_text

    plan = build(_inv("h200", m3_api_key_file=str(key_file)), name="h200")
    (w,) = [s for h in plan.hosts for s in h.services if s.kind == "worker"]
    assert ("VLLM_API_KEY", API_KEY_SECRET) in w.secret_env
    assert not any("api-key" in a or "api_key" in a for a in w.argv), w.argv  # never a flag
    assert "VLLM_API_KEY" not in dict(w.env)
    shown = [json.dumps(plan.to_dict(provenance=True)), render_text(plan), render_text(plan, explain=True),
             w.shell(), " ".join(w.command)]
    assert all(KEY not in text for text in shown)
    assert "export VLLM_API_KEY=<secret:api-key>" in render_text(plan)


def test_multi_host_standalone_key_on_the_serving_rank_only(key_file):
    """Ranks > 0 run `--headless` (no API server): only rank 0 (GB200: tp8 over two 4-GPU trays) gets the key."""
    plan = build(_inv("gb200", m3_api_key_file=str(key_file), m3_serving="standalone"), name="gb200")
    w0 = plan.workers[0]
    ranks = [plan.host(k.split("/")[0]).service(k.split("/")[1]) for k in w0.services]
    assert len(ranks) == 2 and "--headless" in ranks[1].argv
    assert [s.secret_env for s in ranks] == [(("VLLM_API_KEY", API_KEY_SECRET),), ()]


# ---------------------------------------------------------------------------------------------- clients
class _VllmStub(BaseHTTPRequestHandler):
    """vLLM's AuthenticationMiddleware contract (module docstring) in front of just enough of the OpenAI API."""

    enforce = True
    seen: list = []

    def log_message(self, *a):  # quiet
        pass

    def _send(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        self.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if not self.enforce or not self.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            return True
        scheme, _, param = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and param == KEY

    def do_GET(self):
        if not self._authorized():
            return self._send(401, {"error": "Unauthorized"})
        if self.path == "/health":
            return self._send(200, {})
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}]})
        self._send(404, {"error": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self._authorized():
            return self._send(401, {"error": "Unauthorized"})
        self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
                         "choices": [{"index": 0, "finish_reason": "length",
                                      "message": {"role": "assistant", "content": "hello there"}}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
                         "nvext": {"worker_id": {"decode_worker_id": 7}}})


@pytest.fixture
def stub():
    _VllmStub.enforce, _VllmStub.seen = True, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _VllmStub)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _plan(stub, key_file):
    """A standalone vLLM plan whose endpoint is the stub (worker port = the stub's port on 127.0.0.1)."""
    data = {"m3_platform": "h200", "m3_engine": "vllm", "m3_serving": "standalone", "m3_address": "127.0.0.1",
            "m3_worker_port": stub.server_address[1], "m3_api_key_file": str(key_file)}
    plan = build([InvHost(name="w1", groups=("workers",), data=data)], name="keyed")
    assert plan.endpoint == f"http://127.0.0.1:{stub.server_address[1]}/v1"
    return plan


def _checks(plan, ids):
    by_id = {c.id: c for c in smoke_checks(plan)}
    return [by_id[i] for i in ids]


def test_smoke_api_key_check_proves_the_contract(stub, key_file):
    plan = _plan(stub, key_file)
    ctx = Context(plan)
    results = {c.id: run_check(c, ctx) for c in _checks(plan, ["smoke/api-key", "smoke/models", "smoke/chat"])}
    assert all(r.ok for r in results.values()), {k: r.evidence for k, r in results.items()}
    assert results["smoke/api-key"].evidence == "GET /v1/models with no key: 401, a wrong key: 401, the key: 200"
    # every smoke request but the two deliberate ones carried the key
    sent = [auth for _, path, auth in _VllmStub.seen if path.startswith("/v1")]
    assert sent.count(None) == 1 and sent.count("Bearer m3-wrong-key") == 1
    assert sent.count(f"Bearer {KEY}") == len(sent) - 2 >= 3


def test_smoke_api_key_check_fails_when_the_server_does_not_enforce(stub, key_file):
    _VllmStub.enforce = False
    plan = _plan(stub, key_file)
    (c,) = _checks(plan, ["smoke/api-key"])
    r = run_check(c, Context(plan))
    assert not r.ok and "with no key: HTTP 200 (want 401)" in r.evidence, r.evidence
    assert KEY not in c.reproduce and f'-H "Authorization: Bearer $(head -n1 {key_file})"' in c.reproduce


def test_no_api_key_check_without_a_key(stub, key_file):
    plan = _plan(stub, key_file)
    plain = build([InvHost(name="w1", groups=("workers",), data={**dict(plan.hosts[0].data),
                                                                     "m3_api_key_file": None})], name="open")
    assert "smoke/api-key" not in {c.id for c in smoke_checks(plain)}
    assert not any("Authorization" in c.reproduce for c in smoke_checks(plain))


def test_verify_context_refuses_a_readable_key_file(stub, key_file):
    plan = _plan(stub, key_file)
    key_file.chmod(0o644)
    with pytest.raises(M3Error, match="chmod 600"):
        Context(plan)


# ---------------------------------------------------------------------------------------------- bench
def test_bench_vllm_client_gets_the_key_from_the_workers_env_file(key_file, tmp_path):
    """`vllm bench serve` sends OPENAI_API_KEY as its Bearer (vllm-project/vllm
    vllm/benchmarks/lib/endpoint_request_func.py `_get_headers`). The bench host's command reads it from the
    worker's own 0600 env file (rendered here by m3deploy.deploy.render exactly as the deploy ships it) into the docker
    client's environment; `docker run -e OPENAI_API_KEY` passes it on by name."""
    from m3deploy.check import bench
    from m3deploy.deploy.render import service_env

    plan = build(_inv("h200", m3_api_key_file=str(key_file)), name="h200")
    w = bench.workload("seed")
    cmd = bench.docker_command(plan, w, 1, 2, "r.json", "/tmp/r")
    assert cmd[cmd.index("OPENAI_API_KEY") - 1] == "-e" and KEY not in " ".join(cmd)
    prefix = bench.key_prefix(plan)
    _, s = bench.bench_host(plan)
    assert KEY not in prefix and s.env_file in prefix
    env = tmp_path / "worker.env"
    env.write_text(service_env(s, {API_KEY_SECRET: KEY}))
    got = subprocess.run(["sh", "-c", prefix.replace(s.env_file, str(env)) + 'sh -c \'printf %s "$OPENAI_API_KEY"\''],
                         capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
    assert got.stdout == KEY
    assert KEY not in bench.dry_run_text(plan, "seed", w, "vllm", None, tmp_path / "out")


def test_bench_aiperf_refused_with_a_key(key_file, tmp_path):
    """aiperf 0.13.0 takes the key as `--api-key` (aiperf/config/flags/cli_config.py) or in a YAML config; its CLI
    reads no environment variable for it, so it would sit in `ps`."""
    from m3deploy.check import bench

    plan = build(_inv("h200", m3_api_key_file=str(key_file)), name="h200")
    with pytest.raises(M3Error, match="--client vllm"):
        bench.aiperf_argv(plan, bench.workload("seed"), 1, 2, str(tmp_path), "tok")
