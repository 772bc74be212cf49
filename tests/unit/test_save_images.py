"""`m3deploy save-images`: what an air-gapped deploy loads. Docker cannot run here (no registry, no daemon), so
a stand-in `docker` on PATH records its argv and writes the archive; the roles' loading side is tested in
tests/deploy (m3_image_archive_dir)."""
from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from m3deploy.cli import main
from m3deploy.controller.images import image_archive_name
from m3deploy.core import inventory

ROOT = Path(__file__).resolve().parents[2]


def fake_docker(tmp_path) -> Path:
    log = tmp_path / "docker.log"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                                 "if [ \"$1\" = save ]; then echo archive > \"$4\"; fi\n")
    (bin_ / "docker").chmod(0o755)
    return log


def test_saves_base_images_of_dynamo_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    log = fake_docker(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "images"
    r = CliRunner().invoke(main, ["save-images", "inventories/gb200.py", str(out)])
    assert r.exit_code == 0, r.output
    base = ("vllm/vllm-openai:nightly-5555a2d8f7116b2b4877f66516f4128176cf722a"
            "@sha256:8896fd7b29fc4ee7ce839f146cb4757984c476ec79d0234ffa8c995dee6e339a")
    assert log.read_text().splitlines() == [f"pull {base}", f"save {base} -o {out / ('.' + image_archive_name(base))}.{os.getpid()}.part"]
    assert (out / image_archive_name(base)).read_text() == "archive\n"
    assert f"--data m3_image_archive_dir={out}" in r.output
    # again: nothing to do
    r = CliRunner().invoke(main, ["save-images", "inventories/gb200.py", str(out)])
    assert "already saved" in r.output and len(log.read_text().splitlines()) == 2


def test_no_docker_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = CliRunner().invoke(main, ["save-images", "inventories/h200.py", str(tmp_path / "x")])
    assert r.exit_code == 2 and "needs the docker CLI" in r.output


def test_testbed_plan_has_no_images(tmp_path, monkeypatch):
    from m3deploy.controller.images import images_to_save
    from m3deploy.core import build as planmod
    hosts = inventory.hosts_from_dict({"control": [("c", {"m3_address": "10.0.0.1"})],
                                     "workers": [("w", {"m3_address": "10.0.0.2"})]},
                                    all_data={"m3_platform": "sim", "m3_engine": "mocker", "m3_serving": "dynamo",
                                              "m3_parallel": "tp1"})
    assert images_to_save(planmod.build(hosts)) == []
