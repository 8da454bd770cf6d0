"""Run a legacy device plugin for one extended resource on one node until SIGTERM:

    python -m fake_devices.deviceplugin --resource example.com/gpu --node real-node-0 --profile tiny \\
        --plugins-dir <kubelet root>/plugins --registry-dir <kubelet root>/plugins_registry

Prints `ready` once it serves and is registered (watcher: the registration socket is up); SIGTERM or
SIGINT stops it cleanly (sockets removed; the kubelet then withdraws the devices).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from fake_devices import entrypoint
from fake_devices.deviceplugin.devices import Device, gpus_of_profile
from fake_devices.deviceplugin.plugin import REGISTRATIONS, DevicePluginConfig, FakeDevicePlugin
from fake_devices.deviceplugin.sockets import DevicePluginError
from fake_devices.errors import InvalidInput


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fake_devices.deviceplugin",
                                     description="a kubelet device plugin (v1beta1) serving fake GPUs")
    parser.add_argument("--resource", required=True, help="extended resource name, e.g. example.com/gpu")
    parser.add_argument("--node", required=True, help="the node this plugin runs on")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", help="advertise the whole GPUs this node profile gives the node")
    source.add_argument("--devices", help="comma-separated device IDs")
    parser.add_argument("--registration", choices=REGISTRATIONS, default="watcher")
    parser.add_argument("--plugins-dir", type=Path, default=Path("/var/lib/kubelet/plugins"))
    parser.add_argument("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"))
    parser.add_argument("--kubelet-socket", type=Path, default=Path("/var/lib/kubelet/device-plugins/kubelet.sock"))
    parser.add_argument("--state-dir", type=Path, default=None, help="where calls.jsonl goes")
    parser.add_argument("--pre-start-required", action="store_true",
                        help="have the kubelet call PreStartContainer before each container start")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    stopping = entrypoint.stop_on_signals()
    try:
        devices = (gpus_of_profile(args.profile, args.node) if args.profile
                   else [Device(i.strip()) for i in args.devices.split(",") if i.strip()])
        config = DevicePluginConfig(resource=args.resource, node=args.node, devices=tuple(devices),
                                    registration=args.registration, plugins_dir=args.plugins_dir,
                                    registry_dir=args.registry_dir, kubelet_socket=args.kubelet_socket,
                                    state_dir=args.state_dir, pre_start_required=args.pre_start_required)
        plugin = FakeDevicePlugin(config).start()
    except (InvalidInput, DevicePluginError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("ready", flush=True)  # callers wait for this line
    stopping.wait()
    plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
