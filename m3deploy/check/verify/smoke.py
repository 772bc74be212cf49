"""Smoke requests through the cluster's OpenAI endpoint (plan.endpoint), with the `openai` client.

Output text is not checked (the mocker's is random): structure, status codes, token counts and
routing are. Each check returns its evidence or raises verify.CheckFailed.

Requests carry the seed's client contract: sampling defaults (temperature 1.0, top_p 0.95, top_k 40) and the
default system prompt. Session affinity (Dynamo frontend, the seed's header `X-Dynamo-Session-ID`; 1.6.1 also
reads `x-session-id`, checked separately) is evidenced per request by the frontend
itself: `nvext.extra_fields=["worker_id"]` makes it return the instance id that served the request
(`nvext.worker_id.decode_worker_id`). Instance ids are mapped to planned worker services through each
worker's system-port /metrics (label `worker_id` = instance id in hex), and the per-worker
`dynamo_component_requests_total{dynamo_endpoint="generate"}` deltas before/after confirm it
independently of the frontend's answer.

- api-key (with m3_api_key_file): the endpoint refuses a request without the key or with a wrong one (401) and
  answers one with it (200); every other request here carries the key (the openai client's api_key).
- session-affinity: N turns of one session, each with an unrelated prompt (no shared prefix, so the KV
  router has no cache reason to stay), all land on one worker; the metric deltas agree.
- session-spread (>= 2 workers): new sessions sent concurrently spread over >= 2 workers; then each
  session's follow-up (again unrelated text, sent one at a time, when a tie-break would pick one worker
  for all) returns to its own worker.
"""
from __future__ import annotations

import json
import shlex
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from m3deploy.check.checks import (
    Check,
    CheckFailed,
    Context,
    frontend,
    generate_requests,
    instance_services,
    metrics_url,
    worker_id_hex,
    worker_pools,
)
from m3deploy.check.verify import identity
from m3deploy.controller import tls
from m3deploy.core import catalog
from m3deploy.core.model import ClusterPlan

