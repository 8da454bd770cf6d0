"""The written kubelet-plugin contract of DRA, one rule per row: what `dra-harness sanity` checks.

Every rule names where it is written, at the versions Kubernetes 1.37.2 ships: the kubelet's gRPC
API (`k8s.io/kubelet@v0.37.2`), the plugin helper library every Go driver builds on
(`k8s.io/dynamic-resource-allocation@v0.37.2`, package `kubeletplugin`), the kubelet itself
(`k8s.io/kubernetes@v1.37.2`) and the CDI specification. A rule's check is the test of
conformance/sanity named in `check`; a failed check's message starts with the rule id. docs/contract.md
is this table written out (tests/unit keeps the two equal).

`level` is MUST where the source says must / is an error / is required, SHOULD where the rule
follows from the source without its saying so in so many words (the check still fails, and its
message says SHOULD).
"""

from __future__ import annotations

from dataclasses import dataclass

KUBELET_API = "k8s.io/kubelet@v0.37.2"
HELPER = "k8s.io/dynamic-resource-allocation@v0.37.2"
KUBELET = "k8s.io/kubernetes@v1.37.2"
API = "k8s.io/api@v0.37.2"
CDI_SPEC = "CDI specification v1.1.0 (cncf-tags/container-device-interface SPEC.md)"


@dataclass(frozen=True)
class Rule:
    id: str
    level: str  # MUST | SHOULD
    text: str  # the rule in one sentence
    sources: tuple[str, ...]  # module@version path: symbol (or a public issue that shows it matters)
    check: str  # the test function of conformance/sanity that enforces it
    area: str  # registration | prepare | unprepare | restart | concurrency | health | slices | container

    def label(self) -> str:
        return f"{self.id} ({self.level})"


