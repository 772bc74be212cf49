"""One 8x MI355X node serving the MXFP4 checkpoint at TP8."""

workers = [
    ("mi355x-fp4-01", {"ssh_hostname": "10.60.1.11", "m3_address": "10.60.1.11"}),
]
