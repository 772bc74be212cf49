"""A shrinking plan (fewer ranks on a host, a service no longer planned there, a new Dynamo venv): what the host's
previous manifest (/etc/m3/manifest.json) names that the new one does not. roles/manifest.py removes exactly that,
through the teardown's operations (roles/teardown.remove), before it writes the new manifest: a run that stops
half-way leaves the old manifest, and the next run finds the same leftovers.

Pure: both manifests already checked entry by entry (hostfiles.read_manifest / checked_manifest, the confinement
rules of hostfiles.removal_problem), and every rollback copy added here is checked by the same rule.
"""
from __future__ import annotations

import posixpath

from m3deploy.deploy.hostfiles import MANIFEST_KEYS, ROLLBACK_DIR, removal_problem

PATH_KEYS = ("files", "links", "dirs", "caches", "venvs", "empty_dirs")


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def leftovers(old: dict, new: dict) -> dict[str, list[str]]:
    """Per manifest key, the entries of `old` that `new` does not name. A path that is, or holds, one the new
    manifest names stays (a directory kept for a file of the new plan). A leftover unit or env file's rollback
    copy (ROLLBACK_DIR/<name>, roles/lifecycle.keep_previous: env files hold secrets) goes with it."""
    keep = [p for k in PATH_KEYS for p in new.get(k, [])]
    out: dict[str, list[str]] = {}
    for key in MANIFEST_KEYS:
        have = set(new.get(key, []))
        items = [e for e in old.get(key, []) if e not in have]
        if key in PATH_KEYS:
            items = [e for e in items if not any(_inside(p, e) for p in keep)]
        out[key] = items
    if ROLLBACK_DIR in new.get("dirs", []):
        copies = [f"{ROLLBACK_DIR}/{posixpath.basename(f)}" for f in out["files"]]
        out["files"] += [c for c in copies if c not in out["files"] and not removal_problem("files", c)]
    return out


GENERATION_KEYS = ("venvs", "images")  # what a worker generation runs from (core/generation.py)


def keep_previous_generation(gone: dict[str, list[str]], new: dict) -> tuple[dict[str, list[str]], dict]:
    """A deploy that changes the generation (issue 38): the previous generation's venvs and images stay, named in
    the new manifest (teardown removes them; the next deploy of the same generation finds them as leftovers and
    removes them). So its workers, still running while the new ones roll in, keep their files, and a roll back
    finds them. Returns (what to remove now, the manifest to write)."""
    kept = {k: list(gone.get(k, [])) for k in GENERATION_KEYS}
    now = {k: ([] if k in GENERATION_KEYS else v) for k, v in gone.items()}
    out = dict(new)
    for k in GENERATION_KEYS:
        out[k] = list(new.get(k, [])) + [e for e in kept[k] if e not in new.get(k, [])]
    return now, out