RULES: tuple[Rule, ...] = (
    # --- registration -------------------------------------------------------------------------------
    Rule("KP-REG-SOCKET", "MUST",
         "The plugin creates a registration socket for each of its drivers in the kubelet's plugin registration "
         "directory, named <driver>-reg.sock (or a rolling-update name that starts with the driver).",
         (f"{HELPER} kubeletplugin/draplugin.go: RegistrarDirectoryPath, RegistrarSocketFilename",
          f"{KUBELET} pkg/kubelet/pluginmanager/pluginwatcher: the kubelet registers the sockets it finds there"),
         "test_registration_socket", "registration"),
    Rule("KP-REG-INFO", "MUST",
         "GetInfo on the registration socket answers type DRAPlugin, the driver's name and an endpoint.",
         (f"{KUBELET_API} pkg/apis/pluginregistration/v1/api.proto: PluginInfo",
          f"{KUBELET_API} pkg/apis/pluginregistration/v1/constants.go: DRAPlugin"),
         "test_get_info", "registration"),
    Rule("KP-REG-VERSIONS", "MUST",
         "supported_versions names at least one DRA service the 1.37 kubelet speaks (v1.DRAPlugin, "
         "v1beta1.DRAPlugin); otherwise the kubelet refuses the registration.",
         (f"{KUBELET} pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go: validateSupportedServices",
          f"{KUBELET} pkg/kubelet/cm/dra/plugin/dra_plugin.go: servicesSupportedByKubelet"),
         "test_supported_versions", "registration"),
    Rule("KP-REG-ENDPOINT", "MUST",
         "The endpoint is the absolute path of a unix socket that serves NodePrepareResources and "
         "NodeUnprepareResources in every DRAPlugin version the plugin advertises.",
         (f"{KUBELET} pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go: add (dials \"unix:\" + endpoint)",
          f"{KUBELET} pkg/kubelet/cm/dra/plugin/dra_plugin.go: NodePrepareResources (calls the chosen version)"),
         "test_endpoint_serves_advertised_versions", "registration"),
    Rule("KP-REG-NOTIFY", "MUST",
         "NotifyRegistrationStatus of a registration that succeeded is answered without error; one that failed "
         "is answered (an error is allowed: the helper library returns one) and the plugin keeps serving.",
         (f"{KUBELET_API} pkg/apis/pluginregistration/v1/api.proto: service Registration, RegistrationStatus",
          f"{HELPER} kubeletplugin/registrationserver.go: NotifyRegistrationStatus"),
         "test_notify_registration_status", "registration"),
    # --- prepare --------------------------------------------------------------------------------------
    Rule("KP-PREP-ANSWER", "MUST",
         "NodePrepareResources answers every claim of the request, keyed by the claim's UID, and no other claim.",
         (f"{KUBELET_API} pkg/apis/dra/v1/api.proto: NodePrepareResourcesResponse.claims",
          f"{KUBELET} pkg/kubelet/cm/dra/manager.go: prepareResources (\"returned result for unknown claim UID\", "
          "\"skipped %d ResourceClaims\")"),
         "test_prepare_answers_the_claim", "prepare"),
    Rule("KP-PREP-DEVICES", "MUST",
         "Each device a Prepare answers has a pool and a device name, is a device the claim's allocation gives "
         "this driver, and its request_names (if any) are requests of the claim for that device, without a "
         "subrequest part.",
         (f"{KUBELET_API} pkg/apis/dra/v1/api.proto: Device (pool_name, device_name required; request_names)",
          f"{HELPER} kubeletplugin/draplugin.go: Device, stripSubrequestNames"),
         "test_prepared_devices_are_the_allocated_ones", "prepare"),
    Rule("KP-PREP-CDI", "MUST",
         "Every CDI device ID a Prepare answers is a qualified name <vendor>/<class>=<name> and, once Prepare "
         "returns, resolves to a device of a CDI spec in the node's CDI directory.",
         (f"{HELPER} kubeletplugin/draplugin.go: Device.CDIDeviceIDs, DRAPlugin.PrepareResourceClaims (CDI specs "
          "created on the fly)", f"{CDI_SPEC}: qualified device names, spec directories"),
         "test_cdi_ids_resolve", "prepare"),
    Rule("KP-PREP-REPEAT", "MUST",
         "A repeated NodePrepareResources of a prepared claim succeeds with the same devices and CDI IDs.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.PrepareResourceClaims (\"This call must be "
          "idempotent\")",),
         "test_prepare_is_idempotent", "prepare"),
    Rule("KP-PREP-MULTI", "MUST",
         "A NodePrepareResources of several claims prepares each of them.",
         (f"{KUBELET_API} pkg/apis/dra/v1/api.proto: NodePrepareResourcesResponse (\"It is an error if some "
          "claim listed in NodePrepareResourcesRequest does not get prepared\")",),
         "test_prepare_several_claims", "prepare"),
    Rule("KP-PREP-UNALLOCATED", "MUST",
         "A claim that is not allocated is not prepared: the call fails or the claim's entry carries an error.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.PrepareResourceClaims (\"verifies that all claims are "
          "really allocated\"), getResourceClaims",),
         "test_unallocated_claim_is_refused", "prepare"),
    Rule("KP-PREP-REPLACED", "MUST",
         "A claim whose UID is not the one in the request (deleted and recreated under its name) is not prepared.",
         (f"{HELPER} kubeletplugin/draplugin.go: getResourceClaims (\"got replaced\")",),
         "test_replaced_claim_is_refused", "prepare"),
    Rule("KP-PREP-MISSING", "MUST",
         "A claim that does not exist is not prepared.",
         (f"{HELPER} kubeletplugin/draplugin.go: getResourceClaims (\"retrieve claim\")",),
         "test_missing_claim_is_refused", "prepare"),
    Rule("KP-PREP-OTHER-NODE", "SHOULD",
         "A claim whose devices were allocated on another node is not prepared on this one.",
         (f"{API} resource/v1/types.go: AllocationResult.NodeSelector (where the allocated devices are available)",
          f"{KUBELET} pkg/kubelet/cm/dra/manager.go: the kubelet prepares only the claims of pods bound to its node"),
         "test_claim_of_another_node_is_refused", "prepare"),
    # --- unprepare ----------------------------------------------------------------------------------
    Rule("KP-UNPREP-CLEAN", "MUST",
         "NodeUnprepareResources of a prepared claim succeeds and undoes Prepare: the CDI spec files Prepare wrote "
         "are gone, and none of the claim's CDI IDs resolves from a file Prepare created.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.UnprepareResourceClaims (\"must undo whatever work "
          "PrepareResourceClaims did\")",),
         "test_unprepare_cleans_up", "unprepare"),
    Rule("KP-UNPREP-REPEAT", "MUST",
         "NodeUnprepareResources of a claim that is not prepared (never, or no longer) succeeds.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.UnprepareResourceClaims (\"it is not an error if this "
          "gets called for a ResourceClaim which is not currently prepared\")",),
         "test_unprepare_is_idempotent", "unprepare"),
    Rule("KP-UNPREP-DELETED", "MUST",
         "NodeUnprepareResources works after the claim was deleted from the API server.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.UnprepareResourceClaims (\"the original ResourceClaims "
          "may have been deleted already\")",),
         "test_unprepare_after_the_claim_is_deleted", "unprepare"),
    Rule("KP-UNPREP-ANSWER", "MUST",
         "NodeUnprepareResources answers every claim of the request, keyed by the claim's UID.",
         (f"{KUBELET_API} pkg/apis/dra/v1/api.proto: NodeUnprepareResourcesResponse (\"all claims in the request "
          "must have an entry in the response\")",
          f"{KUBELET} pkg/kubelet/cm/dra/manager.go: unprepareResources"),
         "test_unprepare_answers_every_claim", "unprepare"),
    # --- restart --------------------------------------------------------------------------------------
    Rule("KP-RESTART-STATE", "MUST",
         "After a crash (SIGKILL) and a restart the plugin registers again, answers a repeated Prepare of a claim "
         "prepared before the crash as before, and Unprepare of that claim cleans up.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.UnprepareResourceClaims (\"The driver might have been "
          "restarted in the meantime\")",),
         "test_state_survives_a_crash", "restart"),
    Rule("KP-RESTART-CDI", "MUST",
         "After a node reboot (the CDI directory, a tmpfs, is empty; the plugin starts again) a repeated Prepare "
         "of a claim prepared before makes every CDI ID it answers resolve again.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.PrepareResourceClaims (idempotent \"because the kubelet "
          "might have to ask for preparation multiple times, for example if it gets restarted\")",
          "kubernetes/kubernetes#141433 (pods stuck in CreateContainerError after a reboot)"),
         "test_prepare_after_a_reboot_restores_cdi", "restart"),
    # --- concurrency ------------------------------------------------------------------------------------
    Rule("KP-CONCURRENT", "MUST",
         "Concurrent NodePrepareResources and NodeUnprepareResources calls for different claims all succeed.",
         (f"{HELPER} kubeletplugin/draplugin.go: Serialize (a driver that opts out \"must handle concurrency "
          "itself\")",
          f"{KUBELET} pkg/kubelet/cm/dra/manager.go: PrepareResources runs per pod, from concurrent pod workers"),
         "test_concurrent_calls", "concurrency"),
    # --- health -------------------------------------------------------------------------------------
    Rule("KP-HEALTH-INITIAL", "MUST",
         "A plugin that advertises DRAResourceHealth and does not decline it (UNIMPLEMENTED) sends a first "
         "NodeWatchResources report at once (within 10 s), covering every device it publishes on the node.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.WatchHealthStatus (\"Send an initial DeviceHealthReport "
          "covering all devices\")", f"{HELPER} kubeletplugin/health.go: ErrHealthNotSupported (UNIMPLEMENTED)",
          f"{KUBELET_API} pkg/apis/dra-health/v1/api.proto: NodeWatchResourcesResponse (a complete list)"),
         "test_health_first_report", "health"),
    Rule("KP-HEALTH-DEVICES", "MUST",
         "Health reports name only devices of the driver's pools, and each message is at most 1024 characters.",
         (f"{KUBELET_API} pkg/apis/dra-health/v1/api.proto: DeviceIdentifier, DeviceHealth.message",),
         "test_health_names_published_devices", "health"),
    Rule("KP-HEALTH-REFRESH", "MUST",
         "Reports come again within each device's health check timeout (30 s when not set), even when nothing "
         "changed; otherwise the kubelet shows the devices Unknown.",
         (f"{HELPER} kubeletplugin/draplugin.go: DRAPlugin.WatchHealthStatus (\"re-send reports within that "
          "window even when nothing changed\")",
          f"{KUBELET_API} pkg/apis/dra-health/v1/api.proto: DeviceHealth.health_check_timeout_seconds"),
         "test_health_is_refreshed", "health"),
    # --- slices ---------------------------------------------------------------------------------------
    Rule("KP-SLICES-NODE", "MUST",
         "The ResourceSlices the plugin publishes for its node name that node (or a node selector or all nodes), "
         "and it publishes at least one device.",
         (f"{API} resource/v1/types.go: ResourceSliceSpec.NodeName, NodeSelector, AllNodes",
          f"{HELPER} kubeletplugin/draplugin.go: PublishResources"),
         "test_slices_name_the_node", "slices"),
    Rule("KP-SLICES-POOL", "MUST",
         "Every pool's slices of its newest generation agree on resourceSliceCount and are all there, and no "
         "device name repeats within a pool (else the scheduler treats the pool as invalid).",
         (f"{API} resource/v1/types.go: ResourcePool.Generation, ResourcePool.ResourceSliceCount",
          "kubernetes/kubernetes#141117 (a pool's result depended on slice order)"),
         "test_pools_are_consistent", "slices"),
    Rule("KP-SLICES-GENERATION", "MUST",
         "A slice never changes its devices, counters or node access while keeping its pool generation: a change "
         "of a pool's resources comes with a new generation.",
         (f"{API} resource/v1/types.go: ResourcePool.Generation (\"Whenever a driver changes something about one "
          "or more of the resources in a pool, it must change the generation in all ResourceSlices\")",),
         "test_changes_come_with_a_new_generation", "slices"),
    Rule("KP-SLICES-REPUBLISH", "SHOULD",
         "While the plugin publishes and republishes (its starts and restarts in this run), no pool stays incomplete "
         "(fewer slices of its newest generation than resourceSliceCount, or slices that disagree on it) for more "
         "than 10 s.",
         (f"{API} resource/v1/types.go: ResourcePool.Generation (\"enables consumers to detect pools ... in an "
          "incomplete state\"), ResourcePool.ResourceSliceCount",
          "kubernetes/kubernetes#141117 (a pool's result depended on slice order)"),
         "test_pools_are_never_incomplete_for_long", "slices"),
)

