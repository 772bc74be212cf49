"""The contract test: every flag, choice and env var of every rendered command of every shipped inventory, every
plan-snapshot variant and every platform matrix row (docs/PLATFORMS.md) is known to the pinned engine (tests/unit/engine_contract.py,
lists from scripts/extract_engine_flags.py); a wrong flag planted in recipe data makes it fail, naming the flag,
the engine's list and the layer file that set it."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import test_matrix
import test_plan_snapshots as snaps
from engine_contract import FLAGS_DIR, load, plan_problems, service_problems

from m3deploy.cli import load_plan
from m3deploy.core import catalog
from m3deploy.core.errors import ValidationError


def _snapshot_plan(inventory, variant):
    data = snaps.VARIANTS[variant]
    try:
        return load_plan(str(snaps.ROOT / "inventories" / f"{inventory}.py"),
                         [f"{k}={json.dumps(v)}" for k, v in data.items()], facts=False)
    except ValidationError:
        return None  # refused plans render nothing (their problems are the snapshot)


@pytest.fixture
def _testbed_state(monkeypatch):
    import m3deploy.testbed

    monkeypatch.setattr(m3deploy.testbed, "load_state", lambda *a, **k: snaps.TESTBED_STATE)
    monkeypatch.chdir(snaps.ROOT)


@pytest.mark.parametrize("inventory,variant", snaps.CASES, ids=[f"{i}{'--' + v if v else ''}" for i, v in snaps.CASES])
def test_snapshot_plans_known_to_engine(inventory, variant, _testbed_state):
    plan = _snapshot_plan(inventory, variant)
    assert plan is None or plan_problems(plan) == []


@pytest.mark.parametrize("row", test_matrix.ROWS, ids=lambda r: "-".join(r[:5] + [r[5].replace(", ", "+")]))
def test_matrix_rows_known_to_engine(row):
    assert plan_problems(test_matrix.row_plan(row)) == []


def test_every_list_names_its_source():
    files = sorted(FLAGS_DIR.glob("*.json"))
    assert files
    for f in files:
        d = json.loads(f.read_text())
        assert f.name == f"{d['package']}-{d['version']}.json"
        assert d.get("wheel") or d.get("commit"), f"{f.name}: names neither its wheel nor its source commit"
        assert all(p["sources"] and p["flags"] for p in d["parsers"].values()), f.name


def test_every_image_has_its_engine_list():
    """Each pinned image's engine version has an extracted list, so no plan escapes the check."""
    from engine_contract import PACKAGE

    for engine, pkg in PACKAGE.items():
        for entry in catalog.engines()[engine]["images"].values():
            load(pkg, str(entry["version"]))


def _planted(tmp_path, monkeypatch, layer: str):
    d = tmp_path / "recipes" / "layers"
    d.mkdir(parents=True)
    (d / "99-planted.yaml").write_text(layer)
    monkeypatch.setenv("M3DEPLOY_RECIPES", str(tmp_path / "recipes"))


def _row(platform, variant, parallel, engine, serving, features=""):
    return [platform, variant, parallel, engine, serving, features, ""]


def test_planted_wrong_flag_fails(tmp_path, monkeypatch):
    _planted(tmp_path, monkeypatch, "layers:\n  - name: planted\n    when: {engine: vllm}\n"
                                    "    args: {--tensor-paralel-size: '8'}\n")
    problems = plan_problems(test_matrix.row_plan(_row("h200", "bf16", "tp8", "vllm", "standalone")))
    assert len(problems) == 1, problems
    assert "--tensor-paralel-size is unknown to vllm-" in problems[0] and "99-planted.yaml" in problems[0]


def test_planted_wrong_choice_and_env_fail(tmp_path, monkeypatch):
    _planted(tmp_path, monkeypatch, "layers:\n  - name: planted\n    when: {engine: sglang}\n"
                                    "    env: {SGLANG_NOT_A_KNOB: '1'}\n"
                                    "    args: {--attention-backend: flashinfer_mla}\n")
    plan = test_matrix.row_plan(_row("b200", "bf16", "tp8-ep", "sglang", "standalone"))
    problems = plan_problems(plan)
    assert any("--attention-backend 'flashinfer_mla' is not a choice of sglang-" in p and "99-planted.yaml" in p
               for p in problems), problems
    assert any("env SGLANG_NOT_A_KNOB is not read by sglang" in p for p in problems), problems


def test_wrong_dynamo_parser_fails():
    """--dyn-tool-call-parser takes the runtime's names (dynamo._core.get_tool_parser_names()); validation refuses
    any but M3's, so the wrong one is put straight into a rendered worker here."""
    plan = test_matrix.row_plan(_row("gb200", "nvfp4", "tp4", "vllm", "dynamo", "eagle3-gqa, text-only"))
    hp = next(h for h in plan.hosts if any(s.kind == "worker" for s in h.services))
    svc = next(s for s in hp.services if s.kind == "worker")
    argv = list(svc.argv)
    argv[argv.index("--dyn-tool-call-parser") + 1] = "minimax_m4"
    problems = service_problems(plan, replace(svc, argv=tuple(argv)))
    assert len(problems) == 1 and "--dyn-tool-call-parser 'minimax_m4' is not a choice of ai-dynamo-1.6.1.json" \
        in problems[0], problems


# each engine under each serving mode on each NVIDIA platform, at the variant and size its recipe runs
PLATFORMS = (("h200", "bf16", "tp8"), ("b200", "bf16", "tp8"), ("b300", "mxfp8", "tp8"), ("gb200", "mxfp8", "tp4"))
COMBOS = [(p, v, par, e, s, f) for p, v, par in PLATFORMS
          for e, f in (("vllm", ""), ("sglang", ""), ("trtllm", "text-only")) for s in ("standalone", "dynamo")
          if not (e == "trtllm" and v != "bf16")]


@pytest.mark.parametrize("combo", COMBOS, ids=lambda c: "-".join(c[:5]))
def test_engine_combinations_known_to_engine(combo):
    assert plan_problems(test_matrix.row_plan(_row(*combo))) == []


def test_mpi_world_rank0_argv_is_checked_after_mpirun(_testbed_state):
    """The GB200 TensorRT-LLM-under-Dynamo worker (two trays, one MPI world: m3deploy.core.mpi): rank 0's argv is
    `mpirun ... trtllm-llmapi-launch python3 -m dynamo.trtllm ...`; its dynamo.trtllm flags are checked like any
    worker's (a wrong one planted after the launcher fails), and tray 2's sshd carries no engine flags."""
    plan = _snapshot_plan("gb200", "trtllm-dynamo")
    assert plan is not None and plan_problems(plan) == []
    head = plan.host("gb200-r01-t01").service("m3-worker@0")
    assert head.argv[0].endswith("/mpirun") and "trtllm-llmapi-launch" in head.argv
    assert plan.host("gb200-r01-t02").service("m3-worker@0").argv[0] == "/usr/sbin/sshd"
    argv = list(head.argv)
    argv[argv.index("--tensor-parallel-size")] = "--tp_size"  # trtllm-serve's spelling: dynamo.trtllm refuses it
    problems = service_problems(plan, replace(head, argv=tuple(argv)))
    assert len(problems) == 1 and "--tp_size is unknown to ai-dynamo-1.6.1.json" in problems[0], problems
