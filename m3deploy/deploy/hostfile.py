"""One file the deploy writes on a host (m3deploy.deploy.hostfiles makes them all; m3deploy.deploy.edgefiles the
edge's), and where units go."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from m3deploy.core.model import Service

UNIT_DIR = "/etc/systemd/system"


def unit_path(s: Service) -> str:
    return f"{UNIT_DIR}/{s.unit}"


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
