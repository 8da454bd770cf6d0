"""Fixtures of the kubelet-plugin sanity checks: the throwaway target, the kubelet's view of the plugin, and
claims the scheduler allocates (released, and unprepared, after each check).

Collected only with `--dra-sanity-driver-config FILE` (conformance/conftest.py), which `dra-harness sanity`
passes. Each check is one rule of harness.sanity.rules; the rule's id is recorded with its result.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.core.errors import HarnessError, InvalidInput
from harness.core.progress import Reporter
from harness.sanity import kubelet, rules
from harness.sanity.kubelet import Answer, ClaimRef, PluginInfo
from harness.sanity.target import NODES, Allocation, SanityTarget
from harness.vendor import file as vendor

NODE, OTHER_NODE = NODES  # the plugin under test on NODE; its second instance on OTHER_NODE


_LOADED = pytest.StashKey[vendor.VendorDriver]()


def _vendor_file(config: pytest.Config) -> vendor.VendorDriver:
    """The vendor file, read and checked once per run (collection asks for it per test function)."""
    if _LOADED not in config.stash:
        try:
            config.stash[_LOADED] = vendor.load(config.getoption("--dra-sanity-driver-config"))
        except InvalidInput as err:
            raise pytest.UsageError(str(err)) from None
    return config.stash[_LOADED]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "driver" in metafunc.fixturenames:
        drivers = _vendor_file(metafunc.config).drivers
        metafunc.parametrize("driver", drivers, ids=list(drivers), scope="session")


@pytest.fixture(scope="session")
def sanity(request: pytest.FixtureRequest):
    """The vendor's plugin on two simulated nodes of a throwaway cluster; everything goes at the end."""
    loaded = _vendor_file(request.config)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():  # show the progress
        target = SanityTarget(loaded, Reporter())
        try:
            target.__enter__()
        except HarnessError as err:
            pytest.exit(f"dra-harness sanity: cannot set up the plugin under test: {err}", returncode=3)
    try:
        yield target
    finally:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            left = target.close()
        if left:
            print(f"dra-harness sanity: clean-up left {left}")


@pytest.fixture(autouse=True)
def _rule_of_the_check(request: pytest.FixtureRequest) -> None:
    """Every check records the rule it enforces (results.json, JUnit properties)."""
    found = rules.BY_CHECK.get(request.node.originalname)
    if found is None:
        pytest.fail(f"{request.node.name} enforces no rule of harness.sanity.rules", pytrace=False)
    request.node.user_properties.append(("contract_rule", found.id))
    request.node.user_properties.append(("contract_level", found.level))


def not_applicable(request: pytest.FixtureRequest, why: str):
    request.node.user_properties.append(("dra_not_applicable", why))
    pytest.skip(f"not applicable: {why}")


def fail(rule_id: str, what: str):
    pytest.fail(rules.failure(rule_id, what), pytrace=False)


@dataclass
class KubeletView:
    """The plugin of `driver` on `node` as the kubelet sees it: read afresh on every call, since a
    restarted plugin makes new sockets."""

    target: SanityTarget
    node: str
    driver: str

    @property
    def registry(self) -> Path:
        return self.target.dirs[self.node].registry

    @property
    def cdi_dir(self) -> Path:
        return self.target.dirs[self.node].cdi

    def socket(self) -> Path:
        sockets = kubelet.registration_sockets(self.registry, self.driver)
        if not sockets:
            there = sorted(p.name for p in self.registry.iterdir()) if self.registry.is_dir() else []
            fail("KP-REG-SOCKET", f"driver {self.driver} on node {self.node}: no registration socket "
                 f"{self.driver}-reg.sock (or {self.driver}-*reg.sock) in {self.registry} (found: {there or 'nothing'})")
        return sockets[0]

    def info(self) -> PluginInfo:
        return kubelet.get_info(self.socket())

    def service(self) -> str:
        info = self.info()
        chosen = info.dra_service()
        if chosen is None:
            fail("KP-REG-VERSIONS", f"driver {self.driver}: supported_versions {list(info.versions)} names none of "
                 f"{', '.join(kubelet.DRA_SERVICES)}: the 1.37 kubelet refuses the registration")
        return chosen  # type: ignore[return-value]

    def prepare(self, claims: list[ClaimRef]) -> Answer:
        return kubelet.prepare(self.info().endpoint, self.service(), claims)

    def unprepare(self, claims: list[ClaimRef]) -> Answer:
        return kubelet.unprepare(self.info().endpoint, self.service(), claims)

    def prepared(self, allocation: Allocation) -> list[kubelet.PreparedDevice]:
        """Prepare one allocated claim; a failure here is the KP-PREP-ANSWER rule's."""
        answer = self.prepare([allocation.ref])
        if not answer.ok(allocation.ref.uid):
            fail("KP-PREP-ANSWER", f"driver {self.driver} on node {self.node}: NodePrepareResources of claim "
                 f"{allocation.ref} (allocated {sorted(allocation.devices_of(self.driver))}): "
                 f"{answer.describe(allocation.ref.uid)}")
        return answer.devices.get(allocation.ref.uid, [])


@pytest.fixture
def view(sanity: SanityTarget, driver: str) -> KubeletView:
    return KubeletView(sanity, NODE, driver)


@dataclass
class Claims:
    """Claims of one check: allocated on demand; unprepared on every node and released afterwards."""

    target: SanityTarget
    driver: str
    request: pytest.FixtureRequest
    made: list[Allocation] = field(default_factory=list)
    idle: list[ClaimRef] = field(default_factory=list)

    def need(self, count: int, node: str = NODE) -> None:
        """Not applicable unless `count` devices of the driver are free for `node`."""
        free = self.target.free_devices(node, self.driver)
        if free < count:
            not_applicable(self.request, f"needs {count} free devices of {self.driver} for node {node}; "
                           f"the plugin publishes {free} there")

    def allocate(self, node: str = NODE) -> Allocation:
        made = self.target.allocate(node, self.driver)
        self.made.append(made)
        return made

    def unallocated(self) -> ClaimRef:
        ref = self.target.unallocated_claim(self.driver)
        self.idle.append(ref)
        return ref

    def close(self) -> None:
        refs = [a.ref for a in self.made]
        for node in NODES:  # the plugin must not keep what a check left prepared
            with contextlib.suppress(Exception):
                view = KubeletView(self.target, node, self.driver)
                kubelet.unprepare(view.info().endpoint, view.info().dra_service() or kubelet.DRA_SERVICES[0], refs)
        for allocation in self.made:
            self.target.release(allocation)
        for ref in self.idle:
            self.target.delete_claim(ref)


@pytest.fixture
def claims(sanity: SanityTarget, driver: str, request: pytest.FixtureRequest):
    made = Claims(sanity, driver, request)
    try:
        yield made
    finally:
        made.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """A failed check shows the tail of the plugin's log on each node: what the plugin said about it."""
    report = yield
    target = getattr(item, "funcargs", {}).get("sanity")
    if report.failed and call.when == "call" and isinstance(target, SanityTarget):
        for node, plugin in target.plugins.items():
            try:
                lines = plugin.log.read_text(errors="replace").splitlines()[-25:]
            except OSError:
                continue
            report.sections.append((f"plugin log on {node} ({plugin.log})", "\n".join(lines)))
    return report
