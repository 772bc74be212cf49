"""verify's checks of disaggregated serving (m3_disagg, m3deploy.core.disagg), from the plan:

- disagg/instances: the frontend's /health lists each prefill worker under component `prefill` and each decode
  worker under `backend` (Dynamo 1.6.1: a prefill worker registers at `<ns>.prefill.generate`,
  dynamo/mocker/args.py DEFAULT_PREFILL_ENDPOINT; dynamo/sglang/args.py), on the planned hosts;
- disagg/request, disagg/stream: one chat request (then one streamed) ran its prefill on a prefill worker and its
  decode on a decode worker: the frontend names both (`nvext.worker_id`: prefill_worker_id, decode_worker_id),
  both are planned workers of the right pool, and each one's own counter (`dynamo_component_requests_total` on
  endpoint `generate`, its system port's /metrics) rose;
- disagg/kv-router: the frontend routes by the KV router: it runs `--router-mode kv` (the bootstrap path: the
  other modes "fall back to the synchronous prefill path", dynamo/common/configuration/groups/router_args.py) and
  its own /metrics show the KV router at work for both worker types (`dynamo_frontend_router_admission_received_
  total{worker_type="prefill"|"decode"}` and the router's block hashing, `dynamo_router_overhead_block_hashing_ms`,
  rose with the request).
"""
from __future__ import annotations

import json
from collections.abc import Callable

from m3deploy.check.checks import (
    Check,
    CheckFailed,
    Context,
    frontend,
    frontend_url,
    generate_instances,
    instance_address,
    parse_prometheus,
    worker_pools,
)
from m3deploy.check.verify.smoke import WORKER_ID, _call, _curl, _msgs, chat, deltas, request_counters, worker_map
from m3deploy.core.model import ClusterPlan

COMPONENT = {"prefill": "prefill", "decode": "backend"}  # where each pool registers (Dynamo 1.6.1)


def _pools(ctx: Context) -> dict[str, str]:
    return worker_pools(ctx.plan)


def _instances(ctx: Context) -> str:
    url = frontend_url(ctx.plan, "/health")
    status, body = ctx.http_get(url)
    if status != 200:
        raise CheckFailed(f"GET {url}: HTTP {status}")
    inst = generate_instances(json.loads(body))
    want = sorted((COMPONENT[p], ctx.plan.host(k.split("/")[0]).address) for k, p in _pools(ctx).items())
    got = sorted((i.get("component", ""), instance_address(i)) for i in inst
                 if i.get("component") in COMPONENT.values())
    ev = "; ".join(f"{c} on {a}" for c, a in got) or "none"
    if got != want:
        raise CheckFailed(f"{ev}; planned " + "; ".join(f"{c} on {a}" for c, a in want))
    return ev


def _served(ctx: Context, nvext: dict) -> dict[str, str]:
    """{"prefill": "host/service", "decode": "host/service"} from the frontend's nvext.worker_id."""
    wid = (nvext or {}).get("worker_id") or {}
    names = worker_map(ctx)
    out = {}
    for pool in ("prefill", "decode"):
        i = wid.get(f"{pool}_worker_id")
        if i is None:
            raise CheckFailed(f"the frontend named no {pool} worker (nvext.worker_id = {wid}): not disaggregated")
        out[pool] = names.get(format(int(i), "x"), f"unplanned worker {int(i):x}")
    return out


