"""What `up` and `down` run, as a list of Steps (pure): the driver image build, `kind create cluster`,
the image loads into the nodes, the manifests and the waits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.backends import manifests
from harness.backends.commands import Step, action, command
from harness.backends.kind.preflight import Tools
from harness.core import schedulerprofiles
from harness.k8s.nodes import PAUSE_IMAGE, SHELL_IMAGE

DRIVER_IMAGE_LABEL = "dra-harness.x-k8s.io/image=fake-driver"  # deploy/Dockerfile's LABEL
KWOK_ARCHIVE = "kwok-image.tar"
KWOK_MANIFESTS = "kwok.yaml"
CREATE_WAIT = "300s"


@dataclass(frozen=True)
class Plan:
    """Everything `up` will do, computed before anything runs."""

    name: str
    directory: Path
    config: dict
    node_names: tuple[str, ...]
    deployment: manifests.Deployment
    build_image: bool
    steps: list[Step] = field(default_factory=list)
    scheduler_profiles: tuple[schedulerprofiles.SchedulerProfile, ...] = ()


def plan_steps(name: str, directory: Path, tools: Tools, nodes: tuple[str, ...], image: str, *,
               build_image: bool, deploy: bool, driver_base: str | None = None, simulated_nodes: int = 0,
               kwok_image: str | None = None) -> list[Step]:
    """The exact sequence of `up` (pure): files, image, cluster, image load, manifests, waits; then, with
    `simulated_nodes`, KWOK's controller (its image in the control-plane node only) and those nodes."""
    kubeconfig = directory / "kubeconfig"
    context = directory / "image"
    kubectl = [tools.kubectl, f"--kubeconfig={kubeconfig}"]
    steps = [action("write-files", "writing the kind config, the image build context and the kustomization")]
    if build_image:
        build = [tools.docker, "build", f"--tag={image}"]
        if driver_base:
            # The offline base holds every dependency, so the build reaches no network; the classic
            # builder, because BuildKit would fetch the Dockerfile's `# syntax=` frontend image.
            build = ["env", "DOCKER_BUILDKIT=0", tools.docker, "build", "--network=none",
                     f"--build-arg=BASE_IMAGE={driver_base}", f"--tag={image}"]
        steps += [
            command("building the project wheel", tools.python, "-m", "pip", "wheel", "--no-deps", "--quiet",
                    f"--wheel-dir={context / 'dist'}", manifests.repo_root(), timeout=600),
            command(f"building the driver image {image}" + (f" on {driver_base}" if driver_base else ""), *build,
                    f"--file={context / 'Dockerfile'}", context, timeout=1200),
            # the image this build untagged (400 MB each: every `up` left one in the engine's data root)
            command("removing the driver image the build replaced", tools.docker, "image", "prune", "--force",
                    f"--filter=label={DRIVER_IMAGE_LABEL}", timeout=300),
        ]
    steps += [
        command(f"creating kind cluster {name!r} ({len(nodes)} nodes)", tools.kind, "create", "cluster",
                f"--name={name}", f"--config={directory / 'kind-config.yaml'}", f"--kubeconfig={kubeconfig}",
                f"--wait={CREATE_WAIT}", timeout=900),
        command("checking the node names", tools.kind, "get", "nodes", f"--name={name}",
                expect_lines=frozenset(nodes), timeout=60),
    ]
    platform = [f"--platform={tools.platform}"] if tools.save_platform else []
    # Saved once, then imported into the nodes side by side (measured, 3 nodes: one save 6 s, the imports
    # 31 s together; saving and importing one node after the other took 30 s per node).
    archive = directory / "driver-image.tar"
    steps.append(command("saving the driver image", tools.docker, "save", *platform, f"--output={archive}", image,
                         timeout=600))
    loads = [command(f"loading the driver image into {node}", *_ctr_import(tools, node, platform), stdin_file=archive,
                     timeout=600) for node in nodes]
    if simulated_nodes:
        assert kwok_image, "simulated nodes need KWOK's image"
        # KWOK's controller runs on the control-plane node (kwok.in_cluster): its image goes there alone
        steps.append(command("saving the KWOK image", tools.docker, "save", *platform,
                             f"--output={directory / KWOK_ARCHIVE}", kwok_image, timeout=600))
        loads.append(command(f"loading the KWOK image into {nodes[0]}", *_ctr_import(tools, nodes[0], platform),
                             stdin_file=directory / KWOK_ARCHIVE, timeout=600))
    steps.append(Step(f"loading the images into {len(nodes)} nodes", together=tuple(loads)))
    steps.append(Step("naming the suite's shell and pause images in each node", together=tuple(
        command(f"naming the suite's images in {node}", tools.docker, "exec", node, "sh", "-c", suite_images_script(image),
                timeout=120) for node in nodes)))
    steps.append(action("drop-archive", "removing the saved images"))
    steps.append(action("wait-nodes", f"waiting for {len(nodes)} nodes to be Ready"))
    if deploy:
        steps += [
            command("rendering the manifests (kustomize)", *kubectl, "kustomize", directory / "deploy",
                    stdout_file=directory / "manifests.yaml", timeout=120),
            command("applying the manifests", *kubectl, "apply", f"--filename={directory / 'manifests.yaml'}",
                    timeout=300),
            action("wait-rollout", "waiting for the fake driver's controller and kubelet plugins"),
            action("wait-slices", "waiting until every node's ResourceSlices are published"),
        ]
    if simulated_nodes:
        steps += [
            command("deploying KWOK's controller", *kubectl, "apply", f"--filename={directory / KWOK_MANIFESTS}",
                    timeout=300),
            action("wait-kwok", "waiting for KWOK's controller"),
            action("simulated-nodes", f"creating {simulated_nodes} simulated (KWOK) nodes"),
        ]
    return steps


def suite_images_script(driver_image: str) -> str:
    """Tags, in a node's containerd, the names the suite's pods on a real node use (harness.k8s.nodes): the
    shell image is the driver image (Debian, with sh, env, cat, sleep: what the suite's commands need) and
    the pause image is the node's own sandbox image. No bytes are loaded for either."""
    ctr = "ctr --namespace=k8s.io images"
    return (f"{ctr} tag --force {driver_image} {SHELL_IMAGE} >/dev/null && "
            f"pause=$({ctr} ls --quiet | grep '^registry.k8s.io/pause:' | sort | tail -n 1) && "
            f'[ -n "$pause" ] && {ctr} tag --force "$pause" {PAUSE_IMAGE} >/dev/null')


def _ctr_import(tools: Tools, node: str, platform: list[str]) -> tuple[str, ...]:
    """Stream an image archive from stdin into a node's containerd (see the module's step 4)."""
    return (tools.docker, "exec", "--interactive", node, "ctr", "--namespace=k8s.io", "images", "import", *platform,
            "--digests", "-")


def down_steps(name: str, directory: Path, tools: Tools) -> list[Step]:
    return [command(f"deleting kind cluster {name!r}", tools.kind, "delete", "cluster", f"--name={name}",
                    f"--kubeconfig={directory / 'kubeconfig'}", timeout=300)]

