"""MIG geometry of the GPUs we emulate, from NVIDIA's published profile tables.

A GPU in MIG mode has 8 memory slices and 7 compute slices. A GPU instance profile occupies `size`
consecutive memory slices starting at one of its valid `starts` (what `nvidia-smi mig -lgipp` lists)
and `compute` compute slices. One JPEG/OFA media unit exists per GPU: only a `+me` profile or the
whole GPU (7g) takes it. On A100-SXM4-80GB and H100-SXM5-80GB the tables are the same shape; each
memory slice is 10 GB.
"""

from __future__ import annotations

from dataclasses import dataclass

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    name: str  # e.g. "3g.40gb"
    compute: int  # compute slices (GPCs)
    size: int  # memory slices occupied
    starts: tuple[int, ...]  # valid first memory slice of a placement
    memory_gb: int
    media: bool = False  # takes the GPU's single JPEG/OFA unit

    def memory_slices(self, start: int) -> range:
        return range(start, start + self.size)

    @property
    def device_suffix(self) -> str:
        """A DNS-label-safe form of the name: 3g.40gb -> 3g-40gb, 1g.10gb+me -> 1g-10gb-me."""
        return self.name.replace(".", "-").replace("+", "-")


def _eighty_gb_table() -> dict[str, MigProfile]:
    profiles = [
        MigProfile("1g.10gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 10),
        MigProfile("1g.10gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 10, media=True),
        MigProfile("1g.20gb", 1, 2, (0, 2, 4, 6), 20),
        MigProfile("2g.20gb", 2, 2, (0, 2, 4), 20),
        MigProfile("3g.40gb", 3, 4, (0, 4), 40),
        MigProfile("4g.40gb", 4, 4, (0,), 40),
        MigProfile("7g.80gb", 7, 8, (0,), 80, media=True),
    ]
    return {p.name: p for p in profiles}


TABLES: dict[str, dict[str, MigProfile]] = {
    "A100-SXM4-80GB": _eighty_gb_table(),
    "H100-SXM5-80GB": _eighty_gb_table(),
}
