"""An offline kind node image for Kubernetes v1.37.2, built here from Debian's packages, kind's own Go
module and the harness's binaries; for machines (and air-gapped CI) where kindest/node cannot be pulled.

    dra-harness kind build-node-image

What goes in (each from where it comes):

- a Debian bookworm root filesystem made by `debootstrap` from Debian's packages (systemd, iptables,
  runc, the CNI plugins, python3 for the runc wrapper, ...), with kind's systemd clean-ups applied;
- kind's base files (entrypoint, systemd units, containerd config, kubelet drop-ins) from
  `sigs.k8s.io/kind@v0.33.0` `images/base/files`, read from the Go module cache;
- kubeadm, kubelet, kubectl v1.37.2 (kubeadm and kube-proxy built here like the cluster binaries);
  containerd 2.4.2 (harness.binaries.noderuntime, CDI-capable);
- the control-plane images `kubeadm config images list` names for v1.37.2, built from the local
  binaries (FROM scratch; kube-proxy on the Debian root filesystem, it needs iptables) and preloaded
  into the image's containerd, as kind's own builder does (`ctr images import --no-unpack`);
- the fixes this kind of machine needs: containerd's runc is the runc wrapper (drops the capabilities
  the host's bounding set lacks, clamps a negative oom_score_adj to 0), a static bridge CNI conflist
  (kindnetd is not available), and `nodefiles.kind_config_patches()` for the cluster (`failCgroupV1: false`,
  no CoreDNS, no default CNI).

The image is tagged `dra-harness.local/kind-node:v1.37.2-<key>`, where the key is the SHA-256 of
every input (recipe, packages, kind module checksum, binaries' SHA-256, dropped capabilities). It is
kept in the engine and saved once under `<cache>/kind-node/<tag>/` with its SHA-256, so a later build
with the same inputs is a `docker load` (or nothing, when the engine still has it).

This module is the entry (`build`); the parts are debianrootfs.py (the Debian root filesystem),
nodeinputs.py (the inputs, the key and the tag), nodefiles.py (the files the image adds) and
nodebuild.py (the docker sequence).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from harness import binaries
from harness.backends.commands import Runner, command, run_quiet
from harness.backends.kind.host.debianrootfs import cache_key, rootfs_tar
from harness.backends.kind.host.nodebuild import (
    build_steps,
    control_plane_images,
    image_archives,
    kube_proxy_dockerfile,
    node_dockerfile,
)
from harness.backends.kind.host.nodefiles import cri_base_spec, enable_unit_links, overlay_files, write_tree
from harness.backends.kind.host.nodeinputs import Inputs, ensure_node_binaries, image_tag, kind_module
from harness.backends.local.realnode import images
from harness.binaries import manifest, noderuntime
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.progress import Reporter
from harness.k8s import wait

CONTAINERD_TIMEOUT = 60.0


def build(engine, reporter: Reporter, kubernetes_version: str = binaries.DEFAULT_KUBERNETES,
          drops: tuple[str, ...] = ()) -> str:
    """Build (or find cached) the node image in `engine`; returns its tag."""
    started = time.monotonic()
    cache = paths.cache_root() / "kind-node"
    cache.mkdir(parents=True, exist_ok=True)
    with reporter.step("the binaries (built from the Go module proxy when missing)"):
        cluster_bins = binaries.ensure(binaries.Versions(kubernetes=kubernetes_version), reporter=reporter).directory
        node_bins = ensure_node_binaries(kubernetes_version, reporter)
        # containerd, ctr and pause only: runc and the CNI plugins come from the image's own Debian packages
        runtime_dir = noderuntime.ensure_built(reporter)
        kind_dir, kind_sum = kind_module(cache)
    inputs = Inputs(kubernetes_version, kind_dir, kind_sum, cluster_bins, node_bins, runtime_dir, tuple(drops))
    key = cache_key(inputs.key_material())
    tag = image_tag(kubernetes_version, key)
    env = engine.environ()
    if _run([engine.docker, "buildx", "version"], env).returncode != 0:
        env["DOCKER_BUILDKIT"] = "0"  # no buildx plugin (Debian's docker.io): the classic builder
    if _run([engine.docker, "image", "inspect", tag], env).returncode == 0:
        reporter.info(f"node image {tag}: already in the Docker engine")
        return tag
    saved = cache / tag.rsplit(":", 1)[1] / "image.tar"
    digest = saved.with_suffix(".sha256")
    if saved.is_file() and digest.is_file() and manifest.sha256_file(saved) == digest.read_text().strip():
        with reporter.step(f"loading the cached node image {tag}"):
            Runner(reporter, env=env).run(command("docker load", engine.docker, "load", f"--input={saved}",
                                                  timeout=900))
        return tag

    rootfs = rootfs_tar(reporter, cache)
    work = cache / f"build-{uuid.uuid4().hex[:8]}"
    base_image = f"dra-harness.local/kind-rootfs:{rootfs.stem.rsplit('-', 1)[1]}"
    container = f"dra-harness-node-build-{uuid.uuid4().hex[:8]}"
    runner = Runner(reporter, env=env, actions={"wait-containerd": lambda: _wait_containerd(engine, container)})
    try:
        if _run([engine.docker, "image", "inspect", base_image], env).returncode != 0:
            runner.run(command("importing the root filesystem", engine.docker, "import", str(rootfs), base_image,
                               timeout=900))
        spec = json.loads(_check([str(runtime_dir / "ctr"), "oci", "spec"], "ctr oci spec"))
        listing = _check([str(node_bins / "kubeadm"), "config", "images", "list",
                          f"--kubernetes-version=v{kubernetes_version}"], "kubeadm config images list")
        wanted = control_plane_images(listing)
        links = {}
        for unit in ("kubelet.service", "containerd.service", "undo-mount-hacks.service"):
            text = (kind_dir / "images/base/files/etc/systemd/system" / unit).read_text()
            links.update({link: f"/etc/systemd/system/{unit}" for link in enable_unit_links(text, unit)})
        links["etc/systemd/system/systemd-binfmt.service"] = "/dev/null"  # masked, as kind does
        with reporter.step("writing the node's files and the control-plane images"):
            write_tree(work / "node" / "files", overlay_files(inputs, cri_base_spec(spec)), links)
            (work / "node" / "Dockerfile").write_text(node_dockerfile(base_image))
            archives = image_archives(wanted, {**{n: cluster_bins / n for n in
                                                  ("kube-apiserver", "kube-controller-manager", "kube-scheduler",
                                                   "etcd")}, "pause": runtime_dir / "pause"},
                                      work / "images", images)
        proxy_image = next(name for name, binary in wanted.items() if binary == "kube-proxy")
        shutil.copyfile(node_bins / "kube-proxy", _mkdir(work / "proxy") / "kube-proxy")
        os.chmod(work / "proxy" / "kube-proxy", 0o755)
        (work / "proxy" / "Dockerfile").write_text(kube_proxy_dockerfile(base_image))
        proxy_archive = work / "images" / "kube-proxy.tar"
        runner.run_all([
            command(f"building {proxy_image}", engine.docker, "build", f"--tag={proxy_image}", work / "proxy",
                    timeout=900),
            command(f"saving {proxy_image}", engine.docker, "save", f"--output={proxy_archive}", proxy_image,
                    timeout=900),
        ])
        runner.run_all(build_steps(engine.docker, tag, work, base_image, [*archives, proxy_archive], container))
        with reporter.step(f"saving the node image to the cache ({saved.parent})"):
            saved.parent.mkdir(parents=True, exist_ok=True)
            partial = saved.with_suffix(".partial")
            runner.run(command("docker save", engine.docker, "save", f"--output={partial}", tag, timeout=1200))
            partial.replace(saved)
            digest.write_text(manifest.sha256_file(saved) + "\n")
    finally:
        _run([engine.docker, "rm", "--force", "--volumes", container], env)
        _run([engine.docker, "rmi", f"{tag}-stage"], env)
        shutil.rmtree(work, ignore_errors=True)
    reporter.info(f"node image {tag} built in {time.monotonic() - started:.0f}s")
    return tag


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return run_quiet(argv, timeout=300, env=env)


def _check(argv: list[str], what: str) -> str:
    done = run_quiet(argv, timeout=120)
    if done.returncode != 0:
        raise HarnessError(f"`{what}` exited with {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def _wait_containerd(engine, container: str) -> None:
    wait.until(f"containerd in build container {container} to answer `ctr version`",
               lambda: _run([engine.docker, "exec", container, "ctr", "version"], engine.environ()).returncode == 0,
               timeout=CONTAINERD_TIMEOUT, interval=0.5,
               diagnostics=lambda: _run([engine.docker, "exec", container, "tail", "-20",
                                         "/var/log/containerd-build.log"], engine.environ()).stdout)
