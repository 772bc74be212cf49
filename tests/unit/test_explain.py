"""`m3deploy plan --explain` tells the truth (issue 33): every service is built once, by its component, so the
provenance of each argv flag and env value names the value the service really runs with, the layer or feature
that set it, and the file (or `--data`) the setting behind it was read from."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from m3deploy.cli import load_plan, render_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
render_matrix = __import__("render-matrix")  # the same inventories x variants the render proof uses


@pytest.fixture(autouse=True)
def _testbed_state(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: render_matrix.TESTBED_STATE)
    monkeypatch.setenv("M3_TESTBED", "m3tb")
    monkeypatch.chdir(ROOT)


def _plan(inventory: str, env=None, monkeypatch=None, **data):
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    return load_plan(str(ROOT / "inventories" / f"{inventory}.py"),
                     [f"{k}={json.dumps(v)}" for k, v in data.items()], facts=False)


def _prov(svc):
    """{key: the last record for it} (a later layer wins, as in the recipe)."""
    return {p.key: p for p in svc.provenance}


def _untrue(svc) -> list[str]:
    """What --explain would get wrong about `svc`: a flag or env value without a record, or a record whose value is
    not the one the service runs with."""
    prov, out = _prov(svc), []
    for k, v in svc.env:
        p = prov.get(f"env:{k}")
        if p is None or p.value != v:
            out.append(f"{svc.host}/{svc.name} env {k}={v!r}: explain says {p and p.value!r}")
    if any(p.key == "mpi:launch" for p in svc.provenance) or any(p.key == "mpi:sshd" for p in svc.provenance):
        return out  # the launcher's own flags are one record (its whole mpirun line)
    argv = list(svc.argv)
    head = len(prov["launch"].value.split()) if "launch" in prov else 0  # the program: one record
    flags = [t for t in argv if t.startswith("-")]
    for i, tok in enumerate(argv):
        if i < head or not tok.startswith("-") or flags.count(tok) > 1:
            continue
        value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
        p = prov.get(tok)
        if p is None:
            out.append(f"{svc.host}/{svc.name} {tok}: no record")
        elif p.value != value and not (value and p.value and tok.startswith("-") and "=" in tok):
            out.append(f"{svc.host}/{svc.name} {tok} {value!r}: explain says {p.value!r}")
    return out


# the variants the rules accept (a refused one has no services; its problems are its plan snapshot)
CASES = [c for c in render_matrix.cases() if render_matrix.valid(*c)]


def test_the_provenance_cases_cover_every_feature():
    assert {v for _, v, _, _ in CASES} >= {"edge", "vip", "internal-tls", "monitor", "disagg", "planner",
                                           "trtllm-dynamo", "trtllm-dynamo-tls", "docker-tls"}


@pytest.mark.parametrize("inventory,variant,env,data", CASES, ids=[f"{i}--{v}" for i, v, _, _ in CASES])
def test_every_flag_and_env_value_has_its_true_provenance(inventory, variant, env, data, monkeypatch):
    plan = _plan(inventory, env, monkeypatch, **data)
    wrong = [w for h in plan.hosts for s in h.services for w in _untrue(s)]
    assert wrong == []


def test_the_edges_second_frontend_port_is_explained_as_the_edges(monkeypatch):
    plan = _plan("testbed", m3_edge=True, m3_edge_frontends=2)
    fe1 = plan.host("m3tb-1").service("m3-frontend-1")
    p = _prov(fe1)["--http-port"]
    assert (p.value, fe1.argv[fe1.argv.index("--http-port") + 1]) == ("8001", "8001")
    assert "m3_edge_frontends" in p.setting and "+ 1" in p.setting and fe1.frontend_index == 1
    text = render_text(plan, "m3tb-1", explain=True)
    assert "--http-port" in text and "8001" in text and "m3_edge_frontends: frontend 1" in text


def test_nats_server_under_internal_tls_is_explained_as_tls(monkeypatch):
    plan = _plan("testbed", m3_internal_tls=True)
    for h in plan.hosts:
        for s in h.services:
            env = dict(s.env)
            if "NATS_SERVER" in env:
                assert env["NATS_SERVER"].startswith("tls://"), s.name
                p = _prov(s)["env:NATS_SERVER"]
                assert p.value == env["NATS_SERVER"] and "m3_internal_tls" in p.setting
                assert s.launcher and s.tls  # the launcher is a decision of the builder, not read from its files


def test_a_data_value_is_credited_to_data_not_group_data(monkeypatch):
    plan = _plan("h200", m3_max_model_len=65536, m3_extra_args=["--foo", "1"])
    w = plan.hosts[0].services[0]
    prov = _prov(w)
    assert (prov["--max-model-len"].value, prov["--max-model-len"].source) == ("65536", "--data")
    assert prov["--foo"].source == "--data"
    # a value from group_data names its file, and a layer's placeholder names the setting behind it
    assert "m3_parallel = 'tp8-ep' (group_data/h200.py)" == prov["--tensor-parallel-size"].setting


def test_a_host_level_value_names_the_hosts_own_value_and_file(monkeypatch):
    plan = _plan("testbed")
    fe = plan.host("m3tb-1").service("m3-frontend")
    p = _prov(fe)["env:DYN_TCP_RPC_HOST"]
    assert p.value == "10.77.0.11" and p.setting == "m3_address = '10.77.0.11' (inventories/testbed.py)"
    w = plan.host("m3tb-2").service("m3-worker@0")
    assert _prov(w)["env:DYN_SYSTEM_HOST"].setting == "m3_address = '10.77.0.12' (inventories/testbed.py)"


def test_every_flag_of_a_disaggregated_pool_names_its_pool(monkeypatch):
    disagg = {"prefill": {"workers": 1, "args": ["--max-num-seqs", "8"], "env": {"POOL_X": "p"}},
              "decode": {"workers": 1, "unset": ["--num-gpu-blocks-override"]}}
    plan = _plan("testbed", {"M3_TESTBED_HOSTS": "m3tb-1,m3tb-2,m3tb-3"}, monkeypatch, m3_disagg=disagg)
    prefill, decode = plan.host("m3tb-2").service("m3-worker@0"), plan.host("m3tb-3").service("m3-worker@0")
    assert (prefill.pool, decode.pool) == ("prefill", "decode")
    pp, dp = _prov(prefill), _prov(decode)
    assert (pp["--max-num-seqs"].layer, pp["--max-num-seqs"].source) == ("cluster:m3_disagg.prefill", "--data")
    assert pp["env:POOL_X"].layer == "cluster:m3_disagg.prefill"
    gone = dp["--num-gpu-blocks-override"]
    assert gone.value is None and gone.layer == "cluster:m3_disagg.decode" and gone.key not in decode.argv
    for p in (pp["--disaggregation-mode"], pp["--bootstrap-ports"], dp["--disaggregation-mode"]):
        assert p.source.endswith("65-disagg.yaml") and "m3_disagg" in p.setting
    assert _untrue(prefill) == [] and _untrue(decode) == []
