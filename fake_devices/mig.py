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
    multiprocessors: int = 0  # SMs of the instance (fewer than compute/7 of the GPU's: some are held back)

    def memory_slices(self, start: int) -> range:
        return range(start, start + self.size)

    @property
    def device_suffix(self) -> str:
        """A DNS-label-safe form of the name: 3g.40gb -> 3g-40gb, 1g.10gb+me -> 1g-10gb-me."""
        return self.name.replace(".", "-").replace("+", "-")


def _eighty_gb_table(sms: dict[str, int]) -> dict[str, MigProfile]:
    """The 80GB tables of A100 and H100 share geometry; they differ in streaming multiprocessors."""
    shapes = [  # name, compute slices, memory slices, valid starts, GB, media unit
        ("1g.10gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 10, False),
        ("1g.10gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 10, True),
        ("1g.20gb", 1, 2, (0, 2, 4, 6), 20, False),
        ("2g.20gb", 2, 2, (0, 2, 4), 20, False),
        ("3g.40gb", 3, 4, (0, 4), 40, False),
        ("4g.40gb", 4, 4, (0,), 40, False),
        ("7g.80gb", 7, 8, (0,), 80, True),
    ]
    return {name: MigProfile(name, compute, size, starts, gb, media, sms[name.split("+")[0]])
            for name, compute, size, starts, gb, media in shapes}


TABLES: dict[str, dict[str, MigProfile]] = {
    "A100-SXM4-80GB": _eighty_gb_table({"1g.10gb": 14, "1g.20gb": 14, "2g.20gb": 28, "3g.40gb": 42,
                                        "4g.40gb": 56, "7g.80gb": 98}),
    "H100-SXM5-80GB": _eighty_gb_table({"1g.10gb": 16, "1g.20gb": 26, "2g.20gb": 32, "3g.40gb": 60,
                                        "4g.40gb": 64, "7g.80gb": 132}),
}
