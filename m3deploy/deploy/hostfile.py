"""One file the deploy writes on a host (m3deploy.deploy.hostfiles makes them all; m3deploy.deploy.edgefiles the
edge's), where units go, and a component's package mask."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from m3deploy.core import components
from m3deploy.core.model import Service

UNIT_DIR = "/etc/systemd/system"


def unit_path(s: Service) -> str:
    return f"{UNIT_DIR}/{s.unit}"


def package_mask(kind: str) -> HostFile | None:
    """The component's package unit masked (a link to /dev/null), before the package is installed: its postinst
    would start it, on all addresses or with Debian's config (m3deploy.core.components `package_unit`)."""
    unit = components.get(kind).package_unit
    return HostFile(f"{UNIT_DIR}/{unit}", link="/dev/null") if unit else None


@dataclass(frozen=True)
class HostFile:
    path: str
    text: str = ""
    mode: str = "0644"
    user: str = "root"
    group: str = "root"
    secret: bool = False  # holds secret values (masked when rendered without the secrets)
    link: str = ""  # a symbolic link to this target instead of a file
    source: str = ""  # the project file it is a copy of (files/...)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def index(self) -> dict:
        """Its entry in render's per-host index (no digest of a secret file: it would identify the secret)."""
        d = {"path": self.path, "mode": self.mode, "owner": f"{self.user}:{self.group}"}
        if self.link:
            d["link"] = self.link
        elif self.secret:
            d["secret"] = True
        else:
            d["sha256"] = self.sha256
        if self.source:
            d["source"] = self.source
        return d
