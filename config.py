"""pyinfra's config file: pyinfra executes it from the working directory before it loads the inventory.

m3deploy reads the inventory first (m3deploy.deploy.preload), so an inventory or group_data file with a syntax
or encoding error, or a host listed twice, stops `pyinfra ... deploy.py` with one line naming file:line.
"""
import sys

from m3deploy.deploy import pyinfra_speed
from m3deploy.deploy.preload import check

# pyinfra's CLI turns bytecode writing off (pyinfra_cli/main.py: sys.dont_write_bytecode = True), so every run
# compiled deploy.py's ~70 modules (roles/, m3deploy/) from source again: ~0.3 s of each no-change re-run.
# Written once here (__pycache__/ is in .gitignore), they load from bytecode like any installed package.
sys.dont_write_bytecode = False
pyinfra_speed.install()  # from the first operation and fact on (m3deploy/deploy/pyinfra_speed.py)

check()
