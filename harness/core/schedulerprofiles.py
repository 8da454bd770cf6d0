"""Scheduler profiles a cluster runs beside `default-scheduler`, and what the suite may rely on in them.

The DynamicResources plugin's two timeouts are plugin arguments (DynamicResourcesArgs): `filterTimeout`
(default 10 s, DRASchedulerFilterTimeout) bounds the allocator in Filter, `bindingTimeout` (default
600 s, DRADeviceBindingConditions + DRAResourceClaimDeviceStatus) bounds PreBind's wait for binding
conditions (k8s.io/kube-scheduler@v0.37.2 config/v1/types.go DynamicResourcesArgs; k8s.io/kubernetes@v1.37.2
pkg/scheduler/apis/config/v1/defaults.go SetDefaults_DynamicResourcesArgs). Testing what happens when they
pass needs them short, and shortening them for every pod would change the other tests. So the local
backend runs a second profile, with short timeouts, that only the pods of those tests name in
`spec.schedulerName`. Its arguments are set only where their gates are on: the scheduler refuses them
otherwise (pkg/scheduler/apis/config/validation/validation_pluginargs.go ValidateDynamicResourcesArgs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHORT_DRA_TIMEOUTS = "dra-harness-short-dra-timeouts"
# Long enough for an ordinary allocation on a loaded two-core machine (well under a millisecond per node
# when idle), far too short for a search over 2^24 subsets of devices.
FILTER_TIMEOUT_SECONDS = 1
# The API minimum is 1 s. PreBind looks at the conditions every 5 s, so 10 s is two looks.
BINDING_TIMEOUT_SECONDS = 10
FILTER_TIMEOUT_GATE = "DRASchedulerFilterTimeout"
BINDING_TIMEOUT_GATES = ("DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus")


@dataclass(frozen=True)
class SchedulerProfile:
    name: str
    filter_timeout_seconds: int | None = None  # None: not set in the profile (the plugin's default applies)
    binding_timeout_seconds: int | None = None

    def plugin_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.filter_timeout_seconds is not None:
            args["filterTimeout"] = f"{self.filter_timeout_seconds}s"
        if self.binding_timeout_seconds is not None:
            args["bindingTimeout"] = f"{self.binding_timeout_seconds}s"
        return args

    def config(self) -> dict[str, Any]:
        """The profile's entry in KubeSchedulerConfiguration.profiles."""
        entry: dict[str, Any] = {"schedulerName": self.name}
        args = self.plugin_args()
        if args:
            entry["pluginConfig"] = [{"name": "DynamicResources", "args": {
                "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "DynamicResourcesArgs", **args}}]
        return entry

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "filterTimeoutSeconds": self.filter_timeout_seconds,
                "bindingTimeoutSeconds": self.binding_timeout_seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SchedulerProfile:
        return cls(data["name"], data.get("filterTimeoutSeconds"), data.get("bindingTimeoutSeconds"))


def extra_profiles(gates: dict[str, bool]) -> tuple[SchedulerProfile, ...]:
    """The profiles a local cluster runs beside default-scheduler, for its effective feature gates."""
    filter_timeout = FILTER_TIMEOUT_SECONDS if gates.get(FILTER_TIMEOUT_GATE) else None
    binding_timeout = BINDING_TIMEOUT_SECONDS if all(gates.get(g) for g in BINDING_TIMEOUT_GATES) else None
    if filter_timeout is None and binding_timeout is None:
        return ()
    return (SchedulerProfile(SHORT_DRA_TIMEOUTS, filter_timeout, binding_timeout),)
