"""Worker layout: how one engine instance of `size` GPUs sits on hosts of G GPUs each. The plan lays workers out
with it and validation checks it; the arithmetic lives only here.

size <= G: `G // size` workers per host, each on its own consecutive GPUs (G must divide by size).
size >  G: one worker spans `size // G` whole hosts (size must be a multiple of G; hosts in whole groups).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence, TypeVar

from m3deploy.core import catalog, settings

T = TypeVar("T")


def gpus_per_host(data: Mapping) -> int:
    """The host's GPU count: m3_gpus_per_host, else its platform's (catalog)."""
    return int(settings.get(data, "m3_gpus_per_host")
               or catalog.platform(settings.get(data, "m3_platform"))["gpus_per_host"])


@dataclass(frozen=True)
class Layout:
    size: int  # GPUs of one engine instance (tensor- or data-parallel size)
    gpus_per_host: int

    @property
    def multi_host(self) -> bool:
        return self.size > self.gpus_per_host

    @property
    def span(self) -> int:
        """Hosts per worker."""
        return self.size // self.gpus_per_host if self.multi_host else 1

    @property
    def per_host(self) -> int:
        """Workers per host."""
        return 1 if self.multi_host else self.gpus_per_host // self.size

    @property
    def fits(self) -> bool:
        """Whole workers: size divides a host's GPUs, or is a multiple of them."""
        g = self.gpus_per_host
        return self.size % g == 0 if self.multi_host else g % self.size == 0

    def devices(self, k: int) -> tuple[int, ...]:
        """GPU indices of the k-th worker on a host (a multi-host worker takes every GPU)."""
        return tuple(range(self.gpus_per_host)) if self.multi_host else tuple(range(k * self.size, (k + 1) * self.size))

    def groups(self, hosts: Sequence[T]) -> list[Sequence[T]]:
        """The hosts of each worker, in order (a trailing partial group is dropped; validation reports it)."""
        return [hosts[i:i + self.span] for i in range(0, len(hosts) - self.span + 1, self.span)]
