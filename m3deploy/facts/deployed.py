"""What actually runs on a host after a deploy, for the deploy record (m3deploy.controller.deployed): one shell
command with a section per item, parsed with the fact parsers preflight uses.

Sections: the NVIDIA driver and CUDA version (/proc/driver/nvidia/version, nvidia-smi's header), ROCm
(/opt/rocm/.info/version), the native venv's ai-dynamo version, per container service the image the running
container was started from (`docker inspect -f {{.Image}}`, then `docker image inspect`: id, RepoDigests, the
Dynamo version label roles/images.py sets), per model repo the commit `refs/main` names in the HF cache.
"""
from __future__ import annotations

import shlex

from m3deploy.core.model import container_name
from m3deploy.facts.parse import parse_cuda_version, parse_proc_driver_version, parse_rocm_version

MARK = "=== m3 "
DYNAMO_LABEL = "io.m3deploy.dynamo-version"


def probe_command(containers: dict[str, str], repos: list[str], hub: str = "", venv: str = "") -> str:
    """containers: {service name: image}; repos: ORG/NAME; hub: the host's HF hub cache dir."""
    fmt = shlex.quote('{{.Id}}|{{range .RepoDigests}}{{.}},{{end}}|{{index .Config.Labels "' + DYNAMO_LABEL + '"}}')
    parts = [f"echo '{MARK}driver'", "cat /proc/driver/nvidia/version 2>/dev/null",
             "(nvidia-smi 2>/dev/null | grep -m1 'CUDA Version')",
             f"echo '{MARK}rocm'", "cat /opt/rocm/.info/version 2>/dev/null"]
    if venv:
        parts += [f"echo '{MARK}dynamo'", f"{shlex.quote(venv)}/bin/python -c "
                  + shlex.quote("import importlib.metadata as m; print(m.version('ai-dynamo'))") + " 2>/dev/null"]
    for name in containers:
        c = shlex.quote(container_name(name))
        parts += [f"echo '{MARK}container {name}'",
                  f"docker image inspect --format {fmt} \"$(docker inspect -f '{{{{.Image}}}}' {c} 2>/dev/null)\" "
                  "2>/dev/null"]
    for repo in repos:
        ref = shlex.quote(f"{hub}/models--{repo.replace('/', '--')}/refs/main")
        parts += [f"echo '{MARK}repo {repo}'", f"cat {ref} 2>/dev/null; echo"]
    return "; ".join(p if p.startswith("echo") else f"{{ {p}; }} || true" for p in parts)


def parse_probe(text: str) -> dict:
    """-> {"driver", "flavor", "cuda", "rocm", "dynamo", "containers": {service: {"id", "digests", "dynamo"}},
    "repos": {repo: commit}}; "" for what the host does not have."""
    sections: dict[str, list[str]] = {}
    key = ""
    for line in text.splitlines():
        if line.startswith(MARK):
            key = line[len(MARK):].strip()
            sections[key] = []
        elif key:
            sections[key].append(line)
    body = {k: "\n".join(v) for k, v in sections.items()}
    drv = parse_proc_driver_version(body.get("driver", ""))
    out = {"driver": drv["version"], "flavor": drv["flavor"], "cuda": parse_cuda_version(body.get("driver", "")),
           "rocm": parse_rocm_version(body.get("rocm", "")), "dynamo": body.get("dynamo", "").strip(),
           "containers": {}, "repos": {}}
    for k, v in body.items():
        if k.startswith("container "):
            line = next((x for x in v.splitlines() if x.startswith("sha256:")), "")
            ident, digests, label = (line.split("|") + ["", "", ""])[:3]
            out["containers"][k.split(" ", 1)[1]] = {
                "id": ident, "digests": [d for d in digests.split(",") if d],
                "dynamo": "" if label.startswith("<no value") else label.strip()}
        elif k.startswith("repo "):
            out["repos"][k.split(" ", 1)[1]] = v.strip()
    return out
