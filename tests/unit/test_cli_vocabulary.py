"""One option vocabulary (issue 36): every command that takes an INVENTORY takes --data, -v and -q (m3deploy.cli.options);
--host is repeatable and cumulative; validate has --json; `m3deploy deploy` runs exactly the pyinfra command it
prints; the help names deploy, re-run, teardown and prune and cuts no summary; `status` works in a pipe; counts in
messages are in the right number."""
from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.core.errors import plural

ROOT = Path(__file__).resolve().parents[2]
M3DEPLOY = [sys.executable, "-m", "m3deploy.cli"]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
LONG = "a-host-with-a-name-long-enough-to-pass-80-columns"


def run(*args, **kw):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, **kw)


def commands():
    """Every command, a group's as `group sub` too (export k8s, testbed up, ...)."""
    ctx = click.Context(main)
    out = {}
    for name in main.list_commands(ctx):
        cmd = out[name] = main.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            out.update({f"{name} {sub}": cmd.get_command(ctx, sub) for sub in cmd.list_commands(ctx)})
    return out


def takes_inventory(cmd) -> bool:
    return any(isinstance(p, click.Argument) and p.name == "inventory" for p in cmd.params)


def write_inventory(path: Path, workers: int = 2) -> None:
    """A sim inventory: 1 control host and `workers` worker hosts on loopback addresses where nothing listens,
    names long enough to pass 80 columns in a table, SSH to a closed port."""
    d = {"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo", "m3_parallel": "tp1", "ssh_port": 1}

    def host(name, i):
        return (name, {**d, "m3_address": f"127.0.0.{i}", "ssh_hostname": f"127.0.0.{i}"})
    path.write_text(f"control = {[host(f'ctl-{LONG}', 1)]!r}\n"
                    f"workers = {[host(f'w{i}-{LONG}', i + 1) for i in range(1, workers + 1)]!r}\n")


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """write_inventory's 1 + 2 hosts as inventories/pipelab.py, run from its own directory (no group_data of the
    repository)."""
    (tmp_path / "inventories").mkdir()
    write_inventory(tmp_path / "inventories" / "pipelab.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    monkeypatch.setitem(ENV, "M3DEPLOY_CONFIG", str(tmp_path / "config"))
    return "inventories/pipelab.py"


# ------------------------------------------------------------------------------------------- the vocabulary
def test_every_inventory_command_takes_data_verbose_and_quiet():
    cmds = {n: c for n, c in commands().items() if takes_inventory(c)}
    assert {"plan", "validate", "deploy", "preflight", "verify", "render", "status", "prune", "bench", "certs",
            "export k8s", "export slurm"} <= set(cmds)
    for name, cmd in cmds.items():
        opts = {o for p in cmd.params for o in p.opts}
        assert {"--data", "-v", "-q"} <= opts, f"m3deploy {name} lacks {sorted({'--data', '-v', '-q'} - opts)}"
        data = next(p for p in cmd.params if p.name == "data")
        assert data.multiple, f"m3deploy {name}: --data is not repeatable"
        host = next((p for p in cmd.params if "--host" in p.opts), None)
        if host is not None and name != "verify":  # verify: one --host (its checks take one host)
            assert host.multiple, f"m3deploy {name}: --host is not repeatable"


@pytest.mark.parametrize("name", ["plan", "validate", "preflight", "verify", "render", "status", "prune"])
def test_json_where_a_command_has_a_result(name):
    assert "--json" in {o for p in commands()[name].params for o in p.opts}


def test_plan_host_is_cumulative():
    r = run("plan", "inventories/gb200.py", "--host", "gb200-r01-t01", "--host", "gb200-r01-t02")
    assert r.exit_code == 0, r.output
    assert "## gb200-r01-t01" in r.output and "## gb200-r01-t02" in r.output and "## gb200-ctl-01" not in r.output
    doc = json.loads(run("plan", "inventories/gb200.py", "--json", "--host", "gb200-ctl-01", "--host",
                         "gb200-r01-t02").output)
    assert sorted(doc["hosts"]) == ["gb200-ctl-01", "gb200-r01-t02"]


def test_validate_json_valid_and_invalid(lab):
    r = run("validate", lab, "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["valid"] is True and doc["problems"] == [] and (doc["hosts"], doc["workers"]) == (3, 2)
    r = run("validate", lab, "--json", "--data", "m3_parallel=tp9")
    assert r.exit_code == 2
    doc = json.loads(r.output)
    assert doc["valid"] is False and any("m3_parallel" in p for p in doc["problems"])


def test_preflight_takes_data_as_the_plan_does(lab):
    """--data reaches the plan preflight checks against (an invalid value is refused before any host)."""
    r = run("preflight", lab, "--data", "m3_parallel=tp9")
    assert r.exit_code != 0 and "m3_parallel" in r.output


def test_verbose_names_the_files_and_quiet_prints_no_summary(lab, tmp_path):
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "workers.py").write_text("m3_readiness_timeout_s = 200\n")
    r = CliRunner().invoke(main, ["validate", "-v", lab], catch_exceptions=False)
    assert r.exit_code == 0
    assert "group_data/workers.py" in r.stderr and "inventories/pipelab.py" in r.stderr and "cluster pipelab" in r.stderr
    assert "valid (3 hosts, 2 workers," in r.stdout  # the summary stays on stdout, the -v line on stderr
    q = run("validate", "-q", lab)
    assert q.exit_code == 0 and q.output == ""
    assert run("validate", "-q", lab, "--data", "m3_parallel=tp9").exit_code == 2


# ------------------------------------------------------------------------------------------------- deploy
def test_deploy_runs_exactly_the_pyinfra_command_it_prints(lab):
    """The first line is the command; running that line by hand gives the same output and exit status."""
    ours = subprocess.run(M3DEPLOY + ["deploy", lab, "--data", "m3_readiness_timeout_s=30"], capture_output=True,
                          text=True, env=ENV, timeout=120)
    first, rest = ours.stdout.split("\n", 1)
    assert first == (f"cd {shlex.quote(str(ROOT))} && pyinfra -y {Path(lab).resolve()} deploy.py "
                     "--data m3_readiness_timeout_s=30")
    assert "--> Loading inventory..." in ours.stderr  # pyinfra's own output follows
    pyinfra_dir = os.path.dirname(sys.executable)
    by_hand = subprocess.run(["bash", "-c", first], capture_output=True, text=True, timeout=120,
                             env={**ENV, "PATH": pyinfra_dir + os.pathsep + ENV["PATH"]})
    assert ours.returncode == by_hand.returncode != 0  # no host answers on port 1
    assert rest == by_hand.stdout
    # the same lines: pyinfra connects to the hosts concurrently, so their "Could not connect" lines come in any order
    assert sorted(ours.stderr.splitlines()) == sorted(by_hand.stderr.splitlines())


def test_deploy_from_the_project_directory_prints_the_plain_command(monkeypatch):
    from m3deploy.cli.deploy import pyinfra_argv, shown

    monkeypatch.chdir(ROOT)
    argv = pyinfra_argv("inventories/h200.py", ["m3_state=absent"], verbose=2)
    assert shown(argv, ROOT) == "pyinfra -y inventories/h200.py deploy.py --data m3_state=absent -vv"


# --------------------------------------------------------------------------------------------------- help
def test_help_names_deploy_rerun_teardown_and_prune_and_cuts_no_summary():
    out = subprocess.run(M3DEPLOY + ["--help"], capture_output=True, text=True, env=ENV, check=True).stdout
    for text in ("m3deploy deploy inventories/mylab.py", "pyinfra -y INVENTORY deploy.py", "Re-run",
                 "--data m3_state=absent", "m3deploy prune inventories/mylab.py --yes"):
        assert text in out, text
    groups = [out, subprocess.run(M3DEPLOY + ["testbed", "--help"], capture_output=True, text=True, env=ENV,
                                  check=True).stdout]
    for text in groups:
        listing = text.split("Commands:", 1)[1].splitlines()
        assert listing and not [ln for ln in listing if ln.rstrip().endswith("...")], listing
        assert all(len(ln) <= 80 for ln in text.splitlines()), [ln for ln in text.splitlines() if len(ln) > 80]
    deploy = run("deploy", "--help").output
    assert "m3_state=absent" in deploy and "m3deploy prune" in deploy


# ----------------------------------------------------------------------------------------------- in a pipe
def test_status_in_a_pipe_is_not_cut_at_80_columns(lab):
    r = subprocess.run(M3DEPLOY + ["status", lab, "--source", "direct"], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 1, r.stderr  # nothing answers: down
    assert f"w1-{LONG}/m3-worker@0" in r.stdout and f"ctl-{LONG}/m3-frontend" in r.stdout, r.stdout
    assert "…" not in r.stdout and "\x1b[" not in r.stdout  # no cut cell, no colour codes in a pipe


def test_status_watch_in_a_pipe_prints_each_refresh(lab):
    # Ctrl-C's SIGINT stops it; SIGINT's default action restored in the child, as a shell started in the
    # background (`.ci/run &`) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
    p = subprocess.Popen(M3DEPLOY + ["status", lab, "--source", "direct", "--watch", "--interval", "0.5"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while seen.count("m3deploy status pipelab") < 2 and time.monotonic() < deadline:
            if select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
                seen += os.read(p.stdout.fileno(), 65536).decode()
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(30)
    assert seen.count("m3deploy status pipelab") >= 2, seen


# -------------------------------------------------------------------------------------------------- grammar
def test_counts_are_in_the_right_number(lab):
    assert [plural(0, "host"), plural(1, "host"), plural(2, "host"), plural(2, "process", "processes")] == \
        ["0 hosts", "1 host", "2 hosts", "2 processes"]
    write_inventory(Path("inventories/one.py"), workers=1)
    r = run("validate", "inventories/one.py")
    assert r.exit_code == 0, r.output
    assert "(2 hosts, 1 worker, " in r.output and "1 workers" not in r.output
    r = CliRunner().invoke(main, ["validate", "inventories/one.py", "--data", "m3_readiness_timeout_s=-1"])
    assert r.exit_code == 2 and "invalid cluster plan (1 problem):" in r.stderr, r.stderr
    r = CliRunner().invoke(main, ["validate", "inventories/one.py", "--data", "m3_parallel=tp2"])
    assert "1 host does not divide into whole tp2 workers of 2 hosts (1 GPU each)" in r.stderr, r.stderr
