"""The fake driver image's base where deploy/Dockerfile's `python:3.13-slim-trixie` cannot be pulled.

On a machine that reaches no container registry (this project's CI VM; air-gapped CI), the base is
built here from what is reachable, and deploy/Dockerfile is then used as it is, with
`--build-arg BASE_IMAGE=<that image>`:

- a Debian trixie root filesystem made by `debootstrap` from Debian's packages: python3 (3.13, the
  Python of `python:3.13-slim-trixie`), pip, `python` as a command (python-is-python3), useradd;
- the driver's dependencies (deploy/driver-requirements.txt: kubernetes, pyyaml, grpcio, protobuf) as wheels for that Python and the
  engine's architecture, downloaded by pip on this machine (PyPI or the machine's own index) and
  installed in the image with `--no-index`. The driver build then finds every requirement
  satisfied, so neither build reaches a network (`--network=none`).

Detected, never assumed (`needs_offline_base`): the Dockerfile's base is used as it is when the engine
has it or `docker pull` gets it (GitHub runners). The tag is
`dra-harness.local/python-base:3.13-trixie-<key>`, the key being the SHA-256 of the recipe, the
package list, the requirement list and the architecture; the image stays in the engine (our own
dockerd keeps its data root), the root filesystem and the wheels are cached under `<cache>/driver-base/`.
"""

from __future__ import annotations

import re
import shutil
import sys
import uuid
from pathlib import Path

from harness.backends import manifests
from harness.backends.commands import Runner, command, run_quiet
from harness.backends.kind.host.debianrootfs import cache_key, rootfs_tar
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.locking import file_lock
from harness.core.progress import Reporter

RECIPE = "1"  # bump when the image changes without its inputs changing
SUITE = "trixie"  # Debian 13, as python:3.13-slim-trixie
PYTHON = "3.13"  # trixie's python3
GLIBC = (2, 41)  # trixie's libc6: the newest manylinux tag its wheels may carry
PACKAGES = ("python3", "python3-pip", "python-is-python3", "ca-certificates", "passwd")
REPOSITORY = "dra-harness.local/python-base"
REQUIREMENTS_FILE = "driver-requirements.txt"  # in deploy/, the image's build context
WHEEL_ARCH = {"amd64": "x86_64", "arm64": "aarch64", "s390x": "s390x", "ppc64le": "ppc64le"}
PULL_TIMEOUT = 300


# --- pure parts -----------------------------------------------------------------------------------


def dockerfile_base(dockerfile_text: str) -> str:
    """The default of `ARG BASE_IMAGE=` in deploy/Dockerfile: the one place the base is named."""
    match = re.search(r"^ARG BASE_IMAGE=(\S+)\s*$", dockerfile_text, re.M)
    if not match:
        raise HarnessError("deploy/Dockerfile has no `ARG BASE_IMAGE=<image>` line; the offline base replaces "
                           "that argument")
    return match[1]


def driver_requirements(text: str) -> list[str]:
    """The requirement lines of deploy/driver-requirements.txt (comments and blank lines dropped)."""
    return sorted(line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip())


def wheel_platforms(arch: str, glibc: tuple[int, int] = GLIBC) -> list[str]:
    """pip's --platform tags for a Linux engine of `arch` (Go's name): every manylinux up to trixie's libc."""
    machine = WHEEL_ARCH.get(arch, arch)
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(glibc[1], 16, -1)]
    return tags + [f"manylinux2014_{machine}", f"linux_{machine}"]


def download_argv(python: str, dest: Path, requirements_file: Path, arch: str) -> list[str]:
    argv = [python, "-m", "pip", "download", "--quiet", f"--dest={dest}", "--only-binary=:all:",
            f"--python-version={PYTHON}", "--implementation=cp", f"--abi=cp{PYTHON.replace('.', '')}",
            f"--requirement={requirements_file}"]
    return argv + [f"--platform={tag}" for tag in wheel_platforms(arch)]


