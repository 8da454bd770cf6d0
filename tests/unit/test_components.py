"""Component command lines (harness/backends/local/components.py), KWOK stages and the cluster PKI."""

from __future__ import annotations

import dataclasses
import ipaddress
import stat

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.backends.kwok import stages as kwok_stages
from harness.backends.local import components, pki
from harness.binaries import BinarySet, Versions
from harness.config import featuregates
from harness.core import schedulerprofiles


@pytest.fixture(scope="module")
def matrix():
    return featuregates.load_matrix("1.37.2")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return pki.create(tmp_path_factory.mktemp("pki") / "pki", "t")


PORTS = dict(zip(components.PORT_NAMES, range(21001, 21001 + len(components.PORT_NAMES))))


def _layout(tmp_path, keys, features) -> components.ClusterLayout:
    return components.ClusterLayout("t", tmp_path, BinarySet(directory=tmp_path, versions=Versions()), features,
                                    dict(PORTS), keys)


@pytest.fixture
def layout(tmp_path, keys, matrix):
    return _layout(tmp_path, keys, featuregates.resolve(matrix, preset="all-dra"))


@pytest.fixture
def ga_layout(tmp_path, keys, matrix):
    return _layout(tmp_path, keys, featuregates.resolve(matrix, preset="ga-only"))


def _by_name(layout) -> dict[str, components.Component]:
    return {c.name: c for group in components.plan(layout) for c in group}


def _flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    assert len(values) == 1, f"{name} appears {len(values)} times in {argv}"
    return values[0]


# --- command lines ----------------------------------------------------------------------------


def test_plan_order(layout):
    groups = components.plan(layout)
    assert [[c.name for c in g] for g in groups[:2]] == [["etcd"], ["kube-apiserver"]]
    assert sorted(c.name for c in groups[2]) == ["kube-controller-manager", "kube-scheduler", "kwok"]
    assert len(groups) == 3
    # The stop order stops the supervisor first (it would restart the others), then every planned
    # component, in reverse: the apiserver's clients first, etcd last.
    assert components.STOP_ORDER[0] == ["supervisor"]
    assert components.STOP_ORDER[-2:] == [["kube-apiserver"], ["etcd"]]
    assert {c.name for c in groups[2]} <= set(components.STOP_ORDER[1])
    stopped = [name for group in components.STOP_ORDER for name in group]
    assert len(stopped) == len(set(stopped))


def test_binaries_come_from_the_binary_set(layout, tmp_path):
    for name, component in _by_name(layout).items():
        assert component.argv[0] == str(tmp_path / name)


def test_loopback_only(layout):
    comps = _by_name(layout)
    for component in comps.values():
        text = " ".join(component.argv) + " " + component.health_url + " " + " ".join(component.files.values())
        assert "0.0.0.0" not in text, component.name
        assert "::" not in " ".join(component.argv), component.name
        assert component.health_url.split("//")[1].startswith("127.0.0.1:"), component.name
        for arg in component.argv:
            if arg.startswith("--bind-address="):
                assert arg == "--bind-address=127.0.0.1", component.name
    etcd = comps["etcd"].argv
    for flag in ("--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls",
                 "--initial-advertise-peer-urls"):
        assert _flag(etcd, flag).startswith("http://127.0.0.1:"), flag
    assert _flag(etcd, "--initial-cluster") == f"dra-harness=http://127.0.0.1:{PORTS['etcd-peer']}"
    apiserver = comps["kube-apiserver"].argv
    assert _flag(apiserver, "--etcd-servers") == f"http://127.0.0.1:{PORTS['etcd']}"
    assert _flag(apiserver, "--bind-address") == "127.0.0.1"
    assert _flag(apiserver, "--advertise-address") == "127.0.0.1"
    kwok = comps["kwok"].argv
    assert _flag(kwok, "--server-address") == f"127.0.0.1:{PORTS['kwok']}"
    assert _flag(kwok, "--node-ip") == "127.0.0.1"
    # the controllers' own endpoints: secure port on loopback
    for name in ("kube-scheduler", "kube-controller-manager"):
        assert _flag(comps[name].argv, "--bind-address") == "127.0.0.1"


def test_apiserver_feature_flags(layout, matrix):
    argv = _by_name(layout)["kube-apiserver"].argv
    features = featuregates.resolve(matrix, preset="all-dra")
    assert _flag(argv, "--feature-gates") == features.gates_flag()
    assert "DRAWorkloadResourceClaims=true" in _flag(argv, "--feature-gates")
    runtime = _flag(argv, "--runtime-config")
    assert runtime == features.runtime_config_flag()
    assert "resource.k8s.io/v1beta2=true" in runtime.split(",")


