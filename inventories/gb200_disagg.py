"""One control host and two GB200 trays of one NVL72 rack, disaggregated: tray 01 is the prefill pool, tray 02
the decode pool (m3_disagg_role; without it the trays join the pools in this order anyway). group_data/
gb200_disagg.py holds the recipe's choices."""

control = [
    ("gb200-ctl-01", {"ssh_hostname": "10.20.0.10", "m3_address": "10.20.0.10"}),
]
workers = [
    ("gb200-r01-t01", {"ssh_hostname": "10.20.1.11", "m3_address": "10.20.1.11", "m3_interface": "enP5p9s0",
                       "m3_rack": 1, "m3_tray": 1, "m3_disagg_role": "prefill"}),
    ("gb200-r01-t02", {"ssh_hostname": "10.20.1.12", "m3_address": "10.20.1.12", "m3_interface": "enP5p9s0",
                       "m3_rack": 1, "m3_tray": 2, "m3_disagg_role": "decode"}),
]
