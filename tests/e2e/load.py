"""A bounded load client for the drills: concurrent streaming and non-streaming chat requests through the
cluster's OpenAI endpoint (the `openai` client on asyncio), counting every request and every failure.

Bounded twice: at most `max_requests` requests and at most `duration_s` seconds; `stop()` ends it early, but not
before `min_requests` were sent (a drill's floor: the load runs on past the drill until it is reached).
It runs in its own process (`python3 tests/e2e/load.py URL MODEL ...`, stopped by closing its stdin, stats as
JSON on stdout; times are time.monotonic(), one clock for every process of the machine): the test process
imports pyinfra, whose gevent monkey-patching turns threads into greenlets.
A request fails when the client raises (HTTP error, connection refused, timeout) or a reply has no
completion tokens / a stream ends without [DONE]-terminated content. Traffic goes only to `base_url`.
"""
from __future__ import annotations

import asyncio
import collections
import datetime
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Stats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    failures: list[tuple[float, str]] = field(default_factory=list)  # (time.monotonic(), reason) of each failure
    # (UTC wall time, reason, the error's message) of each failure: to find it in the hosts' journals
    details: list[tuple[str, str, str]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    spans: list[tuple[float, float, bool]] = field(default_factory=list)  # (start, end, ok) of every request

    def in_flight(self, t: float) -> int:
        """Requests sent before `t` (time.monotonic()) and not finished by then."""
        return sum(1 for a, b, _ in self.spans if a <= t < b)

    def failed_started_after(self, t: float) -> int:
        return sum(1 for a, _, ok in self.spans if a >= t and not ok)

    def summary(self) -> str:
        errs = ", ".join(f"{n}x {e}" for e, n in self.errors.most_common(4))
        return f"{self.sent} sent / {self.ok} ok / {self.failed} failed" + (f" ({errs})" if errs else "")


def _reason(e: BaseException) -> str:
    code = getattr(e, "status_code", None)
    return f"HTTP {code}" if code else type(e).__name__


class _Runner:
    def __init__(self, base_url: str, model: str, concurrency: int, max_requests: int, duration_s: float,
                 max_tokens: int, timeout_s: float, min_requests: int = 0):
        self.base_url, self.model, self.min_requests = base_url, model, min_requests
        self.concurrency, self.max_requests, self.duration_s = concurrency, max_requests, duration_s
        self.max_tokens, self.timeout_s = max_tokens, timeout_s
        self.stats = Stats()
        self.stop = threading.Event()
        self.ca_file = ""

    async def _one(self, client, i: int) -> None:
        msgs = [{"role": "user", "content": f"drill request {i}: count to ten, please."}]
        if i % 2:
            stream = await client.chat.completions.create(model=self.model, messages=msgs, stream=True,
                                                          max_tokens=self.max_tokens)
            chunks = 0
            async for ch in stream:
                if ch.choices and (ch.choices[0].delta.content or ch.choices[0].finish_reason):
                    chunks += 1
            if not chunks:
                raise ValueError("stream without content")
        else:
            r = await client.chat.completions.create(model=self.model, messages=msgs, max_tokens=self.max_tokens)
            if not (r.choices and r.usage and r.usage.completion_tokens > 0):
                raise ValueError("reply without completion tokens")

    async def _worker(self, client, counter, deadline: float) -> None:
        while time.monotonic() < deadline and not (self.stop.is_set() and self.stats.sent >= self.min_requests):
            i = next(counter)
            if i >= self.max_requests:
                return
            self.stats.sent += 1
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(self._one(client, i), self.timeout_s)
                self.stats.ok += 1
                self.stats.spans.append((t0, time.monotonic(), True))
            except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
                self.stats.spans.append((t0, time.monotonic(), False))
                self.stats.failed += 1
                self.stats.errors[_reason(e)] += 1
                self.stats.failures.append((time.monotonic(), _reason(e)))
                self.stats.details.append((datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S.%f"),
                                           _reason(e), str(e)[:300]))
                await asyncio.sleep(0.05)  # a refused connection must not spin

    async def _main(self) -> None:
        import itertools
        import os

        import openai

        # HTTPS with a CA (the edge's: --ca-file); the API key from the environment (M3_LOAD_API_KEY), never argv
        http = {}
        if self.ca_file:
            import ssl

            import httpx

            http["http_client"] = httpx.AsyncClient(verify=ssl.create_default_context(cafile=self.ca_file))
        # max_retries=0: the client must not hide a failure by retrying it
        async with openai.AsyncOpenAI(base_url=self.base_url, api_key=os.environ.get("M3_LOAD_API_KEY") or "none",
                                      max_retries=0, timeout=self.timeout_s, **http) as client:
            print("ready", flush=True)  # imports done (seconds on a loaded machine): Load.__enter__ waits for it
            deadline = time.monotonic() + self.duration_s
            counter = itertools.count()
            await asyncio.gather(*(self._worker(client, counter, deadline) for _ in range(self.concurrency)))



def main(argv=None) -> None:
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_url")
    ap.add_argument("model")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--min-requests", type=int, default=0)
    ap.add_argument("--duration-s", type=float, default=240)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--timeout-s", type=float, default=30)
    ap.add_argument("--ca-file", default="")
    a = ap.parse_args(argv)
    r = _Runner(a.base_url, a.model, a.concurrency, a.max_requests, a.duration_s, a.max_tokens, a.timeout_s, a.min_requests)
    r.ca_file = a.ca_file
    threading.Thread(target=lambda: (sys.stdin.read(), r.stop.set()), daemon=True).start()
    r.stats.started = time.monotonic()
    asyncio.run(r._main())
    r.stats.ended = time.monotonic()
    s = r.stats
    print(json.dumps({"sent": s.sent, "ok": s.ok, "failed": s.failed, "errors": dict(s.errors),
                      "failures": s.failures, "details": s.details, "started": s.started, "ended": s.ended,
                      "spans": s.spans}))


class Load:
    """`with Load(url, model) as load: ...drill...; stats = load.stop()`: the load client in a subprocess."""

    def __init__(self, base_url: str, model: str, concurrency: int = 4, duration_s: float = 240,
                 api_key: str | None = None, **kw):
        self.env = {"M3_LOAD_API_KEY": api_key} if api_key else {}
        self.args = [base_url, model, "--concurrency", str(concurrency), "--duration-s", str(duration_s)]
        self.args += [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        self.proc = None
        self.stats: Stats | None = None

    def __enter__(self) -> "Load":
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, __file__, *self.args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **self.env})
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the load client did not start: {line!r}")
        return self

    def stop(self) -> Stats:
        import json

        if self.stats is None:
            out, _ = self.proc.communicate(timeout=120)
            d = json.loads(out.strip().splitlines()[-1])
            self.stats = Stats(sent=d["sent"], ok=d["ok"], failed=d["failed"],
                               errors=collections.Counter(d["errors"]),
                               failures=[tuple(f) for f in d["failures"]],
                               details=[tuple(f) for f in d.get("details", [])], started=d["started"], ended=d["ended"],
                               spans=[tuple(x) for x in d.get("spans", [])])
        return self.stats

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.stop()


if __name__ == "__main__":
    main()
