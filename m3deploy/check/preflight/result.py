"""A preflight check's result (m3deploy.check.preflight and its kvfabric module both make them)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