def base_dockerfile(rootfs_image: str) -> str:
    # PIP_BREAK_SYSTEM_PACKAGES: this image's python belongs to the image (as in python:*-slim), so
    # deploy/Dockerfile's `python -m pip install` may install into it.
    return (f"FROM {rootfs_image}\n"
            "COPY wheels/ /tmp/wheels/\n"
            "RUN python3 -m pip install --no-index --find-links=/tmp/wheels --break-system-packages --no-compile "
            "--no-cache-dir --requirement=/tmp/wheels/requirements.txt && rm -rf /tmp/wheels\n"
            "ENV LANG=C.UTF-8 PIP_BREAK_SYSTEM_PACKAGES=1\n"
            'CMD ["python3"]\n')


def image_tag(key: str) -> str:
    return f"{REPOSITORY}:{PYTHON}-{SUITE}-{key[:12]}"


# --- detection ------------------------------------------------------------------------------------


def needs_offline_base(docker: str, env: dict, base: str, run=run_quiet) -> str | None:
    """Why the Dockerfile's base cannot be used (the engine lacks it and cannot pull it), or None."""
    if run([docker, "image", "inspect", base], timeout=60, env=env).returncode == 0:
        return None
    pulled = run([docker, "pull", "--quiet", base], timeout=PULL_TIMEOUT, env=env)
    if pulled.returncode == 0:
        return None
    lines = (pulled.stderr or pulled.stdout or "").strip().splitlines()
    return f"`docker pull {base}` failed: {lines[-1] if lines else f'exit status {pulled.returncode}'}"


# --- the build ------------------------------------------------------------------------------------


def build(docker: str, env: dict, arch: str, reporter: Reporter) -> str:
    """The offline base image in the engine (built once per key); returns its tag."""
    requirements = driver_requirements((manifests.deploy_dir() / REQUIREMENTS_FILE).read_text())
    key = cache_key({"recipe": RECIPE, "suite": SUITE, "packages": sorted(PACKAGES),
                     "requirements": requirements, "arch": arch})
    tag = image_tag(key)
    if run_quiet([docker, "image", "inspect", tag], timeout=60, env=env).returncode == 0:
        reporter.info(f"offline driver base {tag}: already in the Docker engine")
        return tag
    cache = paths.cache_root() / "driver-base"
    cache.mkdir(parents=True, exist_ok=True)
    rootfs = rootfs_tar(reporter, cache, SUITE, PACKAGES)
    wheels = _wheels(reporter, cache / f"wheels-{key[:16]}", requirements, arch)
    rootfs_image = f"dra-harness.local/debian-rootfs:{rootfs.stem.rsplit('-', 1)[1]}"
    work = cache / f"build-{uuid.uuid4().hex[:8]}"
    runner = Runner(reporter, env=env)
    try:
        if run_quiet([docker, "image", "inspect", rootfs_image], timeout=60, env=env).returncode != 0:
            runner.run(command(f"importing the Debian {SUITE} root filesystem", docker, "import", str(rootfs),
                               rootfs_image, timeout=900))
        shutil.copytree(wheels, work / "wheels")
        (work / "Dockerfile").write_text(base_dockerfile(rootfs_image))
        runner.run(command(f"building the offline driver base {tag}", docker, "build", "--network=none",
                           "--force-rm", f"--tag={tag}", work, timeout=1200))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tag


def _wheels(reporter: Reporter, target: Path, requirements: list[str], arch: str) -> Path:
    """The requirements' wheels for trixie's Python, downloaded once (a complete directory is kept)."""
    with file_lock(target.with_suffix(".lock")):
        if (target / "requirements.txt").is_file():
            reporter.info(f"the driver's dependency wheels: cached ({target})")
            return target
        partial = target.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            listing = partial / "requirements.in"
            listing.write_text("\n".join(requirements) + "\n")
            with reporter.step(f"downloading the driver's dependencies for Python {PYTHON} on {arch} (pip)"):
                done = run_quiet(download_argv(sys.executable, partial, listing, arch), timeout=1800)
                if done.returncode != 0:
                    raise HarnessError("`pip download` of the driver's dependencies failed: "
                                       + "\n".join(done.stderr.strip().splitlines()[-10:]),
                                       hint="the offline driver base needs a package index (PyPI or "
                                            "PIP_INDEX_URL/PIP_FIND_LINKS) for the project's dependencies")
            listing.rename(partial / "requirements.txt")  # written last: marks the directory complete
            partial.rename(target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target
