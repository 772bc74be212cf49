"""GB200 NVL72 trays, disaggregated: Dynamo's MiniMax-M3 vLLM MXFP8 GB200 recipe (ai-dynamo/dynamo
recipes/minimax-m3/vllm/disagg/MXFP8/deploy.yaml): 1 prefill worker TP4 on one tray + 1 decode worker TP4 on the
other, block size 128, KV over NIXL (docs/DISAGG.md). Its flags are the layer
`recipe:dynamo-m3-vllm-disagg-mxfp8-gb200` (m3deploy/core/data/layers/65-disagg.yaml)."""

m3_cluster = "gb200-disagg"
m3_platform = "gb200"
m3_variant = "mxfp8"
m3_parallel = "tp4"  # one 4-GPU tray per worker
m3_engine = "vllm"
m3_serving = "dynamo"
m3_max_model_len = 40000  # the recipe's --max-model-len
m3_disagg = {"prefill": {"workers": 1, "parallel": "tp4"}, "decode": {"workers": 1, "parallel": "tp4"}}