def test_controllers_get_the_gates(layout):
    comps = _by_name(layout)
    gates = layout.features.gates_flag()
    for name in ("kube-scheduler", "kube-controller-manager"):
        assert _flag(comps[name].argv, "--feature-gates") == gates
        assert not any(a.startswith("--runtime-config") for a in comps[name].argv)


def test_ga_only_has_no_feature_flags(ga_layout):
    for component in _by_name(ga_layout).values():
        assert not any(a.startswith(("--feature-gates", "--runtime-config")) for a in component.argv), component.name


@pytest.mark.parametrize("name", ["kube-scheduler", "kube-controller-manager"])
def test_controller_secure_serving(layout, keys, name):
    argv = _by_name(layout)[name].argv
    assert _flag(argv, "--secure-port") == str(PORTS[name])
    assert _flag(argv, "--client-ca-file") == str(keys.ca_cert)
    assert _flag(argv, "--tls-cert-file") == str(keys.serving_cert)
    kubeconfig = str(layout.kubeconfig(name))
    assert _flag(argv, "--authentication-kubeconfig") == kubeconfig
    assert _flag(argv, "--authorization-kubeconfig") == kubeconfig
    assert _by_name(layout)[name].health_url == f"https://127.0.0.1:{PORTS[name]}/healthz"


