"""A single 8x H200 HGX node serving MiniMax-M3 BF16 standalone."""

workers = [
    ("h200-01", {"ssh_hostname": "10.30.0.11", "m3_address": "10.30.0.11"}),
]
