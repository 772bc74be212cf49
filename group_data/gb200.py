"""GB200 NVL72 trays: NVFP4, TP8 over two 4-GPU trays, EAGLE3-GQA, Dynamo + vLLM with the KV router.
The InferenceX AgentX aggregated lane (seed: "GB200: InferenceX AgentX aggregated")."""

m3_cluster = "gb200"
m3_platform = "gb200"
m3_variant = "nvfp4"
m3_parallel = "tp8"  # 8 GPUs = two 4-GPU trays per worker
m3_engine = "vllm"
m3_serving = "dynamo"
m3_features = ["eagle3-gqa", "text-only"]
m3_max_num_seqs = 64
m3_cudagraph_capture_sizes = [1, 2, 4, 8, 16, 32, 64]
