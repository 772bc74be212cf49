"""`smoke/identity`: the endpoint proves it is the server the plan deployed before any smoke check counts.

A smoke check alone cannot tell our server from another one on the same address: a server that answers 404 to
everything passes "an unknown model is a 404", and one that refuses everything passes "an image part is refused".
So every smoke check (smoke, contract, disagg) is gated (`gated`): it runs only after `smoke/identity` passed, else
it fails with "not counted" and the identity's evidence.

What only Dynamo 1.6.1's frontend answers (seen on a running frontend, docs/VERIFY.md "Identity"):
- `GET /v1/models` (through the endpoint, with the API key and the edge's CA): an OpenAI model list
  (`"object": "list"`) naming the served model, `owned_by` "nvidia" (Dynamo's model card);
- `GET /health` on the frontend: `"status"`, `"endpoints"` that are all `dyn://namespace.component.endpoint` URIs
  and an `"instances"` list (Dynamo's discovery, nothing else serves it);
- `GET /metrics` on the frontend: `dynamo_frontend_*` series.
A standalone engine (m3_serving=standalone) proves the model list and its engine's `owned_by` (OWNED_BY).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable

from m3deploy.check.checks import Check, CheckFailed, Context, frontend, frontend_url
from m3deploy.core.model import ClusterPlan

ID = "smoke/identity"
DYNAMO_OWNED_BY = "nvidia"  # Dynamo 1.6.1's /v1/models entries
OWNED_BY = {"vllm": "vllm", "sglang": "sglang"}  # standalone engines' own model cards (vLLM, SGLang servers)
FRONTEND_METRIC = "dynamo_frontend_"


def _models(ctx: Context, want_owner: str | None) -> str:
    import openai

    try:
        page = ctx.openai().models.list()
    except openai.APIError as e:
        code = getattr(e, "status_code", None)
        raise CheckFailed(f"GET {ctx.plan.endpoint.rstrip('/')}/models: "
                          f"{f'HTTP {code}' if code else type(e).__name__}: {str(e)[:160]} (want the model list "
                          "of the deployed server): is another server on this address?") from None
    obj = getattr(page, "object", None)
    entries = {m.id: m for m in page.data}
    name = ctx.plan.served_model_name
    if obj != "list" or name not in entries:
        raise CheckFailed(f"GET /v1/models: object={obj!r}, models {sorted(entries)} (want an OpenAI model list "
                          f"naming {name!r}): not the deployed server")
    owner = getattr(entries[name], "owned_by", None)
    if want_owner and owner != want_owner:
        raise CheckFailed(f"GET /v1/models: {name!r} owned_by {owner!r} (want {want_owner!r}, as "
                          f"{ctx.plan.serving if ctx.plan.serving == 'dynamo' else ctx.plan.engine} answers): "
                          "not the deployed server")
    return f"/v1/models lists {name!r} owned_by {owner!r}"


def _frontend_health(ctx: Context) -> str:
    url = frontend_url(ctx.plan, "/health")
    status, body = ctx.http_get(url)
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    eps = doc.get("endpoints") if isinstance(doc, dict) else None
    if (status != 200 or not isinstance(eps, list) or not eps or not all(str(e).startswith("dyn://") for e in eps)
            or not isinstance(doc.get("instances"), list)):
        raise CheckFailed(f"GET {url}: HTTP {status} {body.strip()[:160]!r} (want Dynamo's health: endpoints "
                          "dyn://..., instances): not a Dynamo frontend")
    return f"{url}: {len(eps)} dyn:// endpoint(s)"


def _frontend_metrics(ctx: Context) -> str:
    url = frontend_url(ctx.plan, "/metrics")
    status, body = ctx.http_get(url)
    names = sorted({line.split("{")[0].split(" ")[0] for line in body.splitlines()
                    if line.startswith(FRONTEND_METRIC)})
    if status != 200 or not names:
        raise CheckFailed(f"GET {url}: HTTP {status}, no {FRONTEND_METRIC}* series: not a Dynamo frontend")
    return f"/metrics has {len(names)} {FRONTEND_METRIC}* series"


def _identity(ctx: Context) -> str:
    plan = ctx.plan
    if plan.serving == "dynamo" and frontend(plan) is not None:
        return "; ".join([_models(ctx, DYNAMO_OWNED_BY), _frontend_health(ctx), _frontend_metrics(ctx)])
    return _models(ctx, OWNED_BY.get(plan.engine))


def proven(ctx: Context) -> tuple[bool, str]:
    """(passed, evidence) of the identity check, asked once per Context (every gated check reads it)."""
    if ID not in ctx.cache:
        try:
            ctx.cache[ID] = (True, _identity(ctx))
        except CheckFailed as e:
            ctx.cache[ID] = (False, str(e))
    return ctx.cache[ID]


def _identity_check_fn(ctx: Context) -> str:
    ok, ev = proven(ctx)
    if not ok:
        raise CheckFailed(ev)
    return ev


def identity_check(plan: ClusterPlan) -> Check:
    dynamo = plan.serving == "dynamo" and frontend(plan) is not None
    what = "a Dynamo frontend (/v1/models owned_by nvidia, /health dyn:// endpoints, dynamo_frontend_* metrics)" \
        if dynamo else f"a {plan.engine} server (/v1/models)"
    return Check(ID, "smoke", "frontend", f"the endpoint is {what}", _identity_check_fn,
                 f"curl -sS {plan.endpoint.rstrip('/')}/models"
                 + (f"; curl -sS {frontend_url(plan, '/health')}" if dynamo else ""))


def _gate(fn: Callable[[Context], str]) -> Callable[[Context], str]:
    def gated_fn(ctx: Context) -> str:
        ok, ev = proven(ctx)
        if not ok:
            raise CheckFailed(f"not counted: {ID} failed ({ev[:200]})")
        return fn(ctx)
    return gated_fn


def gated(checks: list[Check]) -> list[Check]:
    """The checks, each run only once the endpoint's identity is proven."""
    return [dataclasses.replace(c, fn=_gate(c.fn)) for c in checks]