WORKER_ID = {"nvext": {"extra_fields": ["worker_id"]}}
# the plain chat checks ask for an answer without thinking: under Dynamo's minimax_m3 reasoning parser a reply that
# never closes its think block (a short one of a model that thinks first; every one of random weights) streams no
# content and no reasoning at all (seen on the testbed's vLLM on CPU: 3 chunks, none with text)
NO_THINKING = {"chat_template_kwargs": {"thinking_mode": "disabled"}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def key_file(plan: ClusterPlan) -> str:
    return str(dict(plan.settings).get("m3_api_key_file") or "")


def _auth_arg(plan: ClusterPlan) -> str:
    """curl's header with the cluster's API key, read from its file when the command runs (never printed)."""
    f, ca = key_file(plan), tls.ca_path(plan)  # with the edge: its CA, and the file's first key
    return ((f"--cacert {shlex.quote(ca)} " if ca else "")
            + (f'-H "Authorization: Bearer $(head -n1 {shlex.quote(f)})" ' if f else ""))


def _curl(plan: ClusterPlan, path: str, body: dict, headers: dict | None = None) -> str:
    h = " ".join(f"-H {shlex.quote(f'{k}: {v}')}" for k, v in (headers or {}).items())
    return (f"curl -sS -i {shlex.quote(plan.endpoint.rstrip('/') + path)} -H 'content-type: application/json' "
            + _auth_arg(plan) + (h + " " if h else "")
            + f"-d {shlex.quote(json.dumps({**SAMPLING, 'top_k': TOP_K, **body}, separators=(',', ':')))}")


def _status(e: Exception) -> str:
    code = getattr(e, "status_code", None)
    if code:
        return f"HTTP {code}: {getattr(e, 'message', e)}"
    req = getattr(e, "request", None)
    return f"{type(e).__name__}: {e}" + (f" ({req.method} {req.url})" if req is not None else "")


def _call(fn: Callable[[], Any], what: str):
    import openai

    try:
        return fn()
    except openai.APIError as e:
        raise CheckFailed(f"{what}: {_status(e)}"[:400]) from None


def _usage_ok(usage) -> str:
    if usage is None or not usage.prompt_tokens or not usage.completion_tokens:
        raise CheckFailed(f"usage missing or zero: {usage}")
    return f"usage {usage.prompt_tokens}+{usage.completion_tokens} tokens"


# The seed's client contract (seeds/000 "Client Usage"): the model card's sampling and default system prompt.
SYSTEM_PROMPT = "You are a helpful assistant. Your name is MiniMax-M3 and is built by MiniMax."
SAMPLING = {"temperature": 1.0, "top_p": 0.95}
TOP_K = 40  # not an OpenAI parameter: sent in the body (extra_body), as vLLM and Dynamo read it
SESSION_HEADER = "X-Dynamo-Session-ID"  # the seed's; Dynamo 1.6.1 also reads x-session-id


def _msgs(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]


def chat(ctx: Context, text: str, extra_body: dict | None = None, **kw):
    """One chat completion with the seed's sampling defaults and system prompt (model: the served one)."""
    kw.setdefault("model", ctx.plan.served_model_name)
    body = {"top_k": TOP_K, **(extra_body or {})}
    return _call(lambda: ctx.openai().chat.completions.create(messages=_msgs(text), extra_body=body,
                                                              **SAMPLING, **kw), f"chat ({text[:40]})")


# ------------------------------------------------------------------------------------------------ checks
def _models(ctx: Context) -> str:
    ms = _call(lambda: ctx.openai().models.list(), "GET /models")
    ids = [m.id for m in ms.data]
    if ctx.plan.served_model_name not in ids:
        raise CheckFailed(f"/v1/models lists {ids}, not {ctx.plan.served_model_name!r}")
    return f"HTTP 200, models {ids}"


def _chat(ctx: Context) -> str:
    r = chat(ctx, "Say hello in five words.", max_tokens=16, extra_body=NO_THINKING)
    if not r.choices or r.choices[0].message is None:
        raise CheckFailed(f"no choices in {r}")
    c = r.choices[0]
    return f"HTTP 200, finish_reason {c.finish_reason}, {_usage_ok(r.usage)}"


def _chat_stream(ctx: Context) -> str:
    stream = chat(ctx, "Count to ten.", max_tokens=24, stream=True, stream_options={"include_usage": True},
                  extra_body=NO_THINKING)
    chunks = text_chunks = 0
    finish = None
    usage = None
    for ch in _call(lambda: list(stream), "chat stream"):
        chunks += 1
        if ch.usage is not None:
            usage = ch.usage
        for c in ch.choices:
            # text is content or, under a reasoning parser, reasoning: Dynamo's minimax_m3 parser takes all a model
            # writes before `</mm:think>` for reasoning unless thinking_mode is disabled (a short reply of a real
            # M3 that thinks first, every reply of the testbed's random-weights model: docs/TESTBED.md)
            extra = (getattr(c.delta, "model_extra", None) or {}) if c.delta else {}
            if c.delta and (c.delta.content or extra.get("reasoning_content") or extra.get("reasoning")):
                text_chunks += 1
            if c.finish_reason:
                finish = c.finish_reason
    if chunks < 2 or not text_chunks:
        raise CheckFailed(f"{chunks} chunk(s), {text_chunks} with content or reasoning: not a stream")
    if finish is None:
        raise CheckFailed(f"{chunks} chunks but no final finish_reason")
    return f"{chunks} chunks ({text_chunks} with text), final finish_reason {finish}" + (
        f", {_usage_ok(usage)}" if usage is not None else "")


def _completions(ctx: Context) -> str:
    r = _call(lambda: ctx.openai().completions.create(
        model=ctx.plan.served_model_name, prompt="The capital of France is", max_tokens=12, **SAMPLING,
        extra_body={"top_k": TOP_K}), "completions")
    if not r.choices or not isinstance(r.choices[0].text, str):
        raise CheckFailed(f"no text choice in {r}")
    return f"HTTP 200, {len(r.choices[0].text)} chars, finish_reason {r.choices[0].finish_reason}, {_usage_ok(r.usage)}"


def _thinking(mode: str) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        r = chat(ctx, "Is 17 prime? Think first.", max_tokens=16,
                 extra_body={"chat_template_kwargs": {"thinking_mode": mode}})
        if not r.choices:
            raise CheckFailed("no choices")
        return f"HTTP 200 with thinking_mode={mode}, finish_reason {r.choices[0].finish_reason}, {_usage_ok(r.usage)}"
    return fn


def tools_refused(plan: ClusterPlan) -> str:
    """Why the endpoint refuses a request with tools (an engine's CPU build without its tool parser, engines.yaml
    `cpu: tools_refused` for the serving mode), or "" where it takes them."""
    return str(((catalog.cpu_build(plan.engine, plan.platform) or {}).get("tools_refused") or {}).get(plan.serving, ""))


def _tools(ctx: Context) -> str:
    import openai

    why = tools_refused(ctx.plan)
    if why:
        try:
            ctx.openai().chat.completions.create(model=ctx.plan.served_model_name, max_tokens=8, tools=TOOLS,
                                                 tool_choice="auto", messages=_msgs("What is the weather in Paris?"))
        except openai.APIStatusError as e:
            if e.status_code == 400:
                return f"refused as planned: HTTP 400 ({why})"
            raise CheckFailed(f"a request with tools: HTTP {e.status_code}, the plan says refused (400): {why}")
        raise CheckFailed(f"a request with tools was accepted, but the plan says refused: {why}")
    r = chat(ctx, "What is the weather in Paris?", tools=TOOLS, tool_choice="auto", max_tokens=24)
    if not r.choices:
        raise CheckFailed("no choices")
    c = r.choices[0]
    calls = c.message.tool_calls or []
    for tc in calls:  # a real model may call the tool; then the call must be well-formed
        if tc.function is None or not tc.function.name:
            raise CheckFailed(f"malformed tool call {tc}")
        json.loads(tc.function.arguments or "{}")
    return (f"HTTP 200 with tools=[get_weather], finish_reason {c.finish_reason}, {len(calls)} tool call(s), "
            f"{_usage_ok(r.usage)}")


def _api_key(ctx: Context) -> str:
    """The endpoint enforces the key: no key and a wrong key get 401, the key gets 200 (vLLM's
    AuthenticationMiddleware guards /v1; readiness polls /health, which stays open: health/... checks it)."""
    url = ctx.plan.endpoint.rstrip("/") + "/models"
    if not ctx.api_key:
        raise CheckFailed(f"m3_api_key_file is set but the controller has no key from {key_file(ctx.plan)}")
    seen = []
    for what, headers, want in (("no key", {}, 401), ("a wrong key", {"Authorization": "Bearer m3-wrong-key"}, 401),
                                ("the key", {"Authorization": f"Bearer {ctx.api_key}"}, 200)):
        status, body = ctx.http_get(url, headers=headers)
        if status != want:
            raise CheckFailed(f"GET {url} with {what}: HTTP {status} (want {want}): {body[:200]}")
        seen.append(f"{what}: {status}")
    return "GET /v1/models with " + ", ".join(seen)


def _unknown_model(ctx: Context) -> str:
    import openai

    name = f"no-such-model-{uuid.uuid4().hex[:8]}"
    try:
        ctx.openai().chat.completions.create(model=name, messages=_msgs("hi"), max_tokens=4)
    except openai.NotFoundError:
        return f"HTTP 404 for model {name!r}"
    except openai.APIError as e:
        raise CheckFailed(f"model {name!r}: {_status(e)} (want 404)") from None
    raise CheckFailed(f"model {name!r} was served (want 404)")


# ------------------------------------------------------------------------------------------------ affinity
def _worker_metrics(ctx: Context):
    """("host/service", generate-request counters by worker id) for every planned worker with a /metrics."""
    for h, s in instance_services(ctx.plan):
        url = metrics_url(h, s)
        if not url:
            continue
        status, body = ctx.http_get(url)
        if status != 200:
            raise CheckFailed(f"GET {url}: HTTP {status}")
        yield f"{h.name}/{s.name}", generate_requests(body)


def worker_map(ctx: Context) -> dict[str, str]:
    """{worker_id hex: "host/service"} from each planned worker's system-port /metrics."""
    if "worker_map" not in ctx.cache:
        ctx.cache["worker_map"] = {wid: key for key, counts in _worker_metrics(ctx) for wid in counts}
    return ctx.cache["worker_map"]


def request_counters(ctx: Context) -> dict[str, float]:
    """{"host/service": generate requests served so far} for every planned worker."""
    return {key: sum(counts.values()) for key, counts in _worker_metrics(ctx)}


def deltas(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: int(after.get(k, 0) - before.get(k, 0)) for k in after}


def _ask(ctx: Context, session: str, text: str, max_tokens: int = 8, header: str = SESSION_HEADER) -> str:
    """One chat turn in `session` (sent in `header`); returns the "host/service" that served it."""
    return served_by(ctx, chat(ctx, text, max_tokens=max_tokens, extra_headers={header: session},
                               extra_body=WORKER_ID))


def served_by(ctx: Context, r) -> str:
    """The planned "host/service" the frontend says served response r (asked with WORKER_ID in the body)."""
    nv = (r.model_extra or {}).get("nvext") or {}
    wid = (nv.get("worker_id") or {}).get("decode_worker_id")
    if wid is None:
        raise CheckFailed("the frontend did not say which worker served the request "
                          "(nvext.extra_fields=['worker_id'] unsupported?)")
    hexid = worker_id_hex(wid)
    return worker_map(ctx).get(hexid, f"unplanned worker {hexid}")


def _fmt(d: dict[str, int]) -> str:
    return ", ".join(f"{k.split('/')[0]} +{v}" for k, v in sorted(d.items()))


def _session_affinity(turns: int, header: str = SESSION_HEADER) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        sid = f"m3verify-{uuid.uuid4().hex[:12]}"
        before = request_counters(ctx)
        served = [_ask(ctx, sid, f"turn {t}: unrelated question {uuid.uuid4().hex}", header=header)
                  for t in range(turns)]
        d = deltas(before, request_counters(ctx))
        where = sorted(set(served))
        if len(where) != 1:
            raise CheckFailed(f"session {sid}: {turns} turns landed on {served} (want one worker); "
                              f"metrics deltas {_fmt(d)}")
        w = where[0]
        if d.get(w, 0) < turns:
            raise CheckFailed(f"frontend says {w} served all {turns} turns, but its request counter rose "
                              f"by {d.get(w, 0)}; deltas {_fmt(d)}")
        return f"{turns}/{turns} turns of one {header} on {w}; /metrics generate requests: {_fmt(d)}"
    return fn


def _session_spread(sessions: int) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        n_workers = _decode_workers(ctx.plan)
        tag = uuid.uuid4().hex[:8]
        sids = [f"m3verify-{tag}-{i}" for i in range(sessions)]
        first: dict[str, str] = {}
        for attempt in range(3):  # concurrent first turns: load makes the router spread them
            with ThreadPoolExecutor(max_workers=sessions) as ex:
                got = list(ex.map(lambda s: _ask(ctx, s + f"-{attempt}", f"start {s} {uuid.uuid4().hex}", 48), sids))
            first = {s + f"-{attempt}": w for s, w in zip(sids, got)}
            if len(set(got)) >= min(2, n_workers):
                break
        used = sorted(set(first.values()))
        if len(used) < 2:
            raise CheckFailed(f"{sessions} concurrent new sessions (3 tries) all landed on {used}: "
                              f"the router does not spread sessions over {n_workers} workers")
        before = request_counters(ctx)
        moved = []
        for s, w in first.items():  # one at a time: without affinity a tie-break would pick one worker
            again = _ask(ctx, s, f"follow-up, unrelated {uuid.uuid4().hex}")
            if again != w:
                moved.append(f"{s}: {w} -> {again}")
        d = deltas(before, request_counters(ctx))
        spread = {w: sum(1 for x in first.values() if x == w) for w in used}
        spread_txt = ", ".join(f"{w.split('/')[0]}: {n}" for w, n in spread.items())
        ev = (f"{sessions} new sessions spread {spread_txt}; "
              f"follow-ups stayed {sessions - len(moved)}/{sessions}; /metrics generate requests: {_fmt(d)}")
        if moved:
            raise CheckFailed(ev + "; moved: " + "; ".join(moved[:4]))
        want = {w: n for w, n in spread.items()}
        short = [w for w, n in want.items() if d.get(w, 0) < n]
        if short:
            raise CheckFailed(ev + f"; counters of {short} rose less than the frontend reported")
        return ev
    return fn


def _decode_workers(plan: ClusterPlan) -> int:
    """Workers a session can stick to: every worker, or a disaggregated plan's decode pool."""
    pools = worker_pools(plan)
    return sum(p == "decode" for p in pools.values()) if pools else len(plan.workers)


# ------------------------------------------------------------------------------------------------ list
def smoke_checks(plan: ClusterPlan) -> list[Check]:
    """The smoke checks that apply to this plan (affinity ones only behind a Dynamo frontend)."""
    if not plan.endpoint:
        return []
    m = plan.served_model_name
    msg = _msgs("hi")
    models = f"curl -sS -i {shlex.quote(plan.endpoint.rstrip('/') + '/models')}"
    out = [Check("smoke/api-key", "smoke", "frontend", "without the API key 401, with it 200", _api_key,
                 f"{models}   # 401; then: {models} {_auth_arg(plan).strip()}")] if key_file(plan) else []
    out += [
        Check("smoke/models", "smoke", "frontend", f"/v1/models lists {m}", _models,
              f"{models} {_auth_arg(plan)}".strip()),
        Check("smoke/chat", "smoke", "frontend", "chat completion has choices and usage", _chat,
              _curl(plan, "/chat/completions", {"model": m, "messages": msg, "max_tokens": 16, **NO_THINKING})),
        Check("smoke/chat-stream", "smoke", "frontend", "streamed chat: chunks, then a finish_reason", _chat_stream,
              _curl(plan, "/chat/completions", {"model": m, "messages": msg, "max_tokens": 24, "stream": True,
                                                **NO_THINKING})),
        Check("smoke/completions", "smoke", "frontend", "/v1/completions has a text choice and usage", _completions,
              _curl(plan, "/completions", {"model": m, "prompt": "The capital of France is", "max_tokens": 12})),
    ]
    for mode in ("enabled", "disabled", "adaptive"):
        out.append(Check(f"smoke/thinking-{mode}", "smoke", "frontend", f"thinking_mode={mode} accepted",
                         _thinking(mode), _curl(plan, "/chat/completions", {
                             "model": m, "messages": msg, "max_tokens": 16,
                             "chat_template_kwargs": {"thinking_mode": mode}})))
    out.append(Check("smoke/tools", "smoke", "frontend", "a request with tools is " + (
        "refused (400)" if tools_refused(plan) else "accepted"), _tools,
                     _curl(plan, "/chat/completions", {"model": m, "messages": msg, "tools": TOOLS, "max_tokens": 24})))
    if frontend(plan) is not None and plan.workers:
        body = {"model": m, "messages": msg, "max_tokens": 8, **WORKER_ID}
        for cid, header in (("smoke/session-affinity", SESSION_HEADER),
                            ("smoke/session-affinity-x-session-id", "x-session-id")):
            out.append(Check(cid, "smoke", "frontend", f"4 turns with one {header} land on one worker",
                             _session_affinity(4, header), _curl(plan, "/chat/completions", body, {header: "s1"})
                             + "   # repeat; compare .nvext.worker_id"))
        if _decode_workers(plan) >= 2:  # sessions stick to decode workers (m3_disagg: the decode pool's)
            n = max(6, 2 * _decode_workers(plan))
            out.append(Check("smoke/session-spread", "smoke", "frontend",
                             f"{n} new sessions spread over workers, each then sticks", _session_spread(n),
                             _curl(plan, "/chat/completions", body, {SESSION_HEADER: "s2"})
                             + "   # with several session ids at once; compare .nvext.worker_id"))
    out.append(Check("smoke/unknown-model-404", "smoke", "frontend", "an unknown model is a 404", _unknown_model,
                     _curl(plan, "/chat/completions", {"model": "no-such-model", "messages": msg, "max_tokens": 4})))
    return [identity.identity_check(plan)] + identity.gated(out)  # none counts before the endpoint proves itself
