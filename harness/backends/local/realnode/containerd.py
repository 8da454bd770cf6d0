"""containerd for a real node: its configuration, command line and image import, as data and one call.

Everything it owns lives under the node directory: its root and state, its socket, runc's state,
the pods' network namespaces (`netns_mounts_under_state_dir`), CNI configuration and IPAM state, and
the CDI spec directory the kubelet plugin writes to. `imports = []` keeps the machine's
/etc/containerd/conf.d out of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.backends.commands import Runner
from harness.binaries.noderuntime import NodeRuntime
from harness.core.errors import HarnessError
from harness.core.nodelayout import NodeDirs

NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin uses


def _s(value) -> str:
    """A TOML basic string or array of them (JSON's string syntax is valid TOML once non-ASCII
    characters are written as themselves: JSON's surrogate-pair escapes are not TOML)."""
    return json.dumps(value, ensure_ascii=False)


def config_toml(dirs: NodeDirs, runtime: NodeRuntime, sandbox_image: str) -> str:
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = {_s(str(dirs.containerd_root))}
state = {_s(str(dirs.containerd_state))}
imports = []
# Optional plugins that would touch machine paths (/opt/containerd, the NRI socket) or the network.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {_s(str(dirs.containerd_socket))}

[ttrpc]
  address = {_s(str(dirs.containerd_socket) + ".ttrpc")}

[{cri_runtime}]
  cdi_spec_dirs = {_s([str(dirs.cdi)])}
  # No CAP_SYS_RESOURCE here: never ask for an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

  [{cri_runtime}.containerd]
    default_runtime_name = "runc"

    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = {_s(str(runtime.runc))}
        Root = {_s(str(dirs.runc_root))}
        SystemdCgroup = false

  [{cri_runtime}.cni]
    bin_dirs = {_s([str(runtime.cni_dir)])}
    conf_dir = {_s(str(dirs.cni_conf))}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {_s(sandbox_image)}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def argv(dirs: NodeDirs, runtime: NodeRuntime) -> list[str]:
    return [str(runtime.path("containerd")), f"--config={dirs.containerd_config}"]


def env(runtime: NodeRuntime) -> dict[str, str]:
    # containerd finds its shim (containerd-shim-runc-v2) on PATH.
    return {"PATH": f"{runtime.directory}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}


def ctr(dirs: NodeDirs, runtime: NodeRuntime, *args: str, timeout: float = 120, runner: Runner | None = None) -> str:
    proc = (runner or Runner()).query([runtime.path("ctr"), f"--address={dirs.containerd_socket}",
                                       f"--namespace={NAMESPACE}", *args], timeout=timeout)
    if proc.returncode != 0:
        raise HarnessError(f"`ctr {' '.join(args)}` failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def import_images(dirs: NodeDirs, runtime: NodeRuntime, archives: dict[str, Path],
                  runner: Runner | None = None) -> None:
    for name, archive in archives.items():
        ctr(dirs, runtime, "images", "import", "--local", str(archive), runner=runner)
    listed = ctr(dirs, runtime, "images", "list", "--quiet", runner=runner).split()
    missing = [name for name in archives if name not in listed]
    if missing:
        raise HarnessError(f"images not in containerd after import: {', '.join(missing)}")
