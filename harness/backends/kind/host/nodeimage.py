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
  (kindnetd is not available), and `kind_config_patches()` for the cluster (`failCgroupV1: false`,
  no CoreDNS, no default CNI).

The image is tagged `dra-harness.local/kind-node:v1.37.2-<key>`, where the key is the SHA-256 of
every input (recipe, packages, kind module checksum, binaries' SHA-256, dropped capabilities). It is
kept in the engine and saved once under `<cache>/kind-node/<tag>/` with its SHA-256, so a later build
with the same inputs is a `docker load` (or nothing, when the engine still has it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness import binaries
from harness.backends.commands import Runner, Step, command, run_quiet
from harness.backends.kind.host import wrapper_file
from harness.backends.local.realnode import images
from harness.binaries import gobuild, manifest, noderuntime
from harness.core import paths
from harness.core.errors import HarnessError
from harness.core.locking import file_lock
from harness.core.progress import Reporter
from harness.k8s import wait

ROOTFS_RECIPE = "1"  # bump when the Debian root filesystem changes without its package list changing
IMAGE_RECIPE = "2"  # bump when the node layer changes without any input changing (2: cri-base.json as kind's)
KIND_MODULE = "sigs.k8s.io/kind"
KIND_VERSION = "v0.33.0"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# kind's base image package list (images/base/Dockerfile), without what is not needed offline here
# (nfs-common, open-iscsi, fuse-overlayfs, curl), plus runc and the CNI plugins (kind builds its own),
# python3 for the runc wrapper and dbus for systemd.
PACKAGES = ("systemd", "dbus", "conntrack", "iptables", "nftables", "iproute2", "ethtool", "util-linux", "mount",
            "kmod", "libseccomp2", "pigz", "e2fsprogs", "bash", "ca-certificates", "jq", "procps", "runc",
            "containernetworking-plugins", "python3")
NODE_BINARIES = ("kubeadm", "kube-proxy")  # built for the image only (the cluster binaries lack them)
IMAGE_REPOSITORY = "dra-harness.local/kind-node"
KIND_PAUSE = "registry.k8s.io/pause:3.10"  # sandbox_image of kind's containerd config
WRAPPER_IN_NODE = "/usr/local/sbin/runc-wrapper"
RUNC_IN_NODE = "/usr/sbin/runc"  # Debian's runc package
CNI_BIN = "/usr/lib/cni"  # Debian's containernetworking-plugins
POD_SUBNET = "10.244.0.0/16"
ENTRYPOINT = '["/usr/local/bin/entrypoint", "/sbin/init"]'
CONTAINERD_TIMEOUT = 60.0
APT_TIMEOUT = 1800.0  # apt-get update or install of debootstrap, mirror permitting
DEBOOTSTRAP_TIMEOUT = 3600.0  # a Debian root filesystem (minutes here; a slow mirror is slower), and its tar


# --- pure parts -----------------------------------------------------------------------------------


def cache_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def image_tag(kubernetes_version: str, key: str) -> str:
    return f"{IMAGE_REPOSITORY}:v{kubernetes_version}-{key[:12]}"


def containerd_config(kind_config: str) -> str:
    """kind's containerd config with runc replaced by the wrapper (for both runtime handlers)."""
    marker = "    SystemdCgroup = true\n"
    if kind_config.count(marker) < 1:
        raise HarnessError("kind's containerd config.toml has no `SystemdCgroup = true` runtime option to extend; "
                           "its layout changed")
    return kind_config.replace(marker, marker + f'    BinaryName = "{WRAPPER_IN_NODE}"\n')


def cri_base_spec(default_spec: dict) -> dict:
    """kind's /etc/containerd/cri-base.json: `ctr oci spec` with the product-files hook, without rlimits."""
    spec = json.loads(json.dumps(default_spec))
    spec.setdefault("hooks", {}).setdefault("createContainer", []).append({"path": "/kind/bin/mount-product-files.sh"})
    spec.get("process", {}).pop("rlimits", None)
    return spec


def cni_conflist() -> str:
    """A node-local bridge: pods reach each other on the node and the API server; kindnetd (which would
    route between nodes) is not available offline."""
    return json.dumps({"cniVersion": "1.0.0", "name": "dra-harness-bridge", "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}, indent=2) + "\n"


def kind_config_patches() -> list[str]:
    """kubeadm config patches a cluster of this image needs (kind's `kubeadmConfigPatches`)."""
    # kubeadm's 1-minute API-call timeout (bootstrapping the admin ClusterRoleBinding) ran out on 2
    # cores busy with other work (measured: `kind create cluster` failed with "context deadline
    # exceeded"); a slow apiserver is what these machines have, so wait longer rather than fail.
    return [
        "kind: InitConfiguration\nskipPhases: [preflight, addon/coredns]\n"
        "timeouts: {controlPlaneComponentHealthCheck: 8m0s, kubernetesAPICall: 5m0s}\n",
        "kind: JoinConfiguration\nskipPhases: [preflight]\n"
        "timeouts: {kubernetesAPICall: 5m0s, tlsBootstrap: 8m0s, discovery: 8m0s}\n",
        "kind: KubeletConfiguration\nfailCgroupV1: false\n",
    ]


def control_plane_images(kubeadm_list: str) -> dict[str, str]:
    """image name -> the binary it runs, from `kubeadm config images list`; CoreDNS is skipped."""
    images = {}
    for line in kubeadm_list.split():
        repository = line.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        if repository in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd",
                          "pause"):
            images[line] = repository
    missing = {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "etcd", "pause"} - \
        set(images.values())
    if missing:
        raise HarnessError(f"`kubeadm config images list` did not name {', '.join(sorted(missing))}:\n{kubeadm_list}")
    return images


def enable_unit_links(unit_text: str, unit: str) -> list[str]:
    """The `.wants` links `systemctl enable` makes for a unit (from its [Install] WantedBy)."""
    links = []
    for line in unit_text.splitlines():
        if line.strip().startswith("WantedBy="):
            links += [f"etc/systemd/system/{target}.wants/{unit}" for target in line.split("=", 1)[1].split()]
    return links


@dataclass(frozen=True)
class Inputs:
    kubernetes_version: str
    kind_dir: Path  # sigs.k8s.io/kind@v0.33.0 in the module cache
    kind_sum: str
    cluster_bins: Path  # kubelet, kubectl, kube-apiserver, ... etcd
    node_bins: Path  # kubeadm, kube-proxy
    runtime_dir: Path  # containerd, containerd-shim-runc-v2, ctr, pause
    drops: tuple[str, ...]  # capabilities the wrapper removes

    def key_material(self) -> dict:
        def hashes(directory: Path) -> dict:
            return {name: entry["sha256"] for group in manifest.load(directory)["groups"].values()
                    for name, entry in group["files"].items()}
        return {"recipe": IMAGE_RECIPE, "rootfsRecipe": ROOTFS_RECIPE, "suite": DEBIAN_SUITE, "packages": sorted(PACKAGES), "kind": self.kind_sum,
                "kubernetes": self.kubernetes_version, "drops": sorted(self.drops),
                "binaries": {**hashes(self.cluster_bins), **hashes(self.node_bins), **hashes(self.runtime_dir)},
                "wrapper": hashlib.sha256(wrapper_file.SOURCE.read_bytes()).hexdigest()}


def overlay_files(inputs: Inputs, cri_spec: dict) -> dict[str, tuple[bytes | Path, int]]:
    """Everything the image adds to the Debian root filesystem: path -> (content or source file, mode)."""
    base = inputs.kind_dir / "images" / "base" / "files"
    files: dict[str, tuple[bytes | Path, int]] = {}
    for source in sorted(p for p in base.rglob("*") if p.is_file()):
        relative = source.relative_to(base).as_posix()
        executable = relative.startswith(("usr/local/bin/", "kind/bin/"))
        files[relative] = (source, 0o755 if executable else 0o644)
    files["etc/containerd/config.toml"] = (containerd_config((base / "etc/containerd/config.toml").read_text())
                                           .encode(), 0o644)
    files["etc/containerd/cri-base.json"] = (json.dumps(cri_spec, indent=2).encode(), 0o644)
    files["etc/cni/net.d/10-dra-harness-bridge.conflist"] = (cni_conflist().encode(), 0o644)
    files["kind/version"] = (f"v{inputs.kubernetes_version}".encode(), 0o644)
    files[WRAPPER_IN_NODE.lstrip("/")] = (wrapper_file.render("/usr/bin/python3", RUNC_IN_NODE, inputs.drops,
                                                              clamp_oom=True).encode(), 0o755)
    for name in ("kubelet", "kubectl"):
        files[f"usr/bin/{name}"] = (inputs.cluster_bins / name, 0o755)
    files["usr/bin/kubeadm"] = (inputs.node_bins / "kubeadm", 0o755)
    for name in ("containerd", "containerd-shim-runc-v2", "ctr"):
        files[f"usr/local/bin/{name}"] = (inputs.runtime_dir / name, 0o755)
    return files


def node_dockerfile(base_image: str) -> str:
    return (f"FROM {base_image}\nCOPY files/ /\nENV container=docker\nSTOPSIGNAL SIGRTMIN+3\n"
            f"ENTRYPOINT {ENTRYPOINT}\n")


def kube_proxy_dockerfile(base_image: str) -> str:
    return f"FROM {base_image}\nCOPY kube-proxy /usr/local/bin/kube-proxy\n"


def build_steps(docker: str, tag: str, work: Path, base_image: str, archives: list[Path], container: str) -> list[Step]:
    """The docker commands after the files are written (pure, so the test checks the sequence)."""
    exec_ = [docker, "exec", container]
    steps = [
        command("building the node filesystem image", docker, "build", f"--tag={tag}-stage", work / "node",
                timeout=1200),
        command("starting a build container", docker, "run", "--detach", f"--name={container}",
                "--entrypoint=sleep", "--security-opt=seccomp=unconfined", f"{tag}-stage", "infinity", timeout=120),
        command("starting containerd in the build container", *exec_, "bash", "-c",
                "nohup containerd >/var/log/containerd-build.log 2>&1 &", timeout=60),
        Step("waiting for containerd in the build container", action="wait-containerd"),
    ]
    for archive in archives:
        steps.append(command(f"preloading {archive.stem}", docker, "exec", "--interactive", container, "ctr",
                             "--namespace=k8s.io", "images", "import", "--no-unpack", "--digests",
                             "--label=io.cri-containerd.pinned=pinned", "-", pipe_from=("cat", str(archive)),
                             timeout=600))
    steps += [
        command("stopping containerd in the build container", *exec_, "pkill", "containerd", timeout=60),
        command(f"committing {tag}", docker, "commit", f"--change=ENTRYPOINT {ENTRYPOINT}", container, tag,
                timeout=600),
    ]
    return steps


# --- the build ------------------------------------------------------------------------------------


def kind_module(work: Path) -> tuple[Path, str]:
    """kind's module in the Go module cache (downloaded once): its directory and checksum."""
    out = Runner().query(["go", "mod", "download", "-json", f"{KIND_MODULE}@{KIND_VERSION}"], cwd=work, timeout=600)
    try:
        info = json.loads(out.stdout)
    except ValueError:
        info = {"Error": (out.stderr or "no output").strip()}
    if info.get("Error") or out.returncode != 0:
        raise HarnessError(f"cannot download {KIND_MODULE}@{KIND_VERSION} from the Go module proxy: {info.get('Error')}")
    return Path(info["Dir"]), info["Sum"]


def ensure_node_binaries(version: str, reporter: Reporter) -> Path:
    """kubeadm and kube-proxy v<version>, built once and cached with their SHA-256."""
    os_name, arch = binaries.host_platform()
    target = paths.cache_root() / "binaries" / f"kind-node-v{version}_{os_name}-{arch}"
    target.mkdir(parents=True, exist_ok=True)
    with manifest.locked(target):
        recorded = manifest.load(target)
        if not manifest.group_ok(target, recorded, "kubernetes-node", version):
            work = paths.cache_root() / "build" / f"kubernetes-v{version}-node"
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            gobuild.build_kubernetes_commands(version, NODE_BINARIES, work, out, reporter)
            for name in NODE_BINARIES:
                manifest.install_file(out / name, target / name)
            shutil.rmtree(out, ignore_errors=True)
            manifest.record(target, recorded, "kubernetes-node", version, NODE_BINARIES, "build")
    return target


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


def _write_tree(directory: Path, files: dict[str, tuple[bytes | Path, int]], links: dict[str, str]) -> None:
    for relative, (content, mode) in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, path)
        else:
            path.write_bytes(content)
        os.chmod(path, mode)
    for relative, target in links.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)


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
            _write_tree(work / "node" / "files", overlay_files(inputs, cri_base_spec(spec)), links)
            (work / "node" / "Dockerfile").write_text(node_dockerfile(base_image))
            archives = _image_archives(wanted, {**{n: cluster_bins / n for n in
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


def _image_archives(wanted: dict[str, str], sources: dict[str, Path], directory: Path, images) -> list[Path]:
    """OCI archives of the FROM-scratch images (all but kube-proxy); the pause image also under kind's name."""
    directory.mkdir(parents=True, exist_ok=True)
    names = {name: binary for name, binary in wanted.items() if binary != "kube-proxy"}
    pause = next(name for name, binary in names.items() if binary == "pause")
    if pause != KIND_PAUSE:
        names[KIND_PAUSE] = "pause"
    archives = []
    for name, binary in sorted(names.items()):
        path = f"/{binary}" if binary == "pause" else f"/usr/local/bin/{binary}"
        spec = images.ImageSpec(name=name, files={path: (sources[binary].read_bytes(), 0o755)},
                                entrypoint=[path] if binary == "pause" else [],
                                env=["PATH=/usr/local/bin:/usr/bin:/bin"])
        archive = directory / (name.rsplit("/", 1)[-1].replace(":", "_") + ".tar")
        archive.write_bytes(images.oci_archive(spec))
        archives.append(archive)
    return archives


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
