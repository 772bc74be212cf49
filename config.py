"""pyinfra's config file: pyinfra executes it from the working directory before it loads the inventory.

m3deploy reads the inventory first (m3deploy.deploy.preload), so an inventory or group_data file with a syntax
or encoding error, or a host listed twice, stops `pyinfra ... deploy.py` with one line naming file:line.
"""
from m3deploy.deploy.preload import check

check()
