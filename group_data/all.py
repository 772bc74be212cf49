"""Defaults for every cluster. Any m3_* key here can be overridden per cluster (group_data/<cluster>.py),
per group (control.py / workers.py) or per host (the inventory file). See README "Inventory contract"."""

m3_dynamo_version = "1.6.1"  # ai-dynamo on the controller's wheelhouse, hosts' venv and Dynamo worker images
m3_hf_cache = "/var/lib/m3/hf"  # where weights go on GPU hosts; mounted into engine containers
m3_state = "present"  # "absent" tears the deployment down
