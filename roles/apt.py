"""apt's retry setting (m3deploy.deploy.hostfiles.apt_conf, files/m3-apt.conf), on every host before the first
apt operation of the deploy (drivers, container runtime, etcd, NATS, rsync): apt before 3.0.3 can wait forever
on a delayed retry, and that stalls the whole deploy. Listed in the manifest; teardown removes it.

Reads nothing of the plan.
"""
from pyinfra.api import deploy

from m3deploy.deploy import hostfiles
from roles import hostops


@deploy("Configure apt's retries")
def configure_apt():
    hostops.ship(hostfiles.apt_conf())
