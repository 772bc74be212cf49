"""roles/weights.py fan-out (m3_weights_source = controller | mirror:<host>), planned with the @fake connector:
one op per round on every weights host, the exact rsync/ssh commands, the transfer key's modes, and no secret in
any command. rrsync -ro: Debian bookworm's rsync 3.2.7+ ships /usr/bin/rrsync (seen on the testbed: rsync
3.5.0+ds1-0+deb12u1); its `-ro` "Allow only reading from the DIR. Implies -no-del and -no-lock"."""
from __future__ import annotations

import shlex

import pytest
from pyinfra.facts.files import File
from pyinfra.facts.server import Command

from m3deploy.core.model import ModelRepo
from roles import weights
from tests.deploy.test_gpu_roles import MODEL, cplan, hplan

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfTheSender"
NAMES = ["g1", "g2", "g3", "g4"]


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("M3DEPLOY_CONFIG", str(tmp_path / "config"))
    monkeypatch.setenv("M3DEPLOY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


def cluster(source="controller", done=(), fanout=1, mock=1, cache=None, repos=None):
    hps = [hplan(n, address=f"10.0.0.{11 + i}") for i, n in enumerate(NAMES)]
    cp = cplan(*hps, **({"repos": repos} if repos else {}), m3_weights_source=source, m3_weights_fanout=fanout,
               m3_mock_repo_mb=mock or None, m3_weights_controller_cache=cache)
    data = {"ssh_user": "root", "ssh_key": "/home/op/.ssh/id_ed25519", "ssh_known_hosts_file": "/home/op/kh"}
    hosts = {n: {"host_data": {**data, "ssh_hostname": h.address},
                 "facts": {File: (lambda path, n=n: {"mode": 644} if (n in done and ".m3-complete-" in path)
                                  or path == weights.TRANSFER_KEY else None),
                           Command: HOST_KEY}} for n, h in zip(NAMES, hps)}
    return cp, hosts


def test_controller_tree_rounds_commands_and_keys(fake, env):
    cp, hosts = cluster()
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    rounds = {n: [o for o in run.for_host(n) if o.name.startswith("Model weights | Weights round")] for n in NAMES}
    # ceil(log2(4 + 1)): one op per round on every host, from one call site (under pyinfra's CLI that makes it
    # one op of every host, finished everywhere before the next round: tests/e2e/test_weights_fanout_testbed.py)
    assert all([o.name.split(" | ")[-1].split(":")[0] for o in r] == [f"Weights round {i}/3" for i in (1, 2, 3)]
               for r in rounds.values())

    # round 1: the controller pushes to g1; round 2: controller -> g2, g1 -> g3; round 3: controller -> g4
    assert [c for c in rounds["g1"][0].commands if c.startswith("PYTHON")] == ["PYTHON _push", "PYTHON log"]
    assert rounds["g1"][1].commands == [] and rounds["g3"][0].commands == []
    hub = "/var/lib/m3/hf/hub"
    folder = f"{hub}/models--MiniMaxAI--MiniMax-M3/"
    pull = rounds["g3"][1].commands[0]
    commit = _commit(run, cp)
    snap = env / "cache" / "mock-hf" / "hub" / "models--MiniMaxAI--MiniMax-M3" / "snapshots" / commit
    blobs = sorted(p.resolve().name for p in snap.iterdir())
    only = ["--include=/refs/", "--include=/refs/main", "--include=/snapshots/", f"--include=/snapshots/{commit}/***",
            "--include=/blobs/", *(f"--include=/blobs/{b}" for b in blobs), "--exclude=*"]
    assert len(blobs) == 6  # config, generation_config, tokenizer.json, tokenizer_config.json, index, 1 shard
    assert shlex.split(pull) == [
        "flock", "-w", "21600", f"{hub}/.m3-weights.lock", "rsync", "-a", "--partial-dir=.m3-partial",
        "--exclude=*.incomplete", "--exclude=.m3-partial", *only, "-e",
        "ssh -i /etc/m3/weights_transfer_key -o IdentitiesOnly=yes -o BatchMode=yes "
        "-o UserKnownHostsFile=/etc/m3/weights_known_hosts -o StrictHostKeyChecking=yes",
        "root@10.0.0.11:models--MiniMaxAI--MiniMax-M3/", folder]
    check = rounds["g3"][1].commands[1]
    assert f"python3 - {hub} {MODEL}@main:target" in check and check.endswith(
        f"touch /var/lib/m3/hf/.m3-complete-MiniMaxAI--MiniMax-M3--{_commit(run, cp)}")

    # only g1 serves (to g3): its authorized_keys entry is read-only rrsync, from the cluster's addresses only
    allow = [o for o in run.for_host("g1") if any("authorized_keys" in c for c in o.commands)]
    assert len(allow) == 2 and not any("authorized_keys" in c for n in NAMES[1:] for o in run.for_host(n)
                                       for c in o.commands)  # add, then remove after the last round
    public = (env / "config" / "t" / "weights_transfer_ed25519.pub").read_text().strip()
    entry = (f'restrict,from="10.0.0.11,10.0.0.12,10.0.0.13,10.0.0.14",command="/usr/bin/rrsync -ro {hub}" '
             f'{public}')
    assert shlex.quote(entry) in allow[0].commands[1]
    assert "grep -v -F -e ' m3deploy-weights-t'" in allow[1].commands[0]

    # the private key: only g3 pulls from a host; delivered root-only 0600, pinned sender keys, removed after
    key = env / "config" / "t" / "weights_transfer_ed25519"
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    up = next(o for o in run.for_host("g3") if "UPLOAD /etc/m3/weights_transfer_key" in o.commands)
    assert "UPLOAD /etc/m3/weights_transfer_key" in up.commands
    assert "chmod 600 /etc/m3/weights_transfer_key" in up.commands
    assert "chown root:root /etc/m3/weights_transfer_key" in up.commands
    pin = next(o for o in run.for_host("g3") if "/etc/m3/weights_known_hosts" in o.uploads)
    assert pin.uploads == {"/etc/m3/weights_known_hosts": f"10.0.0.11 {HOST_KEY}\n"}
    assert run.for_host("g3")[-1].commands == ["rm -f /etc/m3/weights_transfer_key"]
    assert not any("UPLOAD /etc/m3/weights_transfer_key" in o.commands for n in ("g1", "g2", "g4")
                   for o in run.for_host(n))  # the controller pushes to them over the inventory's SSH

    secret = key.read_text()
    body = "".join(secret.splitlines()[1:-1])
    for n in NAMES:
        for o in run.for_host(n):
            text = " ".join(o.commands + o.names) + "".join(o.uploads.values())
            assert body[:40] not in text, f"private key material in {o.name}"


def _commit(run, cp):
    from m3deploy.controller import mockrepos

    return mockrepos._commit(MODEL, 1, 1, 0, True, {}, "main")


def test_controller_push_argv(env):
    data = {"ssh_user": "root", "ssh_hostname": "10.0.0.12", "ssh_port": 2222, "ssh_key": "/home/op/key",
            "ssh_known_hosts_file": "/home/op/kh"}
    argv = weights.push_argv("/c/hub/models--A--B", "/var/lib/m3/hf", "A/B", data, "g2")
    assert argv == [
        "rsync", "-a", "--partial-dir=.m3-partial", "--exclude=*.incomplete", "--exclude=.m3-partial", "-e",
        "ssh -i /home/op/key -p 2222 -o UserKnownHostsFile=/home/op/kh -o StrictHostKeyChecking=yes "
        "-o BatchMode=yes",
        "--rsync-path=mkdir -p /var/lib/m3/hf/hub && flock -w 21600 /var/lib/m3/hf/hub/.m3-weights.lock rsync",
        "/c/hub/models--A--B/", "root@10.0.0.12:/var/lib/m3/hf/hub/models--A--B/"]
    v6 = weights.push_argv("/c/x", "/var/lib/m3/hf", "A/B", {**data, "ssh_hostname": "fd00::12"}, "g2")
    assert v6[-1] == "root@[fd00::12]:/var/lib/m3/hf/hub/models--A--B/"


def test_rerun_with_every_host_complete_has_no_ops(fake, env):
    cp, hosts = cluster(done=set(NAMES))
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    assert all(run.for_host(n) == [] for n in NAMES)


def test_only_missing_hosts_are_scheduled(fake, env):
    cp, hosts = cluster(done={"g1", "g2", "g3"}, fanout=4)
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    rounds = [o for o in run.for_host("g4") if "Weights round" in o.name]
    assert len(rounds) == 1 and "PYTHON _push" in rounds[0].commands
    assert not any("authorized_keys" in c for n in NAMES for o in run.for_host(n) for c in o.commands)


def test_mirror_downloads_once_then_serves(fake, env):
    cp, hosts = cluster(source="mirror:g2", mock=0, fanout=2)
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    def downloads(n):
        return [c for o in run.for_host(n) for c in o.commands if " download " in c]

    assert len(downloads("g2")) == 1 and downloads("g2")[0].endswith(f"download {MODEL}")
    assert all(downloads(n) == [] for n in ("g1", "g3", "g4"))
    r1 = {n: next(o for o in run.for_host(n) if "Weights round 1/" in o.name).commands for n in NAMES}
    assert r1["g2"] == [] and "root@10.0.0.12:models--MiniMaxAI--MiniMax-M3/" in r1["g1"][0]
    assert "root@10.0.0.12:" in r1["g3"][0] and r1["g4"] == []  # degree 2: g2 serves g1, g3; then g4
    assert any("rrsync -ro" in c for o in run.for_host("g2") for c in o.commands)


def test_hub_source_downloads_everywhere(fake, env):
    cp, hosts = cluster(source="hub", mock=0)
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    assert all(any(" download " in c for o in run.for_host(n) for c in o.commands) for n in NAMES)
    assert not any("rsync" in c for n in NAMES for c in (x for o in run.for_host(n) for x in o.commands))


def test_two_repos_share_the_rounds(fake, env):
    cp, hosts = cluster(repos=(ModelRepo(MODEL, "target", "m3_model_id"),
                               ModelRepo("Inferact/MiniMax-M3-EAGLE3", "draft", "--speculative-config")))
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    r2 = next(o for o in run.for_host("g3") if "Weights round 2/" in o.name)
    assert [c.split()[-1] for c in r2.commands if c.startswith("flock")] == [
        "/var/lib/m3/hf/hub/models--MiniMaxAI--MiniMax-M3/", "/var/lib/m3/hf/hub/models--Inferact--MiniMax-M3-EAGLE3/"]


def test_controller_downloads_a_missing_repo_once_then_checks_it(fake, env, monkeypatch):
    """m3_weights_source=controller without mock repos: the controller's cache lacks the repo, so it is downloaded
    there (huggingface_hub.snapshot_download, stood in for here by a writer of the same cache layout: this
    machine has no hub) once for all hosts, checked against its index, then fanned out."""
    import huggingface_hub

    from m3deploy.controller import mockrepos

    calls = []

    def download(repo_id, revision, cache_dir, token):
        calls.append((repo_id, revision, cache_dir, token))
        mockrepos.make_repo(cache_dir, repo_id, size_mb=0.1, shards=1)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    cache = env / "hf"
    cp, hosts = cluster(mock=0, cache=str(cache))
    run = fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
    assert calls == [(MODEL, "main", str(cache / "hub"), None)]
    assert "PYTHON _push" in next(o for o in run.for_host("g1") if "Weights round 1/" in o.name).commands


def test_controller_cache_incomplete_after_download_stops_with_the_fix(fake, env, monkeypatch):
    import huggingface_hub

    from m3deploy.core.errors import M3Error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: None)  # wrote nothing
    cp, hosts = cluster(mock=0, cache=str(env / "hf"))
    with pytest.raises(M3Error, match=r"MiniMaxAI/MiniMax-M3 is not complete in .*hf/hub.*Fix: `HF_HOME="):
        fake(weights.deploy_weights, cluster_plan=cp, hosts=hosts)
