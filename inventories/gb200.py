"""One control host and two GB200 trays of one NVL72 rack. TP8 spans the two trays (rank 0 = tray 01)."""

control = [
    ("gb200-ctl-01", {"ssh_hostname": "10.20.0.10", "m3_address": "10.20.0.10"}),
]
workers = [
    ("gb200-r01-t01", {"ssh_hostname": "10.20.1.11", "m3_address": "10.20.1.11", "m3_interface": "enP5p9s0",
                       "m3_rack": 1, "m3_tray": 1}),
    ("gb200-r01-t02", {"ssh_hostname": "10.20.1.12", "m3_address": "10.20.1.12", "m3_interface": "enP5p9s0",
                       "m3_rack": 1, "m3_tray": 2}),
]
