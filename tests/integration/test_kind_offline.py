"""kind on a machine without Docker and without a registry, for real: `dra-harness kind build-node-image`
(our own dockerd, the runc wrapper, the offline v1.37.2 node image), then kind creates a 1 control-plane
+ 2 worker cluster from that image, a pod runs on a worker, the cluster is deleted, our dockerd stops
and the host is as it was.

Opt-in (it may install docker.io and debootstrap with apt-get and takes about 30 minutes cold, 2
minutes with the image cached): DRA_HARNESS_KIND_E2E=1, kind >= v0.33.0 on PATH (or DRA_HARNESS_KIND
naming it), and a machine where the harness can provide an engine (`dra-harness kind engine`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import kind_leaks
import pytest
import yaml

from harness.backends.kind import preflight as kind_preflight
from harness.backends.kind.host import docker, hostnet, nodebuild, nodefiles, nodeinputs
from harness.backends.local.realnode import host as machine_settings
from harness.core.progress import Reporter
from harness.k8s import wait
from harness.k8s.client import Clients

pytestmark = [pytest.mark.integration, pytest.mark.kind_e2e]


WHY_NOT = kind_leaks.why_not("may install docker.io, ~30 min cold")


@pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))
def test_offline_node_image_makes_a_three_node_cluster_and_leaves_the_host_as_it_was(tmp_path):
    kind = os.environ.get("DRA_HARNESS_KIND") or kind_preflight.which_with_cached_kind("kind")
    host_before, bridges_before = hostnet.snapshot(), kind_leaks.docker_bridges()
    owners_before = machine_settings.owners()  # other clusters' real nodes: the kubelet sysctls are theirs now
    built = subprocess.run([sys.executable, "-m", "harness.cli", "kind", "build-node-image"], capture_output=True,
                           text=True, timeout=3600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    tag = built.stdout.strip().splitlines()[-1]
    assert tag.startswith(f"{nodeinputs.IMAGE_REPOSITORY}:v1.37.2-")
    assert not docker.Layout.default().record.exists()  # the command's own dockerd is stopped again

    name = f"off-{uuid.uuid4().hex[:6]}"
    config = {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "name": name,
              "networking": {"disableDefaultCNI": True}, "kubeadmConfigPatches": nodefiles.kind_config_patches(),
              "nodes": [{"role": r, "image": tag} for r in ("control-plane", "worker", "worker")]}
    (tmp_path / "kind.yaml").write_text(yaml.safe_dump(config))
    kubeconfig = tmp_path / "kubeconfig"
    user = f"test-{name}"
    engine = docker.acquire(user, Reporter(quiet=True))
    try:
        created = subprocess.run([kind, "create", "cluster", f"--config={tmp_path / 'kind.yaml'}",
                                  f"--kubeconfig={kubeconfig}", "--wait=300s"], capture_output=True, text=True,
                                 env=engine.environ(), timeout=900)
        assert created.returncode == 0, created.stderr[-3000:]
        clients = Clients(kubeconfig)
        try:
            assert clients.version.get_code().git_version == "v1.37.2"
            wait.until("3 Ready nodes", lambda: sum(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                for n in clients.core.list_node().items) == 3, timeout=300, interval=1.0)
            clients.core.create_namespaced_pod("default", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                "spec": {"nodeName": f"{name}-worker", "containers": [{
                    "name": "pause", "image": nodebuild.KIND_PAUSE, "imagePullPolicy": "Never"}]}})
            # A sandbox on a worker: runc through the in-node wrapper (oom_score_adj clamped, caps dropped).
            wait.pod_phase(clients, "default", "probe", "Running", timeout=180)
        finally:
            clients.close()
    finally:
        subprocess.run([kind, "delete", "cluster", f"--name={name}", f"--kubeconfig={kubeconfig}"],
                       capture_output=True, env=engine.environ(), timeout=300)
        problems = docker.release(user, Reporter(quiet=True))
    assert problems == []
    assert not docker.Layout.default().record.exists()
    assert kind_leaks.docker_bridges() <= bridges_before, f"bridges left: {kind_leaks.docker_bridges() - bridges_before}"
    now = hostnet.snapshot()
    assert now["forwardPolicy"] == host_before["forwardPolicy"]
    for name_ in hostnet.KUBELET_SYSCTLS if not (owners_before or machine_settings.owners()) else ():
        # the kind kubelets' machine-wide writes are undone by the record shared with real nodes (restored
        # when its last owner leaves: while other clusters' real nodes run, not yet)
        assert now["sysctls"].get(name_) == host_before["sysctls"].get(name_), name_
