"""The README is an entry point (issue 36): at most 150 lines, the two set-up commands first, links that resolve,
and figures that agree with their results files (docs/FIGURES.md: every number of a figure is in the file it cites;
every number of the README's figures is in docs/FIGURES.md)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIGURES = (ROOT / "docs" / "FIGURES.md").read_text()
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def test_readme_is_short_and_opens_with_the_two_commands():
    assert len(README.splitlines()) <= 150
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert README.index("## Set-up: the two commands") < README.index("## Your own cluster, step by step")


def test_readme_names_the_steps_and_the_features_a_newcomer_looks_for():
    for text in ("pyinfra -y inventories/mylab.py deploy.py", "m3deploy validate", "m3deploy verify", "m3deploy prune",
                 "--data m3_state=absent", "gb200_disagg", "m3_planner", "m3_internal_tls", "Debian 12",
                 "Ubuntu 24.04", "as root"):
        assert text in README, text


def test_every_link_of_the_readme_and_the_figures_resolves():
    for doc, base in ((README, ROOT), (FIGURES, ROOT / "docs")):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", doc):
            if not target.startswith("http"):
                assert (base / target).exists(), target
        for path in re.findall(r"(benchmarks/results/[\w./-]+\.md|tests/fixtures/[\w./-]+\.txt)", doc):
            assert (ROOT / path).exists(), path


def test_each_figure_is_in_its_results_file():
    rows = [line for line in FIGURES.splitlines() if line.startswith("| ") and "results file" not in line]
    assert len(rows) >= 10
    for row in rows:
        what, figure, files = [c.strip() for c in row.strip("|").split("|")]
        paths = re.findall(r"([\w./-]+\.(?:md|txt))", files)
        base = None
        texts = []
        for p in paths:
            full = ROOT / p if "/" in p and (ROOT / p).exists() else (ROOT / base / p if base else ROOT / p)
            assert full.exists(), (what, p)
            base = str(Path(p).parent) if "/" in p else base
            texts.append(full.read_text())
        missing = [n for n in NUMBER.findall(figure) if not any(n in t for t in texts)]
        assert not missing, f"{what}: {missing} not in {paths}"


def test_the_readmes_figures_are_the_figures_pages():
    section = README[README.index("## Figures"):README.index("## How it is built")]
    prose = re.sub(r"benchmarks/results/\S+|docs/\S+|\d{4}-\d{2}-\d{2}", "", section)
    missing = [n for n in NUMBER.findall(prose) if n not in FIGURES]
    assert not missing, missing
