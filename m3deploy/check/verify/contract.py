"""Smoke checks of the model's contract, beyond "accepted" (docs/VERIFY.md says what each proves and cannot).

- smoke/reasoning-split[-stream]: with thinking_mode=enabled the frontend's reasoning parser moves the think
  block into `reasoning_content` (or `reasoning`): non-empty, and `content` holds no think delimiter.
- smoke/tool-call: a request with tools comes back as a parsed `tool_calls` entry naming the requested
  function, with JSON-object arguments, and finish_reason `tool_calls`. On the mocker's cluster it goes to
  the scripted engine (m3deploy.core.simengine), whose reply is M3's tool-call markup: the frontend's parser must
  turn it into the entry.
- smoke/image-input: a request with an image part is accepted or refused as the plan says (image_policy).
- smoke/model-ready: `/v1/models/{model}/ready` says ready (Dynamo 1.6.1 serves it) for every served model.
- smoke/routable: one real request pinned to each planned worker (`nvext.backend_instance_id`) is answered
  by that worker: the frontend says so and the worker's own /metrics counter rose.
"""
from __future__ import annotations

import json
import urllib.parse
from typing import Callable

from m3deploy.check import readiness
from m3deploy.check.checks import (
    Check,
    CheckFailed,
    Context,
    frontend,
    frontend_url,
    instance_services,
    worker_pools,
)
from m3deploy.check.verify.smoke import (
    TOOLS,
    _call,
    _curl,
    _msgs,
    _usage_ok,
    chat,
    deltas,
    request_counters,
    worker_map,
)
from m3deploy.core import catalog
from m3deploy.core.model import ClusterPlan
from m3deploy.core.simengine import tool_call_model

THINK_DELIMITERS = ("<mm:think>", "</mm:think>")  # MiniMax-M3's; the mock tokenizer has them as tokens
ENABLED = {"chat_template_kwargs": {"thinking_mode": "enabled"}}
TOOL_PROMPT = "What is the weather in Paris? Use the get_weather tool."
REASON_PROMPT = "Is 17 prime? Think briefly, then answer yes or no."
REASON_TOKENS = 512  # room for a real model's thinking and its answer; the mocker thinks for half of it
MARKUP = ("]<]minimax[>[", "<invoke", "<tool_call>")  # tool-call markup that must not survive into content


def _reasoning(obj) -> str:
    extra = getattr(obj, "model_extra", None) or {}
    return extra.get("reasoning_content") or extra.get("reasoning") or ""


def _split_ok(reasoning: str, content: str, how: str) -> str:
    """Both halves present, the delimiters in neither (the block's end never inside the reasoning, no delimiter
    in the content): a parser that takes everything for reasoning, or nothing, fails."""
    leaked = [d for d in THINK_DELIMITERS if d in content]
    if not reasoning:
        raise CheckFailed(f"{how}: no reasoning_content/reasoning with thinking_mode=enabled (content "
                          f"{content[:80]!r}): the frontend's reasoning parser did not split the think block")
    if THINK_DELIMITERS[1] in reasoning:
        raise CheckFailed(f"{how}: the reasoning holds {THINK_DELIMITERS[1]}: the parser missed the block's end "
                          f"({reasoning[:120]!r})")
    if not content.strip():
        raise CheckFailed(f"{how}: empty content after {len(reasoning)} chars of reasoning: the parser took the "
                          "answer for reasoning (or max_tokens ended the reply inside the think block)")
    if leaked:
        raise CheckFailed(f"{how}: content holds {leaked}: {content[:120]!r}")
    return (f"{how}: reasoning {len(reasoning)} chars (no {THINK_DELIMITERS[1]}), content {len(content)} chars "
            f"(no {'/'.join(THINK_DELIMITERS)})")


def _reasoning_split(ctx: Context) -> str:
    r = chat(ctx, REASON_PROMPT, max_tokens=REASON_TOKENS, extra_body=ENABLED)
    if not r.choices:
        raise CheckFailed("no choices")
    m = r.choices[0].message
    return _split_ok(_reasoning(m), m.content or "", "non-streaming") + f", {_usage_ok(r.usage)}"


def _reasoning_split_stream(ctx: Context) -> str:
    stream = chat(ctx, REASON_PROMPT, max_tokens=REASON_TOKENS, extra_body=ENABLED, stream=True)
    reasoning, content, chunks = [], [], 0
    for ch in _call(lambda: list(stream), "stream"):
        chunks += 1
        for c in ch.choices:
            if c.delta is not None:
                reasoning.append(_reasoning(c.delta))
                content.append(c.delta.content or "")
    return _split_ok("".join(reasoning), "".join(content), f"streaming ({chunks} chunks)")


