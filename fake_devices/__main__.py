"""Run a fake-driver instance until SIGTERM: `python -m fake_devices --config driver.yaml`."""

from __future__ import annotations

import argparse
import logging
import sys

from fake_devices import config as driver_config
from fake_devices import entrypoint, kube
from fake_devices.controller import FakeDriver, PublishError
from fake_devices.errors import InvalidInput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fake_devices", description="fake DRA driver (control-plane half)")
    parser.add_argument("--config", required=True, help="FakeDriverConfig YAML file")
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster configuration")
    parser.add_argument("--delete-on-exit", action="store_true", help="remove this instance's slices when stopping")
    parser.add_argument("--publish-timeout", type=float, default=600.0,
                        help="seconds to publish every node's slices before giving up with an error")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    try:
        config = driver_config.load(args.config)
    except InvalidInput as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        api_client = kube.api_client(args.kubeconfig, pool_size=config.workers + 8)
    except kube.ConfigException as err:
        print(f"error: --kubeconfig: {err}", file=sys.stderr)
        return 2
    stopping = entrypoint.stop_on_signals()
    driver = FakeDriver(config, api_client).start()
    try:
        driver.publish(timeout=args.publish_timeout)
    except PublishError as err:
        # not "ready": the harness sees the exit and shows these lines (`cluster up` fails instead of
        # leaving nodes without devices)
        print(f"error: could not publish the devices of instance {config.instance}:\n{err}", file=sys.stderr,
              flush=True)
        driver.stop(delete_slices=args.delete_on_exit)
        return 3
    logging.info("published slices for %d nodes of instance %s", len(driver._nodes), config.instance)
    print("ready", flush=True)  # the harness waits for this line
    stopping.wait()
    driver.stop(delete_slices=args.delete_on_exit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
