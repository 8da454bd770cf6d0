"""The docker side of the node image's build: the FROM-scratch control-plane images as archives, the
Dockerfiles, and the sequence that preloads the images in a build container and commits the image."""

from __future__ import annotations

from pathlib import Path

from harness.backends.commands import Step, command
from harness.core.errors import HarnessError

KIND_PAUSE = "registry.k8s.io/pause:3.10"  # sandbox_image of kind's containerd config
ENTRYPOINT = '["/usr/local/bin/entrypoint", "/sbin/init"]'


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


def image_archives(wanted: dict[str, str], sources: dict[str, Path], directory: Path, images) -> list[Path]:
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