def _ran_on_both(stream: bool) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        pools = _pools(ctx)
        before = request_counters(ctx)
        if stream:
            chunks, nvext = 0, {}
            for ch in _call(lambda: list(chat(ctx, "Count to five.", max_tokens=16, stream=True, extra_body=WORKER_ID)),
                            "chat stream"):
                chunks += 1
                nvext = (ch.model_extra or {}).get("nvext") or nvext
            what = f"{chunks} chunks"
        else:
            r = chat(ctx, "Say hello in five words.", max_tokens=16, extra_body=WORKER_ID)
            nvext, what = (r.model_extra or {}).get("nvext") or {}, f"{r.usage.completion_tokens} tokens"
        served = _served(ctx, nvext)
        d = deltas(before, request_counters(ctx))
        ev = (f"{what}: prefill on {served['prefill']} (+{d.get(served['prefill'], 0)}), decode on "
              f"{served['decode']} (+{d.get(served['decode'], 0)})")
        wrong = [f"{p} ran on {k} ({pools.get(k, 'not a planned worker')})" for p, k in served.items()
                 if pools.get(k) != p]
        if wrong:
            raise CheckFailed(ev + "; " + "; ".join(wrong))
        short = [k for k in served.values() if d.get(k, 0) < 1]
        if short:
            raise CheckFailed(ev + f"; the /metrics counters of {short} did not rise")
        return ev
    return fn


def _router_samples(ctx: Context) -> dict[str, float]:
    url = frontend_url(ctx.plan, "/metrics")
    status, body = ctx.http_get(url)
    if status != 200:
        raise CheckFailed(f"GET {url}: HTTP {status}")
    out: dict[str, float] = {}
    for name, labels, value in parse_prometheus(body):
        if name == "dynamo_frontend_router_admission_received_total" and labels.get("model") == \
                ctx.plan.served_model_name:
            key = f"admitted[{labels.get('worker_type')}]"
            out[key] = out.get(key, 0.0) + value
        elif name == "dynamo_router_overhead_block_hashing_ms_count":
            out["kv-hashing"] = out.get("kv-hashing", 0.0) + value
    return out


def _kv_router(ctx: Context) -> str:
    fe = frontend(ctx.plan)[1]
    argv = list(fe.argv)
    mode = argv[argv.index("--router-mode") + 1] if "--router-mode" in argv[:-1] else "round-robin (default)"
    if mode != "kv":
        raise CheckFailed(f"the frontend runs --router-mode {mode}, not kv")
    before = _router_samples(ctx)
    chat(ctx, "Route me by my KV blocks.", max_tokens=4)
    d = {k: v - before.get(k, 0.0) for k, v in _router_samples(ctx).items()}
    ev = "--router-mode kv; " + ", ".join(f"{k} +{v:g}" for k, v in sorted(d.items()))
    short = [k for k in ("admitted[prefill]", "admitted[decode]", "kv-hashing") if d.get(k, 0) < 1]
    if short:
        raise CheckFailed(ev + f"; did not rise: {short}")
    return ev


def disagg_checks(plan: ClusterPlan) -> list[Check]:
    if not worker_pools(plan) or frontend(plan) is None:
        return []
    m = plan.served_model_name
    body = {"model": m, "messages": _msgs("hi"), "max_tokens": 16, **WORKER_ID}
    health = f"curl -sS {frontend_url(plan, '/health')} | python3 -m json.tool"
    n = {p: sum(1 for x in worker_pools(plan).values() if x == p) for p in ("prefill", "decode")}
    return [
        Check("disagg/instances", "disagg", "frontend",
              f"/health lists {n['prefill']} prefill and {n['decode']} decode worker(s) on their hosts", _instances,
              health),
        Check("disagg/request", "disagg", "frontend", "a request ran prefill on a prefill worker, decode on a decode "
              "worker (nvext + both /metrics)", _ran_on_both(False), _curl(plan, "/chat/completions", body)
              + "   # .nvext.worker_id; then each worker's /metrics dynamo_component_requests_total"),
        Check("disagg/stream", "disagg", "frontend", "a streamed request ran on both pools", _ran_on_both(True),
              _curl(plan, "/chat/completions", {**body, "stream": True})),
        Check("disagg/kv-router", "disagg", "frontend", "the frontend routes both pools by the KV router", _kv_router,
              f"curl -sS {frontend_url(plan, '/metrics')} | grep -E "
              "'router_admission_received|block_hashing_ms_count'"),
    ]

