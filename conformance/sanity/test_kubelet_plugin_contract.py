"""The kubelet-plugin contract of DRA, rule by rule (harness.sanity.rules, docs/contract.md), checked over the
plugin's own sockets as the 1.37 kubelet uses them. Claims are allocated by the real scheduler from the
slices the plugin publishes; devices are asked for by driver and count only, so any driver fits.

Each check's failure starts with its rule id and names the driver, node, claim and what was wrong.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from conformance import driver_checks
from conformance.sanity.conftest import NODE, OTHER_NODE, KubeletView, fail, not_applicable
from harness.sanity import cdi, kubelet, slicewatch
from harness.sanity.kubelet import ClaimRef
from harness.sanity.target import NAMESPACE, NODES

HEALTH_FIRST_WITHIN = 10.0
DEFAULT_HEALTH_TIMEOUT = 30  # the kubelet's default lease of a device's health (health_check_timeout_seconds 0)


def _devices(answer_devices) -> list[tuple]:
    return sorted((d.pool, d.device, tuple(sorted(d.requests)), tuple(sorted(d.cdi_ids))) for d in answer_devices)


# --- registration -----------------------------------------------------------------------------------

def test_registration_socket(view: KubeletView):
    assert view.socket().is_socket()


def test_get_info(view: KubeletView):
    info = view.info()
    wrong = []
    if info.type != kubelet.PLUGIN_TYPE:
        wrong.append(f"type is {info.type!r}, not {kubelet.PLUGIN_TYPE!r}")
    if info.name != view.driver:
        wrong.append(f"name is {info.name!r}, not the driver's name {view.driver!r}")
    if not info.endpoint:
        wrong.append("endpoint is empty")
    if wrong:
        fail("KP-REG-INFO", f"driver {view.driver}: GetInfo on {view.socket()}: " + "; ".join(wrong))


def test_supported_versions(view: KubeletView):
    view.service()  # fails naming the rule when the kubelet would refuse every advertised version


def test_endpoint_serves_advertised_versions(view: KubeletView):
    info = view.info()
    if not info.endpoint.startswith("/"):
        fail("KP-REG-ENDPOINT", f"driver {view.driver}: endpoint {info.endpoint!r} is not an absolute path")
    if not Path(info.endpoint).is_socket():
        fail("KP-REG-ENDPOINT", f"driver {view.driver}: endpoint {info.endpoint} is not a unix socket")
    wrong = []
    for service in (s for s in kubelet.DRA_SERVICES if s in info.versions):
        for call, name in ((kubelet.prepare, "NodePrepareResources"), (kubelet.unprepare, "NodeUnprepareResources")):
            answer = call(info.endpoint, service, [])
            if answer.call_error or answer.claims:
                wrong.append(f"{service} {name} of no claims: "
                             + (answer.call_error or f"answered claims {sorted(answer.claims)}"))
    if wrong:
        fail("KP-REG-ENDPOINT", f"driver {view.driver}: endpoint {info.endpoint}: " + "; ".join(wrong))


def test_notify_registration_status(view: KubeletView):
    socket = view.socket()
    try:
        kubelet.notify(socket, True)
    except grpc.RpcError as err:
        fail("KP-REG-NOTIFY", f"driver {view.driver}: NotifyRegistrationStatus(plugin_registered=true) on {socket} "
             f"failed: {kubelet._status(err)}")
    try:
        kubelet.notify(socket, False, "dra-harness sanity: a failed registration, on purpose")
    except grpc.RpcError:
        pass  # allowed: the helper library answers a failed registration with an error
    try:
        view.info()
    except grpc.RpcError as err:
        fail("KP-REG-NOTIFY", f"driver {view.driver}: after NotifyRegistrationStatus(plugin_registered=false), "
             f"GetInfo on {socket} fails: {kubelet._status(err)}")
    kubelet.notify(view.socket(), True)  # registered again, as the kubelet would on its next try


# --- prepare ----------------------------------------------------------------------------------------

def test_prepare_answers_the_claim(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    answer = view.prepare([allocation.ref])
    uid = allocation.ref.uid
    if answer.call_error or set(answer.claims) != {uid} or answer.claims[uid]:
        fail("KP-PREP-ANSWER", f"driver {view.driver} on node {view.node}: NodePrepareResources of claim "
             f"{allocation.ref}: " + (answer.describe(uid) if uid not in answer.claims or answer.call_error or
                                      answer.claims[uid] else f"also answered {sorted(set(answer.claims) - {uid})}"))


def test_prepared_devices_are_the_allocated_ones(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    allocated = allocation.devices_of(view.driver)
    wrong = []
    for device in view.prepared(allocation):
        where = f"device {device.pool!r}/{device.device!r}"
        if not device.pool or not device.device:
            wrong.append(f"{where}: pool_name and device_name are required")
        elif (device.pool, device.device) not in allocated:
            wrong.append(f"{where} is not allocated to the claim (allocated: {sorted(allocated)})")
        else:
            requests = {r.split("/", 1)[0] for r in allocation.requests_of(view.driver, device.pool, device.device)}
            odd = [r for r in device.requests if r not in requests]
            if odd:
                wrong.append(f"{where}: request_names {odd} are not the claim's requests for it ({sorted(requests)}; "
                             "a subrequest is named by its request only)")
    if wrong:
        fail("KP-PREP-DEVICES", f"driver {view.driver}, claim {allocation.ref}: " + "; ".join(wrong))


def test_cdi_ids_resolve(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    devices = view.prepared(allocation)
    specs = cdi.read(view.cdi_dir)
    wrong = []
    for device in devices:
        for device_id in device.cdi_ids:
            if cdi.parse(device_id) is None:
                wrong.append(f"{device_id!r} (device {device.pool}/{device.device}) is not a qualified CDI name "
                             "<vendor>/<class>=<name>")
            elif not specs.resolve(device_id):
                wrong.append(f"{device_id} (device {device.pool}/{device.device}) is defined by no CDI spec in "
                             f"{view.cdi_dir}")
    if wrong:
        broken = "; ".join(f"{name} {why}" for name, why in sorted(specs.broken.items()))
        fail("KP-PREP-CDI", f"driver {view.driver}, claim {allocation.ref}: " + "; ".join(wrong)
             + (f" (spec files that do not load: {broken})" if broken else ""))


def test_prepare_is_idempotent(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    first = _devices(view.prepared(allocation))
    again = view.prepare([allocation.ref])
    if not again.ok(allocation.ref.uid):
        fail("KP-PREP-REPEAT", f"driver {view.driver}: a second NodePrepareResources of the prepared claim "
             f"{allocation.ref}: {again.describe(allocation.ref.uid)}")
    second = _devices(again.devices[allocation.ref.uid])
    if second != first:
        fail("KP-PREP-REPEAT", f"driver {view.driver}: a second NodePrepareResources of claim {allocation.ref} "
             f"answered {second}, the first {first}")


def test_prepare_several_claims(view: KubeletView, claims):
    claims.need(2)
    first, second = claims.allocate(), claims.allocate()
    answer = view.prepare([first.ref, second.ref])
    wrong = [f"claim {a.ref}: {answer.describe(a.ref.uid)}" for a in (first, second) if not answer.ok(a.ref.uid)]
    if wrong:
        fail("KP-PREP-MULTI", f"driver {view.driver}: one NodePrepareResources of two claims: " + "; ".join(wrong))


def test_unallocated_claim_is_refused(view: KubeletView, claims):
    ref = claims.unallocated()
    answer = view.prepare([ref])
    if not answer.refused(ref.uid):
        fail("KP-PREP-UNALLOCATED", f"driver {view.driver}: NodePrepareResources of claim {ref}, which is not "
             f"allocated, succeeded (devices {_devices(answer.devices.get(ref.uid, []))})")


def test_replaced_claim_is_refused(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    old = ClaimRef(NAMESPACE, allocation.ref.name, str(uuid.uuid4()))  # what the kubelet holds of a replaced claim
    answer = view.prepare([old])
    if not answer.refused(old.uid):
        fail("KP-PREP-REPLACED", f"driver {view.driver}: NodePrepareResources of claim {old} succeeded, but the claim "
             f"of that name has UID {allocation.ref.uid}")


def test_missing_claim_is_refused(view: KubeletView):
    ref = ClaimRef(NAMESPACE, f"no-such-claim-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()))
    answer = view.prepare([ref])
    if not answer.refused(ref.uid):
        fail("KP-PREP-MISSING", f"driver {view.driver}: NodePrepareResources of claim {ref}, which does not exist, "
             "succeeded")


def test_claim_of_another_node_is_refused(request, sanity, view: KubeletView, claims):
    local = [s for s in sanity.slices(view.driver) if s["spec"].get("nodeName") == OTHER_NODE and s["spec"].get("devices")]
    if not local:
        not_applicable(request, f"{view.driver} publishes no node-local devices for node {OTHER_NODE}: a claim "
                       "allocated there may be usable on any node")
    claims.need(1, OTHER_NODE)
    elsewhere = claims.allocate(OTHER_NODE)
    answer = view.prepare([elsewhere.ref])
    if not answer.refused(elsewhere.ref.uid):
        fail("KP-PREP-OTHER-NODE", f"driver {view.driver} on node {NODE}: NodePrepareResources of claim "
             f"{elsewhere.ref}, allocated on node {OTHER_NODE} ({sorted(elsewhere.devices_of(view.driver))}), "
             f"succeeded with {_devices(answer.devices.get(elsewhere.ref.uid, []))}")


# --- unprepare --------------------------------------------------------------------------------------

def _created_files(view: KubeletView, before: set[str]) -> set[str]:
    return cdi.read(view.cdi_dir).files - before


def _unprepared_cleanly(view: KubeletView, ref: ClaimRef, created: set[str], ids: list[str], rule_id: str) -> None:
    answer = view.unprepare([ref])
    if not answer.ok(ref.uid):
        fail(rule_id, f"driver {view.driver}: NodeUnprepareResources of the prepared claim {ref}: "
             f"{answer.describe(ref.uid)}")
    after = cdi.read(view.cdi_dir)
    left = sorted(created & after.files)
    still = sorted(i for i in ids if set(after.resolve(i)) & created)
    if left or still:
        fail(rule_id, f"driver {view.driver}: after NodeUnprepareResources of claim {ref}, the CDI spec files "
             f"Prepare wrote are still in {view.cdi_dir}: {left}" + (f" (defining {still})" if still else ""))


def test_unprepare_cleans_up(view: KubeletView, claims):
    claims.need(1)
    before = cdi.read(view.cdi_dir).files
    allocation = claims.allocate()
    devices = view.prepared(allocation)
    created = _created_files(view, before)
    _unprepared_cleanly(view, allocation.ref, created, [i for d in devices for i in d.cdi_ids], "KP-UNPREP-CLEAN")


def test_unprepare_is_idempotent(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    never = view.unprepare([allocation.ref])
    if not never.ok(allocation.ref.uid):
        fail("KP-UNPREP-REPEAT", f"driver {view.driver}: NodeUnprepareResources of claim {allocation.ref}, never "
             f"prepared: {never.describe(allocation.ref.uid)}")
    view.prepared(allocation)
    for attempt in ("first", "second"):
        answer = view.unprepare([allocation.ref])
        if not answer.ok(allocation.ref.uid):
            fail("KP-UNPREP-REPEAT", f"driver {view.driver}: the {attempt} NodeUnprepareResources of the prepared "
                 f"claim {allocation.ref}: {answer.describe(allocation.ref.uid)}")


def test_unprepare_after_the_claim_is_deleted(sanity, view: KubeletView, claims):
    claims.need(1)
    before = cdi.read(view.cdi_dir).files
    allocation = claims.allocate()
    devices = view.prepared(allocation)
    created = _created_files(view, before)
    sanity.release(allocation)  # pod and claim gone from the API server, as when a pod ends
    claims.made.remove(allocation)
    _unprepared_cleanly(view, allocation.ref, created, [i for d in devices for i in d.cdi_ids], "KP-UNPREP-DELETED")


def test_unprepare_answers_every_claim(view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    view.prepared(allocation)
    unknown = ClaimRef(NAMESPACE, f"never-prepared-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()))
    answer = view.unprepare([allocation.ref, unknown])
    expected = {allocation.ref.uid, unknown.uid}
    if answer.call_error or set(answer.claims) != expected:
        fail("KP-UNPREP-ANSWER", f"driver {view.driver}: NodeUnprepareResources of claims {allocation.ref} and "
             f"{unknown}: " + (f"the call failed: {answer.call_error}" if answer.call_error else
                               f"answered UIDs {sorted(answer.claims)}, asked {sorted(expected)}"))


# --- restart ------------------------------------------------------------------------------------------

def test_state_survives_a_crash(sanity, view: KubeletView, claims):
    claims.need(1)
    before = cdi.read(view.cdi_dir).files
    allocation = claims.allocate()
    first = view.prepared(allocation)
    created = _created_files(view, before)
    sanity.restart(NODE)  # SIGKILL, start, wait for a new registration socket
    again = view.prepare([allocation.ref])
    if not again.ok(allocation.ref.uid):
        fail("KP-RESTART-STATE", f"driver {view.driver}: after a crash and restart, NodePrepareResources of claim "
             f"{allocation.ref} (prepared before the crash): {again.describe(allocation.ref.uid)}")
    if _devices(again.devices[allocation.ref.uid]) != _devices(first):
        fail("KP-RESTART-STATE", f"driver {view.driver}: after a crash and restart, claim {allocation.ref} is "
             f"answered {_devices(again.devices[allocation.ref.uid])}, before it {_devices(first)}")
    _unprepared_cleanly(view, allocation.ref, created, [i for d in first for i in d.cdi_ids], "KP-RESTART-STATE")


def test_prepare_after_a_reboot_restores_cdi(sanity, view: KubeletView, claims):
    claims.need(1)
    allocation = claims.allocate()
    view.prepared(allocation)
    sanity.restart(NODE, empty_cdi=True)  # a reboot: the tmpfs of CDI specs is empty, the plugin starts again
    again = view.prepare([allocation.ref])
    if not again.ok(allocation.ref.uid):
        fail("KP-RESTART-CDI", f"driver {view.driver}: after a reboot, NodePrepareResources of claim "
             f"{allocation.ref}: {again.describe(allocation.ref.uid)}")
    specs = cdi.read(view.cdi_dir)
    missing = sorted(i for d in again.devices[allocation.ref.uid] for i in d.cdi_ids if not specs.resolve(i))
    if missing:
        fail("KP-RESTART-CDI", f"driver {view.driver}: after a reboot (CDI directory emptied, plugin restarted), "
             f"NodePrepareResources of claim {allocation.ref} answered CDI IDs that no spec in {view.cdi_dir} defines: "
             f"{missing}; a container runtime cannot start the pod's containers (CreateContainerError)")


# --- concurrency ----------------------------------------------------------------------------------------

def test_concurrent_calls(sanity, view: KubeletView, claims):
    claims.need(2)
    count = min(4, sanity.free_devices(NODE, view.driver))
    allocations = [claims.allocate() for _ in range(count)]
    endpoint, service = view.info().endpoint, view.service()
    with ThreadPoolExecutor(max_workers=count) as pool:
        prepared = list(pool.map(lambda a: kubelet.prepare(endpoint, service, [a.ref]), allocations))
        wrong = [f"prepare {a.ref}: {answer.describe(a.ref.uid)}" for a, answer in zip(allocations, prepared)
                 if not answer.ok(a.ref.uid)]
        unprepared = list(pool.map(lambda a: kubelet.unprepare(endpoint, service, [a.ref]), allocations))
        wrong += [f"unprepare {a.ref}: {answer.describe(a.ref.uid)}" for a, answer in zip(allocations, unprepared)
                  if not answer.ok(a.ref.uid)]
    if wrong:
        fail("KP-CONCURRENT", f"driver {view.driver}: {count} concurrent calls, one claim each: " + "; ".join(wrong))


# --- health ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def health(sanity, driver):
    """One NodeWatchResources stream of the plugin on NODE: (service or None, reports, error, wait used).
    It is read until a second report arrives or the shortest health check timeout (plus 5 s) has passed."""
    view = KubeletView(sanity, NODE, driver)
    info = view.info()
    service = info.health_service()
    if service is None:
        return None, [], "", 0.0
    first, error = kubelet.watch_health(info.endpoint, service, 1, HEALTH_FIRST_WITHIN)
    if not first:
        return service, [], error, HEALTH_FIRST_WITHIN
    timeouts = [t if t > 0 else DEFAULT_HEALTH_TIMEOUT for *_, t, _ in first[0].devices] or [DEFAULT_HEALTH_TIMEOUT]
    window = min(timeouts) + 5.0
    reports, error = kubelet.watch_health(info.endpoint, service, 2, window)
    return service, reports, error, window


def _health_applies(request, health, driver: str):
    service, reports, error, _ = health
    if service is None:
        not_applicable(request, f"{driver} does not advertise DRAResourceHealth")
    if error.startswith("UNIMPLEMENTED"):
        not_applicable(request, f"{driver} advertises DRAResourceHealth but declines it (UNIMPLEMENTED)")
    return service, reports, error


def test_health_first_report(request, sanity, health, driver):
    service, reports, error = _health_applies(request, health, driver)
    if not reports or reports[0].at > HEALTH_FIRST_WITHIN:
        fail("KP-HEALTH-INITIAL", f"driver {driver} on node {NODE}: {service} NodeWatchResources sent no report "
             f"within {HEALTH_FIRST_WITHIN:.0f}s" + (f" ({error})" if error else "")
             + "; the kubelet shows every device Unknown")
    published = sanity.devices_on(NODE, driver)
    reported = {(pool, device) for pool, device, *_ in reports[0].devices}
    missing = sorted(published - reported)
    if missing:
        fail("KP-HEALTH-INITIAL", f"driver {driver} on node {NODE}: the first health report leaves out published "
             f"devices {missing[:10]}" + (f" and {len(missing) - 10} more" if len(missing) > 10 else ""))


def test_health_names_published_devices(request, sanity, health, driver):
    _, reports, _ = _health_applies(request, health, driver)
    if not reports:
        not_applicable(request, f"{driver} sent no health report (see KP-HEALTH-INITIAL)")
    pools = {(s["spec"]["pool"]["name"], d["name"]) for s in sanity.slices(driver) for d in s["spec"].get("devices") or []}
    unknown = sorted({(p, d) for r in reports for p, d, *_ in r.devices} - pools)
    long = sorted({(p, d, len(m)) for r in reports for p, d, _, _, m in r.devices if len(m) > 1024})
    if unknown or long:
        fail("KP-HEALTH-DEVICES", f"driver {driver}: health reports name devices no slice of the driver publishes "
             f"{unknown[:10]}" if unknown else f"driver {driver}: health messages over 1024 characters: {long[:5]}")


def test_health_is_refreshed(request, health, driver):
    _, reports, error = _health_applies(request, health, driver)
    if not reports:
        not_applicable(request, f"{driver} sent no health report (see KP-HEALTH-INITIAL)")
    window = health[3]
    if len(reports) < 2:
        fail("KP-HEALTH-REFRESH", f"driver {driver}: after its first health report at {reports[0].at:.1f}s, none "
             f"came within {window - 5:.0f}s (the shortest health check timeout it gives its devices)"
             + (f" ({error})" if error else "") + "; the kubelet shows the devices Unknown")


# --- slices ---------------------------------------------------------------------------------------------

def test_slices_name_the_node(sanity, driver):
    slices = sanity.slices(driver)
    strangers = sorted({s["spec"]["nodeName"] for s in slices if s["spec"].get("nodeName")} - set(NODES))
    empty = [node for node in NODES if not sanity.devices_on(node, driver)]
    if strangers or empty:
        fail("KP-SLICES-NODE", f"driver {driver}: " + "; ".join(
            ([f"slices for nodes {strangers}, where no plugin of it runs (its plugins run on {list(NODES)})"]
             if strangers else []) + ([f"no device published for node(s) {empty}"] if empty else [])))


def test_pools_are_consistent(sanity, driver):
    defects = driver_checks.invalid_pools(sanity.slices(driver))
    if defects:
        fail("KP-SLICES-POOL", f"driver {driver}: " + "; ".join(defects[:10]))


# --- slices over time (last: the restarts above republished them) -----------------------------------

REPUBLISH_BOUND = 10.0  # seconds a pool may be incomplete while it is (re)published


def _watched(request, sanity, driver):
    watch = sanity.slice_watch
    events = [e for e in watch.snapshot() if e.slice["spec"]["driver"] == driver] if watch else []
    if not events:  # judging nothing is no pass
        not_applicable(request, f"the watch of {driver}'s slices saw no event"
                       + (f": {watch.error}" if watch and watch.error else ""))
    request.node.user_properties.append(("slice_events", len(events)))
    return events


def test_changes_come_with_a_new_generation(request, sanity, driver):
    events = _watched(request, sanity, driver)
    defects = slicewatch.same_generation_changes(events)
    if defects:
        fail("KP-SLICES-GENERATION", f"driver {driver}: " + "; ".join(defects[:10])
             + (f" ({sanity.slice_watch.error})" if sanity.slice_watch.error else ""))


def test_pools_are_never_incomplete_for_long(request, sanity, driver):
    events = _watched(request, sanity, driver)
    spells = slicewatch.incomplete_spells(events, until=time.monotonic())
    long = {f"{d}/{p}": round(s, 1) for (d, p), s in sorted(spells.items()) if s > REPUBLISH_BOUND}
    if long:
        fail("KP-SLICES-REPUBLISH", f"driver {driver}: pools incomplete for longer than {REPUBLISH_BOUND:.0f}s "
             f"(seconds, longest spell) {long}, watched over {len(events)} slice events")
