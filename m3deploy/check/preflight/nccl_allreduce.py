"""A short NCCL all-reduce across one host's GPUs; shipped to the host by `m3deploy preflight --nccl`.

Run as `python3 -m torch.distributed.run --standalone --nproc-per-node=N nccl_allreduce.py`, one
process per GPU. Rank 0 prints one line `M3_NCCL_RESULT {json}`: world size, per-size algorithm
and bus bandwidth (GB/s, nccl-tests' definition: busbw = algbw * 2(n-1)/n), and whether every sum
was right. Standalone on purpose: it imports only torch and the standard library.
"""
import json
import os
import sys
import time

SIZES_MIB = [int(s) for s in os.environ.get("M3_NCCL_SIZES_MIB", "8,64,256,1024").split(",") if s]
ITERS = int(os.environ.get("M3_NCCL_ITERS", "20"))
WARMUP = int(os.environ.get("M3_NCCL_WARMUP", "5"))


def main() -> int:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    results, correct = [], True
    for mib in SIZES_MIB:
        n = mib * 2**20 // 4
        x = torch.ones(n, dtype=torch.float32, device="cuda")
        for _ in range(WARMUP):
            dist.all_reduce(x)
        x.fill_(1.0)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        ok = bool(torch.all(x == float(world)).item())
        correct = correct and ok
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / ITERS
        t = torch.tensor([dt], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dt = float(t.item())
        algbw = n * 4 / dt / 1e9
        busbw = algbw * (2 * (world - 1) / world) if world > 1 else 0.0
        results.append({"size_mib": mib, "time_us": round(dt * 1e6, 1), "algbw_gbps": round(algbw, 2),
                        "busbw_gbps": round(busbw, 2), "correct": ok})
        del x
    if rank == 0:
        out = {
            "world_size": world,
            "gpu": torch.cuda.get_device_name(local_rank),
            "torch": torch.__version__,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
            "iters": ITERS,
            "results": results,
            "busbw_gbps": max((r["busbw_gbps"] for r in results), default=0.0),
            "correct": correct,
        }
        print("M3_NCCL_RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
