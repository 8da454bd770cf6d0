"""One Go program in a versioned cache directory of its own, with a checksummed manifest (kind, the
dra-example-driver kubelet plugin): found and verified without a lock, built at most once, under the
directory's lock, by whichever process gets there first. How it is built is the caller's."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.binaries import cache_error, gobuild, host_platform, manifest, require_writable
from harness.core import paths
from harness.core.errors import BinariesError
from harness.core.progress import Reporter

# (work directory, the file to write the binary to, reporter): compiles it there
Build = Callable[[Path, Path, Reporter], None]


@dataclass(frozen=True)
class CachedGoBinary:
    group: str  # the manifest's group, and the cache directory's name before "-v<version>"
    version: str
    binary: str
    space_needed: int
    build: Build

    def cache_dir(self) -> Path:
        os_name, arch = host_platform()
        return paths.cache_root() / "binaries" / f"{self.group}-v{self.version}_{os_name}-{arch}"

    def locate(self) -> Path | None:
        """The verified cached binary, or None (nothing is built here)."""
        target = self.cache_dir()
        return target / self.binary if manifest.group_ok(target, manifest.load(target), self.group, self.version) \
            else None

    def ensure(self, reporter: Reporter | None = None) -> Path:
        """The cached binary, built first when it is missing or fails verification."""
        reporter = reporter or Reporter(quiet=True)
        target = self.cache_dir()
        if self.locate() is not None:
            return target / self.binary  # complete and verified: no lock needed
        try:
            target.mkdir(parents=True, exist_ok=True)
            with manifest.locked(target):
                recorded = manifest.load(target)
                if not manifest.group_ok(target, recorded, self.group, self.version):  # not built meanwhile
                    gobuild.require_go()
                    require_writable(target, self.space_needed, f"{self.group} v{self.version}")
                    work = paths.cache_root() / "build" / f"{self.group}-v{self.version}"
                    work.mkdir(parents=True, exist_ok=True)
                    out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
                    try:
                        self.build(work, out / self.binary, reporter)
                        manifest.install_file(out / self.binary, target / self.binary)
                    finally:
                        shutil.rmtree(out, ignore_errors=True)
                    manifest.record(target, recorded, self.group, self.version, (self.binary,), "build")
        except OSError as err:
            raise cache_error(target, err) from None
        if self.locate() is None:
            raise BinariesError(f"{self.binary} v{self.version} was built but fails verification in {target}")
        return target / self.binary
