"""Run the kubelet plugin for one driver on one node until SIGTERM:

    python -m fake_devices.kubeletplugin --driver gpu.fake.example.com --node node-1 --kubeconfig K \\
        --instance fake --namespace dra-harness-system

A node runs one such process per driver name. Prints `ready` once both sockets serve; SIGTERM or
SIGINT stops it cleanly (sockets removed, prepared claims kept in the checkpoint). With
`--publish-profile P` it first publishes the node's slices of its driver itself, as a vendor
driver's plugin does (no control-plane half needed).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fake_devices import entrypoint, kube
from fake_devices.errors import InvalidInput
from fake_devices.kubeletplugin import startup
from fake_devices.kubeletplugin.checkpoint import CheckpointError
from fake_devices.kubeletplugin.config import DEFAULT_MAX_MESSAGE_BYTES, DEFECTS, PluginConfig
from fake_devices.kubeletplugin.plugin import KubeletPlugin, PluginError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fake_devices.kubeletplugin",
                                     description="kubelet DRA plugin of the fake driver (node half); one per driver")
    parser.add_argument("--driver", required=True, help="driver name, e.g. gpu.<domain>")
    parser.add_argument("--node", required=True, help="the node this plugin runs on")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster configuration")
    parser.add_argument("--plugins-dir", type=Path, default=Path("/var/lib/kubelet/plugins"),
                        help="dra.sock goes to <dir>/<driver>/ (default: %(default)s)")
    parser.add_argument("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                        help="<driver>-reg.sock goes here (default: %(default)s)")
    parser.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"), help="default: %(default)s")
    parser.add_argument("--state-dir", type=Path, default=None, help="checkpoint directory (default: <plugins-dir>/<driver>)")
    parser.add_argument("--instance", default=None, help="fake-driver instance whose fault ConfigMap drives health")
    parser.add_argument("--namespace", default="dra-harness-system", help="namespace of that ConfigMap")
    parser.add_argument("--profile", default=None,
                        help="node profile (default: the node's dra-harness.x-k8s.io/profile label, if any)")
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES)
    parser.add_argument("--health-interval", type=float, default=10.0, help="resend health at least this often (s)")
    parser.add_argument("--rolling-update-id", default=None,
                        help="run beside another instance of this driver (upgrade): suffix of both socket names")
    parser.add_argument("--publish-profile", default=None, metavar="PROFILE",
                        help="publish this node's ResourceSlices of the driver from this profile (built-in name or "
                             "file) before serving; also the default of --profile")
    parser.add_argument("--defect", action="append", default=[], choices=[name for name, _ in DEFECTS],
                        help="self-tests only: break one rule of the kubelet-plugin contract on purpose")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    config = PluginConfig(driver=args.driver, node=args.node, plugins_dir=args.plugins_dir,
                          registry_dir=args.registry_dir, cdi_dir=args.cdi_dir, state_dir=args.state_dir,
                          instance=args.instance, namespace=args.namespace, profile=args.profile,
                          max_message_bytes=args.max_message_bytes, health_interval=args.health_interval,
                          rolling_update_id=args.rolling_update_id, publish_profile=args.publish_profile,
                          defects=frozenset(args.defect))
    stopping = entrypoint.stop_on_signals()
    try:
        api_client = kube.api_client(args.kubeconfig, pool_size=32)
        plugin = KubeletPlugin(config, api_client).start()
    except (InvalidInput, CheckpointError, PluginError, kube.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(startup.READY, flush=True)  # callers wait for this line (and the kubelet's registration: startup)
    stopping.wait()
    plugin.stop()
    api_client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