def _tool_call(stream: bool) -> Callable[[Context], str]:
    def fn(ctx: Context) -> str:
        model = tool_call_model(ctx.plan)
        kw = dict(model=model, tools=TOOLS, tool_choice="auto", max_tokens=512)
        if not stream:
            r = chat(ctx, TOOL_PROMPT, **kw)
            if not r.choices:
                raise CheckFailed("no choices")
            c = r.choices[0]
            calls, finish = c.message.tool_calls or [], c.finish_reason
            names_args = [(tc.function.name, tc.function.arguments) for tc in calls if tc.function]
            content = c.message.content or ""
        else:
            chunks = _call(lambda: list(chat(ctx, TOOL_PROMPT, stream=True, **kw)), "stream")
            parts: dict[int, list[str]] = {}
            finish, content = None, ""
            for ch in chunks:
                for c in ch.choices:
                    finish = c.finish_reason or finish
                    content += (c.delta.content or "") if c.delta else ""
                    for tc in (c.delta.tool_calls or []) if c.delta else []:
                        p = parts.setdefault(tc.index, ["", ""])
                        p[0] += (tc.function.name or "") if tc.function else ""
                        p[1] += (tc.function.arguments or "") if tc.function else ""
            names_args = [tuple(v) for _, v in sorted(parts.items())]
        want = TOOLS[0]["function"]["name"]
        if not names_args:
            raise CheckFailed(f"model {model!r}: no tool_calls (finish_reason {finish}); content {content[:160]!r}: "
                              "the frontend's tool-call parser did not parse the reply")
        name, args = names_args[0]
        if name != want:
            raise CheckFailed(f"tool call names {name!r}, want {want!r}")
        try:
            parsed = json.loads(args or "")
        except ValueError:
            raise CheckFailed(f"tool call arguments are not JSON: {args!r}") from None
        if not isinstance(parsed, dict):
            raise CheckFailed(f"tool call arguments are not a JSON object: {args!r}")
        required = TOOLS[0]["function"]["parameters"]["required"]
        absent = [k for k in required if not isinstance(parsed.get(k), str) or not parsed[k]]
        if absent:
            raise CheckFailed(f"tool call {name}({args}) lacks the required parameter(s) {absent}: the parser "
                              "did not read the arguments")
        residue = [x for x in MARKUP if x in content]
        if residue:
            raise CheckFailed(f"content keeps tool-call markup {residue}: {content[:160]!r}")
        if finish != "tool_calls":
            raise CheckFailed(f"finish_reason {finish!r}, want 'tool_calls' (call {name}({args}))")
        return f"model {model}: {len(names_args)} tool call(s), {name}({args}), finish_reason {finish}"
    return fn


# A 1x1 PNG: the smallest image part a multimodal server must take (and a text-only one must refuse).
PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAA"
         "AABJRU5ErkJggg==")


def image_policy(plan: ClusterPlan) -> str:
    """What the plan says about an image part: "refused" (text-only: vLLM --language-model-only, and TensorRT-LLM,
    which serves M3 text-only) or "accepted" (the multimodal engines; and the mocker, whose frontend renders the
    text parts and drops the image: its mock model has no vision tower)."""
    if plan.engine == "trtllm" or "text-only" in plan.features:
        return "refused"
    return str((catalog.cpu_build(plan.engine, plan.platform) or {}).get("image_input") or "accepted")



def _image_input(ctx: Context) -> str:
    import openai

    want = image_policy(ctx.plan)
    content = [{"type": "text", "text": "What colour is this pixel?"},
               {"type": "image_url", "image_url": {"url": PIXEL}}]
    try:
        r = ctx.openai().chat.completions.create(model=ctx.plan.served_model_name, max_tokens=8,
                                                 messages=[{"role": "user", "content": content}])
    except openai.APIStatusError as e:
        if want == "refused" and 400 <= e.status_code < 500:
            return f"refused as planned (text-only): HTTP {e.status_code}"
        raise CheckFailed(f"an image part: HTTP {e.status_code} ({str(e)[:160]}), the plan says {want}") from None
    except openai.APIError as e:
        raise CheckFailed(f"an image part: {e}"[:300]) from None
    if want == "refused":
        raise CheckFailed("an image part was accepted (HTTP 200), but the plan serves text only")
    if not r.choices:
        raise CheckFailed(f"an image part: HTTP 200 without choices: {r}")
    return f"accepted as planned: HTTP 200, {_usage_ok(r.usage)}"


def served_models(plan: ClusterPlan) -> list[str]:
    return list(dict.fromkeys([plan.served_model_name, tool_call_model(plan)]))


