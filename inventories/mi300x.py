"""One 8x MI300X node, MXFP8 tuned TP8."""

workers = [
    ("mi300x-01", {"ssh_hostname": "10.50.0.11", "m3_address": "10.50.0.11"}),
]
