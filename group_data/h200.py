"""One 8x H200 node: BF16, TP8 + expert parallel, standalone `vllm serve` (seed: "TP8 + Expert Parallel")."""

m3_cluster = "h200"
m3_platform = "h200"
m3_variant = "bf16"
m3_parallel = "tp8-ep"
m3_engine = "vllm"
m3_serving = "standalone"
m3_features = []
