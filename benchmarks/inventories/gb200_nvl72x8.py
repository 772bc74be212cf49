"""Eight GB200 NVL72 racks of 18 trays (144 trays, 576 GPUs) plus one control host.

TP8 over pairs of trays inside a rack: 72 Dynamo + vLLM workers. Used by benchmarks/plan_bench.py.
"""

control = [("ctl-01", {"ssh_hostname": "10.100.0.10", "m3_address": "10.100.0.10"})]
workers = (
    [
        (f"r{rack:02d}-t{tray:02d}", {"ssh_hostname": f"10.100.{rack}.{10 + tray}",
                                      "m3_address": f"10.100.{rack}.{10 + tray}", "m3_interface": "enP5p9s0",
                                      "m3_rack": rack, "m3_tray": tray})
        for rack in range(1, 9)
        for tray in range(1, 19)
    ],
    {
        "m3_cluster": "gb200-nvl72x8",
        "m3_platform": "gb200",
        "m3_variant": "nvfp4",
        "m3_parallel": "tp8",
        "m3_engine": "vllm",
        "m3_serving": "dynamo",
        "m3_features": ["eagle3-gqa", "text-only"],
    },
)
