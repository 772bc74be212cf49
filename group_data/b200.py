"""8x B200: the NVFP4 checkpoint with the EAGLE3 (MHA) draft head, text-only (seed: "Quantized Variant (NVFP4 on
Blackwell)")."""

m3_cluster = "b200"
m3_platform = "b200"
m3_variant = "nvfp4"
m3_parallel = "tp8"
m3_engine = "vllm"
m3_serving = "standalone"
m3_features = ["eagle3", "text-only"]