# Rules of the container side: they need a container runtime, so the suite checks them on a node run by a real
# kubelet (conformance/, for the fake driver and in vendor mode), not `dra-harness sanity`. `check` is the
# suite's test (file::function).
SUITE_RULES: tuple[Rule, ...] = (
    Rule("CT-CONTAINER-DEVICES", "MUST",
         "A container that names one request of a claim (resources.claims[].request) is given the CDI devices of "
         "that request's allocated devices and of no other request's: the plugin answers each device with its own "
         "request's name (an empty list hands the device to every container of the claim) and CDI IDs that inject "
         "that device only.",
         (f"{API} core/v1/types.go: ResourceClaim.Request (\"otherwise only the result of this request\")",
          f"{KUBELET_API} pkg/apis/dra/v1/api.proto: Device.request_names (\"If empty, the device is associated "
          "with all requests\"), Device.cdi_device_ids",
          f"{KUBELET} pkg/kubelet/cm/dra/claiminfo.go: ClaimInfo.cdiDevicesAsList (a container's CDI IDs per request)",
          "NVIDIA aicr#1620 (a sibling container saw another container's device)"),
         "conformance/test_driver_checks.py::test_each_container_is_given_only_the_devices_of_its_request",
         "container"),
)

BY_ID = {rule.id: rule for rule in RULES + SUITE_RULES}
BY_CHECK = {rule.check: rule for rule in RULES}


def rule(rule_id: str) -> Rule:
    return BY_ID[rule_id]


def failure(rule_id: str, what: str) -> str:
    """The message of a failed check: the rule's id and level, then what is wrong with which object."""
    found = BY_ID[rule_id]
    return f"{found.label()}: {what}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def markdown(table: tuple[Rule, ...] = RULES) -> str:
    """A rules table of docs/contract.md (`python -m harness.sanity.rules` prints both)."""
    lines = ["| id | level | rule | source | check |", "|---|---|---|---|---|"]
    for found in table:
        sources = "<br>".join(_cell(s) for s in found.sources)
        lines.append(f"| {found.id} | {found.level} | {_cell(found.text)} | {sources} | `{found.check}` |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
    print()
    print(markdown(SUITE_RULES))
