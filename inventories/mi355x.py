"""One 8x MI355X node: two MXFP8 TP4 engines."""

workers = [
    ("mi355x-01", {"ssh_hostname": "10.60.0.11", "m3_address": "10.60.0.11"}),
]
