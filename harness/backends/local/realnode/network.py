"""Pod networking of a real node: one Linux bridge with a private /24, that never leaves the machine.

The node's address is the bridge's gateway address: the kubelet refuses a loopback node IP, and the
API server reaches the kubelet (logs, exec) at the node's InternalIP. No route, NAT or iptables rule
connects the bridge to anything else (the bridge plugin runs with ipMasq off), so pod traffic stays
on this machine. Each cluster gets its own bridge and subnet, chosen to overlap nothing the machine
already routes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from pathlib import Path

from harness.backends.commands import Runner
from harness.core.errors import HarnessError

SUBNET_POOL = ipaddress.IPv4Network("10.200.0.0/14")  # 1024 candidate /24s
BRIDGE_PREFIX = "drh-"


def bridge_name(node_id: str) -> str:
    return (BRIDGE_PREFIX + node_id)[:15]  # Linux interface names are at most 15 bytes


def _ip(runner: Runner | None, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = (runner or Runner()).query(["ip", *args], timeout=30)
    if check and proc.returncode != 0:
        raise HarnessError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def used_networks(runner: Runner | None = None) -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the machine has a route or an address in."""
    found = []
    for args in (("-4", "-j", "route", "show", "table", "all"), ("-4", "-j", "addr")):
        try:
            data = json.loads(_ip(runner, *args).stdout or "[]")
        except (ValueError, HarnessError):
            continue
        for entry in data:
            if "dst" in entry and entry["dst"] not in ("default", ""):
                try:
                    found.append(ipaddress.IPv4Network(entry["dst"], strict=False))
                except ValueError:
                    pass
            for addr in entry.get("addr_info", []):
                found.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return found


def choose_subnet(node_id: str, used: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """A /24 from SUBNET_POOL that overlaps nothing in `used`, stable for the same node id."""
    candidates = list(SUBNET_POOL.subnets(new_prefix=24))
    start = int(hashlib.sha1(node_id.encode()).hexdigest(), 16) % len(candidates)
    for offset in range(len(candidates)):
        subnet = candidates[(start + offset) % len(candidates)]
        if not any(subnet.overlaps(other) for other in used if other.prefixlen > 0):
            return subnet
    raise HarnessError(f"no free /24 left in {SUBNET_POOL} for a node bridge")


RESERVATION_PREFIX = "subnet-"  # reservations.py keys: subnet-10.200.5.0_24


def reservation_key(subnet: ipaddress.IPv4Network) -> str:
    return f"{RESERVATION_PREFIX}{subnet.network_address}_{subnet.prefixlen}"


def reserved_subnets(keys: list[str]) -> list[ipaddress.IPv4Network]:
    """The subnets that reservation keys name (a key that names none is skipped)."""
    found = []
    for key in keys:
        try:
            found.append(ipaddress.IPv4Network(key.removeprefix(RESERVATION_PREFIX).replace("_", "/")))
        except ValueError:
            continue
    return found


def gateway(subnet: ipaddress.IPv4Network) -> str:
    return str(next(subnet.hosts()))


def create_bridge(name: str, subnet: ipaddress.IPv4Network, runner: Runner | None = None) -> None:
    """Create the bridge with the gateway address before the kubelet starts (it is the node IP)."""
    if _ip(runner, "link", "show", name, check=False).returncode != 0:
        _ip(runner, "link", "add", name, "type", "bridge")
    _ip(runner, "addr", "replace", f"{gateway(subnet)}/{subnet.prefixlen}", "dev", name)
    _ip(runner, "link", "set", name, "up")


def bridge_exists(name: str, runner: Runner | None = None) -> bool:
    return _ip(runner, "link", "show", name, check=False).returncode == 0


def delete_bridge(name: str, runner: Runner | None = None) -> list[str]:
    if not bridge_exists(name, runner):
        return []
    proc = _ip(runner, "link", "del", name, check=False)
    return [] if proc.returncode == 0 else [f"bridge {name}: {proc.stderr.strip()}"]


def cni_conflist(network: str, bridge: str, subnet: ipaddress.IPv4Network, ipam_dir: Path) -> str:
    """The CNI configuration containerd reads: bridge + host-local IPAM, no masquerade, plus loopback."""
    config = {
        "cniVersion": "1.0.0",
        "name": network,
        "plugins": [
            {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False, "hairpinMode": False,
             "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                      "ranges": [[{"subnet": str(subnet), "gateway": gateway(subnet)}]],
                      "routes": [{"dst": str(subnet)}]}},
            {"type": "loopback"},
        ],
    }
    return json.dumps(config, indent=2) + "\n"