def _model_ready(ctx: Context) -> str:
    out = []
    for m in served_models(ctx.plan):
        url = frontend_url(ctx.plan, f"/v1/models/{urllib.parse.quote(m, safe='')}/ready")
        status, body = ctx.http_get(url)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        if status != 200 or doc.get("ready") is not True:
            raise CheckFailed(f"GET {url}: HTTP {status}: {body.strip()[:200]}")
        workers = sum(t.get("workers", 0) for ns in (doc.get("namespaces") or {}).values()
                      for t in (ns.get("worker_types") or {}).values())
        out.append(f"{m}: ready, {workers} worker(s)")
    return "; ".join(out)


def _routable(ctx: Context) -> str:
    ids = {key: int(hexid, 16) for hexid, key in worker_map(ctx).items()}
    planned = [f"{h.name}/{s.name}" for h, s in instance_services(ctx.plan)]
    missing = [k for k in planned if k not in ids]
    if missing:
        raise CheckFailed(f"no Dynamo worker id in /metrics of {missing}")
    before = request_counters(ctx)
    back = {v: k for k, v in ids.items()}
    got = readiness.answered_by_each(ctx.plan.endpoint, ctx.plan.served_model_name, {k: ids[k] for k in planned},
                                     api_key=ctx.api_key, pools=worker_pools(ctx.plan))
    wrong = [f"{key} -> {back.get(got[key], got[key])}" for key in planned if got[key] != ids[key]]
    d = deltas(before, request_counters(ctx))
    ev = f"{len(planned) - len(wrong)}/{len(planned)} pinned requests answered by their worker; /metrics " + \
         ", ".join(f"{k} +{v}" for k, v in sorted(d.items()))
    if wrong:
        raise CheckFailed(ev + "; " + "; ".join(wrong))
    short = [k for k in planned if d.get(k, 0) < 1]
    if short:
        raise CheckFailed(ev + f"; the counters of {short} did not rise")
    return ev


def random_weights(plan: ClusterPlan) -> bool:
    """The workers serve random weights (an engine's CPU build on the testbed's tiny model, engines.yaml `cpu:`):
    nothing makes such a model close a think block or call a tool, so the checks that need it do not apply."""
    return bool((catalog.cpu_build(plan.engine, plan.platform) or {}).get("random_weights"))


def contract_checks(plan: ClusterPlan) -> list[Check]:
    if not plan.endpoint:
        return []
    m = plan.served_model_name
    enabled = {"model": m, "messages": _msgs(REASON_PROMPT), "max_tokens": REASON_TOKENS, **ENABLED}
    tool = {"model": tool_call_model(plan), "messages": _msgs(TOOL_PROMPT), "tools": TOOLS, "max_tokens": 512}
    out = []
    trained = not random_weights(plan)
    if "reasoning" in plan.features and trained:
        out += [Check("smoke/reasoning-split", "smoke", "frontend",
                      "thinking_mode=enabled: reasoning split from content", _reasoning_split,
                      _curl(plan, "/chat/completions", enabled)),
                Check("smoke/reasoning-split-stream", "smoke", "frontend",
                      "thinking_mode=enabled, streamed: reasoning split from content", _reasoning_split_stream,
                      _curl(plan, "/chat/completions", {**enabled, "stream": True}))]
    if "tool-calling" in plan.features and trained:
        out += [Check("smoke/tool-call", "smoke", "frontend", "tools: a parsed tool call, finish_reason tool_calls",
                      _tool_call(False), _curl(plan, "/chat/completions", tool)),
                Check("smoke/tool-call-stream", "smoke", "frontend", "tools, streamed: a parsed tool call",
                      _tool_call(True), _curl(plan, "/chat/completions", {**tool, "stream": True}))]
    out.append(Check("smoke/image-input", "smoke", "frontend", f"a request with an image part is {image_policy(plan)}",
                     _image_input, _curl(plan, "/chat/completions", {"model": m, "max_tokens": 8, "messages": [
                         {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PIXEL}}]}]})))
    if frontend(plan) is not None and plan.workers:
        out += [Check("smoke/model-ready", "smoke", "frontend", "/v1/models/{model}/ready says ready", _model_ready,
                      f"curl -sS {frontend_url(plan, '/v1/models/' + urllib.parse.quote(m, safe='') + '/ready')}"),
                Check("smoke/routable", "smoke", "frontend", "a request pinned to each worker is answered by it",
                      _routable, _curl(plan, "/chat/completions", {"model": m, "messages": _msgs("hi"), "max_tokens": 4,
                                                                   "nvext": {"backend_instance_id": 0,
                                                                             "extra_fields": ["worker_id"]}})
                      + "   # backend_instance_id: a worker's id from /health")]
    return out
