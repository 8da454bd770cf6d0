"""A Debian root filesystem as a tar, made once per suite and package list by `debootstrap` (installed
with apt-get if missing), with kind's clean-ups for the node image's; what debootstrap left mounted is
unmounted before its tree is removed. `cache_key` keys it and the images built on it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from harness.backends.commands import Runner, command
from harness.binaries import manifest
from harness.core.errors import HarnessError
from harness.core.locking import file_lock
from harness.core.progress import Reporter

ROOTFS_RECIPE = "1"  # bump when the Debian root filesystem changes without its package list changing
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# kind's base image package list (images/base/Dockerfile), without what is not needed offline here
# (nfs-common, open-iscsi, fuse-overlayfs, curl), plus runc and the CNI plugins (kind builds its own),
# python3 for the runc wrapper and dbus for systemd.
PACKAGES = ("systemd", "dbus", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount",
            "kmod", "libseccomp2", "pigz", "e2fsprogs", "bash", "ca-certificates", "jq", "procps", "runc",
            "containernetworking-plugins", "python3")
CNI_BIN = "/usr/lib/cni"  # Debian's containernetworking-plugins
APT_TIMEOUT = 1800.0  # apt-get update or install of debootstrap, mirror permitting
DEBOOTSTRAP_TIMEOUT = 3600.0  # a Debian root filesystem (minutes here; a slow mirror is slower), and its tar


def cache_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def ensure_debootstrap(reporter: Reporter) -> str:
    found = shutil.which("debootstrap")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise HarnessError("building the kind node image needs debootstrap, and it cannot be installed here "
                           "(needs root and apt-get)", hint="install debootstrap, or pass --node-image")
    with reporter.step("installing debootstrap with apt-get"):
        apt = Runner(env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "debootstrap"]
        if apt.query(argv, timeout=APT_TIMEOUT).returncode != 0:
            apt.query(["apt-get", "update", "-q"], timeout=APT_TIMEOUT)
            done = apt.query(argv, timeout=APT_TIMEOUT)
            if done.returncode != 0:
                raise HarnessError("`apt-get install debootstrap` failed: " + done.stderr.strip()[-500:])
    return shutil.which("debootstrap") or "/usr/sbin/debootstrap"


def rootfs_tar(reporter: Reporter, cache: Path, suite: str = DEBIAN_SUITE, packages: tuple[str, ...] = PACKAGES,
               recipe: str = ROOTFS_RECIPE, cleanups: Callable[[Path], None] | None = None) -> Path:
    """A Debian root filesystem as a tar, made once per suite and package list (debootstrap takes
    minutes). The node image's (the defaults) gets kind's clean-ups; host.driverbase makes another."""
    key = cache_key({"suite": suite, "packages": sorted(packages), "recipe": recipe})[:16]
    with file_lock(cache / f"rootfs-{key}.lock"):  # two builds never debootstrap into one directory
        return _rootfs_tar(reporter, cache, key, suite, packages,
                           _kind_cleanups if cleanups is None and suite == DEBIAN_SUITE and packages == PACKAGES
                           else cleanups)


def _rootfs_tar(reporter: Reporter, cache: Path, key: str, suite: str, packages: tuple[str, ...],
                cleanups: Callable[[Path], None] | None) -> Path:
    target = cache / f"rootfs-{suite}-{key}.tar"
    digest_file = target.with_suffix(".sha256")
    if target.is_file() and digest_file.is_file() and manifest.sha256_file(target) == digest_file.read_text().strip():
        reporter.info(f"Debian root filesystem: cached ({target})")
        return target
    debootstrap = ensure_debootstrap(reporter)
    work = cache / f"rootfs-{key}.work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        log = cache / f"debootstrap-{suite}.log"
        runner = Runner(reporter)
        # its progress (stdout) in the log; a failure's last lines of stderr in the error
        runner.run(command(f"debootstrap {suite} ({len(packages)} packages and their dependencies; log: {log})",
                           debootstrap, "--variant=minbase", f"--include={','.join(packages)}", suite, work,
                           DEBIAN_MIRROR, stdout_file=log, timeout=DEBOOTSTRAP_TIMEOUT))
        unmount_under(work)
        if cleanups is not None:
            cleanups(work)
        partial = target.with_suffix(".partial")
        runner.run(command("packing the root filesystem", "tar", "--numeric-owner", "-C", work, "-cf", partial, ".",
                           timeout=DEBOOTSTRAP_TIMEOUT))
        partial.replace(target)
        digest_file.write_text(manifest.sha256_file(target) + "\n")
    finally:
        # A failed debootstrap leaves /proc (and maybe /sys) mounted in the tree: never delete through them.
        if not unmount_under(work):
            shutil.rmtree(work, ignore_errors=True)
        target.with_suffix(".partial").unlink(missing_ok=True)  # an interrupted pack
    return target


def mounts_under(directory: Path, mounts_text: str) -> list[str]:
    """Mount points at or below `directory` in a /proc/mounts text, deepest first."""
    prefix = str(directory.resolve()).rstrip("/")
    points = [line.split()[1].replace("\\040", " ") for line in mounts_text.splitlines() if len(line.split()) > 2]
    return sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True)


def unmount_under(directory: Path) -> list[str]:
    """Unmount everything below `directory`; returns the mount points that stay (then keep the tree)."""
    for point in mounts_under(directory, Path("/proc/mounts").read_text()):
        Runner().query(["umount", point])  # judged below: what stays mounted is returned
    return mounts_under(directory, Path("/proc/mounts").read_text())


def _kind_cleanups(root: Path) -> None:
    """What kind's base Dockerfile does after installing packages: no units started by default that do
    not belong in a node container, journald without kmsg, /sbin/init, the manifests directory."""
    for pattern in ("lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service",
                    "lib/systemd/system/multi-user.target.wants/*", "etc/systemd/system/*.wants/*",
                    "lib/systemd/system/local-fs.target.wants/*", "lib/systemd/system/sockets.target.wants/*udev*",
                    "lib/systemd/system/sockets.target.wants/*initctl*", "lib/systemd/system/basic.target.wants/*"):
        for path in root.glob(pattern):
            _inside(root, path.parent).joinpath(path.name).unlink()
    with open(_inside(root, root / "etc/systemd") / "journald.conf", "a") as handle:
        handle.write("ReadKMsg=no\n")
    init = _inside(root, root / "sbin") / "init"
    if init.is_symlink() or init.exists():
        init.unlink()
    init.symlink_to("/usr/lib/systemd/systemd")
    (root / "etc/kubernetes/manifests").mkdir(parents=True, exist_ok=True)
    (root / "opt/cni").mkdir(parents=True, exist_ok=True)
    (root / "opt/cni/bin").symlink_to(CNI_BIN)  # where containerd's CRI looks for the plugins


def _inside(root: Path, directory: Path) -> Path:
    """`directory` with its symlinks resolved, refused if that leaves the root filesystem: an absolute
    link in the tree (sbin -> /usr/sbin) must never make us change the machine's own files."""
    resolved = directory.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise HarnessError(f"{directory} leads outside the root filesystem {root} (to {resolved})")
    return resolved
