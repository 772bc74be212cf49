"""References a user types that name something outside the cluster: docker image references (distribution/reference's
grammar) and Hugging Face repo ids. Pure: the input contract (core.inputs) and the host-file renderer check them."""
from __future__ import annotations

import re
from typing import Any

from m3deploy.core import repos

# ------------------------------------------------------------------ image references
# docker's reference grammar: distribution/reference v0.6.0 regexp.go (the library docker's CLI and daemon parse
# references with); Go's \w is ASCII, hence re.ASCII
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|[-]+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
IMAGE_REF = re.compile(
    rf"(?P<name>(?:(?P<domain>{_HOST}(?::[0-9]+)?)/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?", re.ASCII)
NAME_TOTAL_LENGTH_MAX = 255  # reference.go
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}  # opencontainers/go-digest algorithm.go


def image_problem(ref: Any) -> str:
    """Why docker would refuse (or misread) this image reference ('' when it pulls as written)."""
    if not isinstance(ref, str) or not ref:
        return f"{ref!r} is not an image reference"
    if len(ref) > 2 * NAME_TOTAL_LENGTH_MAX + 128 + 140:  # name, tag, sha512 digest
        return f"{ref[:40]!r}... ({len(ref)} characters) is longer than any docker image reference"
    if ref != ref.strip() or re.search(r"\s", ref):
        flags = ref.strip().split()[1:]
        return (f"{ref!r} holds white space" + (f" (docker flags {' '.join(flags)!r} after the reference?)" if
                flags and flags[0].startswith("-") else "") + ": docker parses the reference as one word. "
                f"Fix: m3_image = {ref.strip().split()[0]!r}"
                + ("; docker run options are not m3_image's" if flags else ""))
    m = IMAGE_REF.fullmatch(ref)
    first = ref.split("/", 1)[0]
    if m is None:
        lower = ref.lower()
        if IMAGE_REF.fullmatch(lower):
            return f"{ref!r}: docker's repository names are lower case. Fix: m3_image = {lower!r}"
        return (f"{ref!r} is not a docker image reference ([registry[:port]/]name[:tag][@digest], names lower case; "
                "distribution/reference). Fix: e.g. 'vllm/vllm-openai:v0.11.0'")
    if "/" in m.group("name") and first == m.group("domain") and first != first.lower() and not any(
            c in first for c in ".:") and first != "localhost":
        return (f"{ref!r}: docker reads {first!r} as a registry host (upper case makes a first component a domain, "
                f"distribution/reference normalize.go splitDockerDomain), not as Docker Hub's {first.lower()!r}. "
                f"Fix: m3_image = {ref.lower()!r}")
    if len(m.group("name")) > NAME_TOTAL_LENGTH_MAX:
        return f"{ref[:40]!r}...: the name is longer than docker's {NAME_TOTAL_LENGTH_MAX} characters"
    if m.group("digest"):
        algo, hexpart = m.group("digest").split(":", 1)
        if DIGEST_HEX.get(algo) != len(hexpart) or hexpart != hexpart.lower():
            return (f"{ref!r}: the digest is not a {algo} digest docker accepts (sha256: 64 lower-case hex digits). "
                    "Fix: copy the whole digest from `docker images --digests` or the registry")
    if re.fullmatch(r"[a-f0-9]{64}", ref):
        return f"{ref!r} is an image ID, not a reference docker pulls. Fix: the image's name:tag"
    return ""


# ------------------------------------------------------------------ model ids
HF_URL = re.compile(r"https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?:models/)?([^/?#\s]+/[^/?#\s]+)")


def model_id_problem(value: str) -> str:
    """m3_model_id must be a repo the weights role stages: a namespaced Hugging Face repo id."""
    if repos.is_repo_id(value):
        return ""
    hint = ""
    m = HF_URL.match(value.strip())
    if m:
        hint = m.group(1)
    elif not value.strip().startswith(("/", ".", "~")) and repos.is_repo_id(value.strip().strip("/")):
        hint = value.strip().strip("/")
    elif re.fullmatch(r"[^@:\s]+/[^@:\s]+[@:][^/\s]+", value) and repos.is_repo_id(re.split("[@:]", value)[0]):
        hint = re.split("[@:]", value)[0]
    if "://" in value:
        why = "is a URL; workers load a repo id from the HF cache (HF_HUB_OFFLINE=1)"
    elif value.startswith(("/", ".", "~")) or "/../" in value or value.endswith("/.."):
        why = ("is a local path: the plan mounts only m3_hf_cache into the engine (as /root/.cache/huggingface) and "
               "stages only Hugging Face repos into it, so nothing would be at that path when the engine starts")
    elif "/" not in value and repos.is_repo_id(f"x/{value}"):
        why = "has no namespace: the weights role stages repos named ORG/NAME"
    else:
        why = ("is not a Hugging Face repo id (huggingface_hub validate_repo_id: ORG/NAME, each 1-96 of A-Z a-z "
               "0-9 - _ ., starting and ending with a letter or digit, no -- or .., not ending .git)")
    fix = (f"m3_model_id = {hint!r}" if hint else
           "the checkpoint's repo id as the Hub shows it, e.g. 'MiniMaxAI/MiniMax-M3' (private: m3_hf_token_file; "
           "no Hub access: m3_weights_source = 'controller' with the repo in the controller's HF cache)")
    return f"{value!r} {why}. Fix: {fix}"
