#!/usr/bin/env python3
"""Write the mocker's planner profile (`--planner-profile-data DIR`) that m3_planner ships by default:
m3deploy/core/data/planner-profile/{prefill,decode}_raw_data.json, the profiler-style JSON that the Dynamo 1.6.1
wheel reads (dynamo/planner/monitoring/perf_metrics.py `_convert_prefill_profiling`, `_convert_decode_profiling`;
dynamo/mocker/args.py `resolve_planner_profile_data` converts the directory to the mocker's NPZ).

No GPU profile exists on the testbed, so the numbers come from a stated model, not a measurement:
- prefill: TTFT(ms) = 25 + 0.1 * ISL (a compute-bound prefill of 10k tokens/s plus a fixed 25 ms);
- decode: ITL(ms) = 5 + 40 * kv_usage + 0.002 * context_length (memory-bound decode slowing as the KV cache
  fills), on a grid of kv_usage 0.05..1.0 and context 128..8192, max_kv_tokens 65536.
Run it again to regenerate (deterministic): python3 scripts/make-planner-profile.py
"""
import json
import os

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "m3deploy", "core", "data",
                   "planner-profile")


def main():
    isl = [128 * 2 ** (i / 2) for i in range(13)]  # 128 .. 8192
    prefill = {"prefill_isl": [round(x) for x in isl], "prefill_ttft": [round(25 + 0.1 * x, 3) for x in isl]}
    kv, ctx, itl = [], [], []
    for u in [0.05 * i for i in range(1, 21)]:
        for c in (128, 512, 1024, 2048, 4096, 8192):
            kv.append(round(u, 3))
            ctx.append(c)
            itl.append(round(5 + 40 * u + 0.002 * c, 3))
    decode = {"x_kv_usage": kv, "y_context_length": ctx, "z_itl": itl, "max_kv_tokens": 65536}
    os.makedirs(OUT, exist_ok=True)
    for name, doc in (("prefill_raw_data.json", prefill), ("decode_raw_data.json", decode)):
        with open(os.path.join(OUT, name), "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    main()
