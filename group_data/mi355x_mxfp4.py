"""8x MI355X, AMD Quark MXFP4 at TP8 (seed: "Quantized Variant (MXFP4 on MI355X)"), vision encoder data-parallel."""

m3_cluster = "mi355x-mxfp4"
m3_platform = "mi355x"
m3_variant = "mxfp4"
m3_parallel = "tp8"
m3_engine = "vllm"
m3_serving = "standalone"
