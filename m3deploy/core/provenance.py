"""Provenance records for the values a builder sets itself (`m3deploy plan --explain`): every flag of an argv with
the value after it, every env value, the program a service runs. Recipe values carry theirs from
m3deploy.core.recipes; these are for the rest (etcd, NATS, the edge, keepalived, the exporters, the planner)."""
from __future__ import annotations

from collections.abc import Mapping

from m3deploy.core.model import Provenance


def provenance(argv, env, layer: str, source: str, settings: Mapping[str, str] | None = None,
               ) -> tuple[Provenance, ...]:
    """A record for every flag of `argv` (with the value after it) and every env value, from `layer`;
    `settings`: flag or env name -> the setting it comes from."""
    settings = settings or {}
    out = []
    for i, tok in enumerate(argv):
        if tok.startswith("-"):
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
            out.append(Provenance(tok, value, layer, source, settings.get(tok, "")))
    out += [Provenance(f"env:{k}", v, layer, source, settings.get(k, "")) for k, v in env]
    return tuple(out)


def launch_provenance(head, layer: str, source: str, setting: str = "") -> tuple[Provenance, ...]:
    """The program a service runs (its argv before the first flag)."""
    return (Provenance("launch", " ".join(head), layer, source, setting),) if head else ()
