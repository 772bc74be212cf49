"""Poll a service's Readiness from the controller (pure Python, no pyinfra): never sleep-and-hope.

`wait_ready(readiness, what=..., logs=callable)` polls an http or tcp check (the edge; an MPI world's sshd) every
`interval_s` until it passes or `timeout_s` runs out; on failure it raises NotReady (an M3Error)
naming the check, the last observation and the unit's last journal lines (fetched by `logs()`,
e.g. over the pyinfra connection: roles pass a function that runs `journalctl -u UNIT -n 40`).

Also `wait_instances()`: the Dynamo frontend's /health lists at least N `generate` instances.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable

from m3deploy.core.errors import M3Error
from m3deploy.core.model import Readiness


class NotReady(M3Error):
    pass


def auth(api_key: str | None) -> dict[str, str]:
    """The header an OpenAI-API request carries when the cluster has an API key (m3_api_key_file); vLLM's
    AuthenticationMiddleware wants exactly `Authorization: Bearer KEY` (docs/CONTRACTS.md "API keys")."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass
class Result:
    ok: bool
    detail: str  # what was observed (status, body excerpt, error)


def _lookup(doc, dotted: str):
    cur = doc
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return _MISSING
    return cur


_MISSING = object()


def check_http(r: Readiness, timeout: float = 5.0) -> Result:
    try:
        req = urllib.request.Request(r.url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read(65536)
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read(65536) if e.fp else b""
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return Result(False, f"GET {r.url}: {reason}")
    text = body.decode("utf-8", "replace")
    if status != r.expect_status:
        return Result(False, f"GET {r.url}: HTTP {status} (want {r.expect_status}): {text[:200]}")
    if r.expect_json:
        try:
            doc = json.loads(text)
        except ValueError:
            return Result(False, f"GET {r.url}: body is not JSON: {text[:200]}")
        for key, want in r.expect_json:
            got = _lookup(doc, key)
            if got is _MISSING or str(got) != str(want):
                return Result(False, f"GET {r.url}: {key}={'<missing>' if got is _MISSING else got!r} "
                                     f"(want {want!r})")
    return Result(True, f"GET {r.url}: HTTP {status}")


def check_tcp(r: Readiness, timeout: float = 3.0) -> Result:
    try:
        with socket.create_connection((r.address, r.port), timeout=timeout):
            return Result(True, f"tcp {r.address}:{r.port} accepts")
    except OSError as e:
        return Result(False, f"tcp {r.address}:{r.port}: {e.strerror or e}")


CHECKS = {"http": check_http, "tcp": check_tcp}


def check_once(r: Readiness) -> Result:
    fn = CHECKS.get(r.kind)
    if fn is None:
        raise M3Error(f"readiness kind {r.kind!r} cannot be polled from the controller "
                      f"(supported: {', '.join(CHECKS)}); 'process' is checked by systemd")
    return fn(r)


def describe(r: Readiness) -> str:
    if r.kind == "http":
        extra = "".join(f" and {k}={v}" for k, v in r.expect_json)
        return f"GET {r.url} answers {r.expect_status}{extra}"
    if r.kind == "tcp":
        return f"{r.address}:{r.port} accepts TCP"
    return r.kind


def wait_ready(r: Readiness, what: str = "service", logs: Callable[[], str] | None = None,
               clock=time.monotonic, sleep=time.sleep) -> float:
    """Poll until ready; return seconds taken. Raises NotReady with the journal tail on timeout."""
    start = clock()
    deadline = start + r.timeout_s
    last = Result(False, "not checked")
    while True:
        last = check_once(r)
        if last.ok:
            return clock() - start
        if clock() >= deadline:
            break
        sleep(min(r.interval_s, max(0.0, deadline - clock())))
    tail = ""
    if logs is not None:
        try:
            tail = logs() or ""
        except Exception as e:  # noqa: BLE001 - a log fetch failure must not hide the real error
            tail = f"(could not fetch logs: {e})"
    msg = (f"{what} is not ready after {r.timeout_s} s: check failed: {describe(r)}\n"
           f"  last observation: {last.detail}")
    if tail:
        msg += "\n  last journal lines:\n" + "\n".join("    " + ln for ln in tail.rstrip().splitlines())
    msg += ("\n  fix: look at the unit on the host (systemctl status / journalctl -u), correct the "
            "inventory or the service, and run the deploy again")
    raise NotReady(msg)


def generate_instances(health_url: str, timeout: float = 5.0) -> list[dict]:
    with urllib.request.urlopen(health_url, timeout=timeout) as resp:
        doc = json.loads(resp.read())
    return [i for i in doc.get("instances", []) if i.get("endpoint") == "generate"]


def wait_instances(health_url: str, count: int, timeout_s: float = 120, interval_s: float = 0.5,
                   logs: Callable[[], str] | None = None, clock=time.monotonic, sleep=time.sleep) -> float:
    """Wait until the frontend's /health lists >= count `generate` instances (all workers registered)."""
    start = clock()
    seen: object = "no answer"
    while True:
        try:
            inst = generate_instances(health_url)
            seen = [i.get("transport") for i in inst]
            if len(inst) >= count:
                return clock() - start
        except (OSError, ValueError) as e:
            seen = str(e)
        if clock() - start >= timeout_s:
            break
        sleep(interval_s)
    msg = (f"the frontend at {health_url} lists {seen!r}, want {count} `generate` instance(s) "
           f"after {timeout_s} s")
    if logs is not None:
        try:
            msg += "\n  last journal lines:\n" + "\n".join("    " + ln for ln in (logs() or "").splitlines())
        except Exception as e:  # noqa: BLE001
            msg += f"\n  (could not fetch logs: {e})"
    raise NotReady(msg + "\n  fix: check the workers' units (journalctl -u m3-worker@N) and their "
                         "ETCD_ENDPOINTS/NATS_SERVER")


def model_ready(base_url: str, model: str, timeout: float = 5.0) -> tuple[bool | None, str]:
    """The Dynamo frontend's `GET /v1/models/{model}/ready`: (True, detail) ready, (False, detail) not yet,
    (None, detail) this build has no such route (a 404 that is not its "Model not found")."""
    import urllib.parse

    url = f"{base_url.rstrip('/')}/v1/models/{urllib.parse.quote(model, safe='')}/ready"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            status, body = resp.status, resp.read(65536)
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read(65536) if e.fp else b""
    except (urllib.error.URLError, OSError) as e:
        return False, f"GET {url}: {getattr(e, 'reason', e)}"
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
    except ValueError:
        doc = {}
    if status == 200 and isinstance(doc, dict) and doc.get("ready") is True:
        return True, f"GET {url}: ready"
    if status in (404, 405) and not (isinstance(doc, dict) and "not found" in str(doc.get("message", "")).lower()):
        return None, f"GET {url}: HTTP {status} (no readiness route in this build)"
    return False, f"GET {url}: HTTP {status}: {text[:200]}"


def wait_model_ready(base_url: str, model: str, timeout_s: float = 120, interval_s: float = 0.5,
                     clock=time.monotonic, sleep=time.sleep) -> float:
    """Wait until the frontend says `model` is routable (`/v1/models/{model}/ready`): listed in /v1/models is
    not routable yet. Returns at once where the build has no such route."""
    start = clock()
    while True:
        ok, detail = model_ready(base_url, model)
        if ok is not False:
            return clock() - start
        if clock() - start >= timeout_s:
            raise NotReady(f"model {model!r} is not ready after {timeout_s} s: {detail}\n  fix: check the workers' "
                           "units (journalctl -u m3-worker@N) and that they registered this model name")
        sleep(interval_s)


def pinned_chat(endpoint: str, model: str, instance_id: int, timeout: float = 60.0,
                api_key: str | None = None, prefill_id: int | None = None, pool: str = "decode") -> int | None:
    """POST one small chat request that the Dynamo frontend must route to worker `instance_id`
    (`nvext.backend_instance_id`); return the worker id the frontend says served it (urllib: it also runs inside
    pyinfra's gevent, where httpx cannot). Disaggregated (m3_disagg): also pinned to prefill worker `prefill_id`
    (`nvext.prefill_worker_id`; Dynamo 1.6.1 answers 400 to a backend_instance_id alone there), and the id
    returned is that of the `pool` ("prefill" | "decode") worker that served it."""
    nvext = {"backend_instance_id": instance_id, "extra_fields": ["worker_id"]}
    if prefill_id is not None:
        nvext["prefill_worker_id"] = prefill_id
    body = json.dumps({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hello."}],
                       "nvext": nvext}).encode()
    req = urllib.request.Request(f"{endpoint.rstrip('/')}/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", **auth(api_key)})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc = json.loads(resp.read())
    return ((doc.get("nvext") or {}).get("worker_id") or {}).get(f"{pool}_worker_id")


