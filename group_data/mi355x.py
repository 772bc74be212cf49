"""8x MI355X, MXFP8 at TP4: two engines per node (GPUs 0-3 and 4-7), AITER + INT4 QuickReduce, nightly ROCm image."""

m3_cluster = "mi355x"
m3_platform = "mi355x"
m3_variant = "mxfp8"
m3_parallel = "tp4"
m3_engine = "vllm"
m3_serving = "standalone"
