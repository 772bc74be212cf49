"""The local testbed (`m3deploy testbed up N`): simulated hosts, no GPU, Dynamo's mocker engine.
Same services, ports, env, ordering and readiness as a GPU cluster; only the worker argv differs."""

m3_platform = "sim"
m3_variant = "bf16"
m3_parallel = "tp1"
m3_engine = "mocker"
m3_serving = "dynamo"
m3_features = []
m3_mocker_speedup_ratio = 10
# Prometheus + exporters (docs/OBSERVE.md) are off, as everywhere by default; on the testbed turn them on with
# `--data m3_monitor=true --data m3_monitor_scrape_interval_s=5` on the deploy and every command