def _pin(key: str, wid: int, ids: dict[str, int], pools: dict[str, str]) -> dict:
    """pinned_chat's arguments for worker `key`: itself; disaggregated, with the first worker of the other pool."""
    if not pools:
        return {"instance_id": wid}
    other = {p: next(ids[k] for k in ids if pools.get(k) == p) for p in ("prefill", "decode")}
    if pools[key] == "prefill":
        return {"instance_id": other["decode"], "prefill_id": wid, "pool": "prefill"}
    return {"instance_id": wid, "prefill_id": other["prefill"], "pool": "decode"}


def answered_by_each(endpoint: str, model: str, ids: dict[str, int], api_key: str | None = None,
                     timeout_s: float = 0.0, pools: dict[str, str] | None = None) -> dict[str, int | str | None]:
    """Listed is not routable: one real chat request pinned to each worker ({"host/service": Dynamo instance
    id}) -> {key: the instance that answered, or the error}; each retried until its own worker answers or
    `timeout_s` passes (0: once). The one check of the deploy's last gate (roles/serving.py) and of
    `m3deploy verify`'s smoke/routable (check/verify/contract.py). `pools`: {key: "prefill" | "decode"} of a
    disaggregated plan (checks.worker_pools), else empty."""
    out: dict[str, int | str | None] = {}
    for key, wid in ids.items():
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got: int | str | None = pinned_chat(endpoint, model, api_key=api_key,
                                                    **_pin(key, wid, ids, pools or {}))
            except (OSError, ValueError) as e:
                got = f"an error: {e}"
            if got == wid or time.monotonic() >= deadline:
                break
            time.sleep(1)
        out[key] = got
    return out
