"""8x MI300X: the MXFP8 checkpoint with the InferenceX MI300X tuning (plain TP8, text-only, async scheduling)."""

m3_cluster = "mi300x"
m3_platform = "mi300x"
m3_variant = "mxfp8"
m3_parallel = "tp8"
m3_engine = "vllm"
m3_serving = "standalone"
m3_max_model_len = 131072  # the recipe's "$MAX_MODEL_LEN"