def test_scheduler_config_file(layout, tmp_path):
    scheduler = _by_name(layout)["kube-scheduler"]
    assert set(scheduler.files) == {"kube-scheduler.yaml"}
    assert _flag(scheduler.argv, "--config") == str(tmp_path / "kube-scheduler.yaml")
    config = yaml.safe_load(scheduler.files["kube-scheduler.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["leaderElection"]["leaderElect"] is False
    assert config["clientConnection"]["kubeconfig"] == str(layout.kubeconfig("kube-scheduler"))


def test_each_port_in_its_owner(layout):
    comps = _by_name(layout)
    owners = {"etcd": "etcd", "etcd-peer": "etcd", "kube-apiserver": "kube-apiserver",
              "kube-controller-manager": "kube-controller-manager", "kube-scheduler": "kube-scheduler",
              "kwok": "kwok"}
    assert set(owners) == set(components.PORT_NAMES)
    for port_name, owner in owners.items():
        port = str(PORTS[port_name])
        assert any(a.endswith(":" + port) or a.endswith("=" + port) for a in comps[owner].argv), \
            f"port {port_name} ({port}) not in {owner}'s argv"
    assert layout.server == f"https://127.0.0.1:{PORTS['kube-apiserver']}"


def test_kubeconfig_paths(layout, tmp_path):
    assert layout.kubeconfig("admin") == tmp_path / "kubeconfig"
    assert layout.kubeconfig("kwok") == tmp_path / "kwok.kubeconfig"


# --- KWOK -------------------------------------------------------------------------------------


def test_kwok_config_yaml():
    docs = list(yaml.safe_load_all(kwok_stages.config_yaml()))
    assert docs[0]["kind"] == "KwokConfiguration"
    assert docs[0]["apiVersion"] == "config.kwok.x-k8s.io/v1alpha1"
    assert all(v > 0 for v in docs[0]["options"].values())
    stages = docs[1:]
    assert stages and all(d["kind"] == "Stage" and d["apiVersion"] == kwok_stages.API for d in stages)
    assert len({d["metadata"]["name"] for d in stages}) == len(stages)
    kinds = {d["spec"]["resourceRef"]["kind"] for d in stages}
    assert kinds == {"Node", "Pod"}
    deletes = [d for d in stages if d["spec"]["resourceRef"]["kind"] == "Pod" and d["spec"]["next"].get("delete")]
    assert len(deletes) == 1
    assert deletes[0]["spec"]["next"]["delete"] is True
    assert deletes[0]["spec"]["selector"]["matchExpressions"][0]["key"] == ".metadata.deletionTimestamp"
    for d in stages:
        assert "statusTemplate" in d["spec"]["next"] or d["spec"]["next"].get("delete"), d["metadata"]["name"]
    running = next(d for d in stages if d["metadata"]["name"] == "dra-harness-pod-running")
    assert {"key": '.metadata.labels["dra-harness.x-k8s.io/kwok-not-started"]', "operator": "DoesNotExist"} in \
        running["spec"]["selector"]["matchExpressions"]  # the load tests' burst pods are bound, never started


def test_kwok_component_uses_our_config(layout, tmp_path):
    kwok = _by_name(layout)["kwok"]
    assert _flag(kwok.argv, "--config") == str(tmp_path / "kwok.yaml")
    assert kwok.files == {"kwok.yaml": kwok_stages.config_yaml()}
    assert _flag(kwok.argv, "--manage-all-nodes") == "false"


# --- PKI --------------------------------------------------------------------------------------


def _cert(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_ca(keys):
    ca = _cert(keys.ca_cert)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert ca.subject == ca.issuer
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "dra-harness-ca-t"


def test_serving_cert(keys):
    ca, serving = _cert(keys.ca_cert), _cert(keys.serving_cert)
    serving.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    usage = serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    for extension in serving.extensions:
        if isinstance(extension.value, x509.BasicConstraints):
            assert extension.value.ca is False


def test_client_certs(keys):
    ca = _cert(keys.ca_cert)
    for name, (common_name, orgs) in pki.CLIENTS.items():
        cert = _cert(keys.client_cert(name))
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == common_name
        assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == orgs
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usage
    admin = _cert(keys.client_cert("admin"))
    assert [a.value for a in admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]


def test_key_files_are_private(keys):
    key_files = [keys.ca_key, keys.serving_key, keys.service_account_key] + [keys.client_key(n) for n in pki.CLIENTS]
    for path in key_files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert b"PUBLIC KEY" in keys.service_account_pub.read_bytes()


def test_scheduler_runs_the_short_dra_timeouts_profile_beside_default_scheduler(tmp_path, keys, matrix):
    features = featuregates.resolve(matrix, preset="all-dra")
    extra = schedulerprofiles.extra_profiles(features.effective(matrix))
    layout = components.ClusterLayout("t", tmp_path, BinarySet(directory=tmp_path, versions=Versions()), features,
                                      dict(PORTS), keys, scheduler_profiles=extra)
    config = yaml.safe_load(_by_name(layout)["kube-scheduler"].files["kube-scheduler.yaml"])
    default, short = config["profiles"]
    assert default == {"schedulerName": "default-scheduler"}  # untouched: the plugin's own defaults
    assert short["schedulerName"] == schedulerprofiles.SHORT_DRA_TIMEOUTS
    (plugin,) = short["pluginConfig"]
    assert plugin["name"] == "DynamicResources"
    assert plugin["args"] == {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "DynamicResourcesArgs",
                              "filterTimeout": "1s", "bindingTimeout": "10s"}


def test_scheduler_without_extra_profiles_keeps_the_default_profile_list(layout):
    config = yaml.safe_load(_by_name(layout)["kube-scheduler"].files["kube-scheduler.yaml"])
    assert "profiles" not in config


@pytest.mark.parametrize("gates, expected", [
    ({"DRASchedulerFilterTimeout": True, "DRADeviceBindingConditions": True, "DRAResourceClaimDeviceStatus": True},
     {"filterTimeout": "1s", "bindingTimeout": "10s"}),
    # the scheduler refuses an argument whose gates are off (ValidateDynamicResourcesArgs)
    ({"DRASchedulerFilterTimeout": False, "DRADeviceBindingConditions": True, "DRAResourceClaimDeviceStatus": True},
     {"bindingTimeout": "10s"}),
    ({"DRASchedulerFilterTimeout": True, "DRADeviceBindingConditions": False, "DRAResourceClaimDeviceStatus": True},
     {"filterTimeout": "1s"}),
    ({"DRASchedulerFilterTimeout": False, "DRADeviceBindingConditions": False}, None),
])
def test_short_timeouts_are_set_only_where_their_gates_are_on(gates, expected):
    profiles = schedulerprofiles.extra_profiles(gates)
    if expected is None:
        assert profiles == ()
        return
    (profile,) = profiles
    assert profile.plugin_args() == expected
    assert schedulerprofiles.SchedulerProfile.from_dict(profile.to_dict()) == profile


def test_longer_node_leases_renew_less_often_and_the_controller_manager_waits_as_long(layout):
    default = _by_name(layout)
    assert next(yaml.safe_load_all(default["kwok"].files["kwok.yaml"]))["options"]["nodeLeaseDurationSeconds"] == 40
    assert not any(a.startswith("--node-monitor-grace-period") for a in default["kube-controller-manager"].argv)
    longer = _by_name(dataclasses.replace(layout, node_lease_seconds=120))  # a load run's cluster
    assert next(yaml.safe_load_all(longer["kwok"].files["kwok.yaml"]))["options"]["nodeLeaseDurationSeconds"] == 120
    assert _flag(longer["kube-controller-manager"].argv, "--node-monitor-grace-period") == "120s"
