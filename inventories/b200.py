"""Two 8x B200 nodes, each an independent NVFP4 + EAGLE3 TP8 server."""

workers = [
    ("b200-01", {"ssh_hostname": "10.40.0.11", "m3_address": "10.40.0.11"}),
    ("b200-02", {"ssh_hostname": "10.40.0.12", "m3_address": "10.40.0.12"}),
]
