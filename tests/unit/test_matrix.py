"""docs/PLATFORMS.md's platform matrix (linked from the README) stays true: every row builds and validates, and every `golden` row has a
golden test for its combination."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from m3deploy.core import build as planmod
from m3deploy.core import inventory, settings

ROOT = Path(__file__).resolve().parents[2]


def rows():
    text = (ROOT / "docs" / "PLATFORMS.md").read_text()
    block = text[text.index("<!-- matrix:start -->"):text.index("<!-- matrix:end -->")]
    out = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("platform", "") or set(cells[0]) <= {"-"}:
            continue
        out.append(cells)
    return out


ROWS = rows()


def test_matrix_has_rows():
    assert len(ROWS) >= 20


def row_plan(row):
    """The plan of one matrix row: its hosts (GPUs per host of the platform) and, under Dynamo, a control host."""
    platform, variant, parallel, engine, serving, features, validated = row
    feats = [f.strip() for f in features.split(",") if f.strip()]
    kind, size, _ = settings.parse_parallel(parallel)
    gph = 1 if platform == "sim" else (4 if platform == "gb200" else 8)
    n = max(1, size // gph)
    data = {"m3_platform": platform, "m3_variant": variant, "m3_parallel": parallel, "m3_engine": engine,
            "m3_serving": serving, "m3_features": feats}
    if platform == "mi300x" and variant == "mxfp8":
        data["m3_max_model_len"] = 131072
    groups = {"workers": [(f"w{i}", {"m3_address": f"10.1.0.{10 + i}"}) for i in range(n)]}
    if serving == "dynamo":
        groups["control"] = [("c", {"m3_address": "10.1.0.2"})]
    return planmod.build(inventory.hosts_from_dict(groups, all_data=data))


@pytest.mark.parametrize("row", ROWS, ids=lambda r: "-".join(r[:5] + [r[5].replace(", ", "+")]))
def test_row_builds(row):
    p = row_plan(row)
    assert p.workers and all(w.services for w in p.workers)


def test_golden_rows_have_golden_tests():
    golden = (ROOT / "tests/unit/test_golden_seed.py").read_text()
    for platform, variant, parallel, engine, serving, features, validated in ROWS:
        if "golden" in validated:
            assert re.search(rf'worker\("{platform}"|"{platform}"', golden) or platform in golden, platform
