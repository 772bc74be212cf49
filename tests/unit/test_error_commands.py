"""Every `m3deploy ...` command that product code tells a user to run exists (round 1's wheelhouse error told
users to run `m3deploy artifacts wheelhouse`, which did not exist). Checked against the real click CLI."""
from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from m3deploy.cli import main

ROOT = Path(__file__).resolve().parents[2]
# a command in backticks, or after "Fix:" / "run" / "rebuild with"
MENTION = re.compile(r"(?:`|Fix: |[Rr]un |rebuild with )m3deploy ((?:testbed )?[a-z][a-z-]*)")


def mentioned() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for path in [*ROOT.glob("m3deploy/**/*.py"), *ROOT.glob("roles/*.py"), ROOT / "deploy.py"]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in MENTION.finditer(line):
                out.setdefault(m[1], []).append(f"{path.relative_to(ROOT)}:{n}")
    return out


def test_every_command_named_in_a_message_exists():
    found = mentioned()
    assert "artifacts" in found and "save-images" in found  # the scan sees real messages
    runner = CliRunner()
    missing = {}
    for cmd, where in found.items():
        res = runner.invoke(main, [*cmd.split(), "--help"])
        if res.exit_code != 0:
            missing[cmd] = where
    assert not missing, f"messages name commands that do not exist: {missing}"
