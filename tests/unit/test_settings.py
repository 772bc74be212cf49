"""m3deploy.core.settings is the one place every m3_* key is declared, with its type, default and doc."""
from __future__ import annotations

import re
from pathlib import Path

from m3deploy.core import settings

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = [ROOT / "deploy.py", *(ROOT / "m3deploy").rglob("*.py"), *(ROOT / "roles").rglob("*.py"),
           *(ROOT / "m3deploy" / "core" / "data").rglob("*.yaml"), *(ROOT / "templates").glob("*.j2")]
NOT_KEYS = {"m3_features_effective", *settings.RENAMED}  # what the plan records; replaced keys (refused)


def test_every_key_read_is_declared():
    read = {m.group(0): p.relative_to(ROOT) for p in PRODUCT
            for m in re.finditer(r"\bm3_[a-z0-9_]*[a-z0-9]\b", p.read_text())}
    assert {k: str(p) for k, p in read.items() if k not in settings.KEYS and k not in NOT_KEYS} == {}


def test_every_key_has_a_type_and_a_doc():
    for k in settings.KEYS.values():
        assert k.doc and k.type, k.name
        assert k.default is None or isinstance(k.default, k.type), k.name


def test_get_defaults_only_what_is_not_set():
    assert settings.get({}, "m3_rocm_version") is None
    assert settings.get({}, "m3_amdgpu_usecase") == "dkms,rocm"
    assert settings.get({"m3_allow_reboot": False}, "m3_allow_reboot") is False
    assert settings.get({"m3_frontend_port": 9000}, "m3_frontend_port") == 9000
