"""The offline kind node image builder's pure parts, without Docker or Debian: the files it adds to
the root filesystem (from kind's real base files when the module is in the Go module cache, else a
minimal stand-in), the containerd and CNI configuration, the images kubeadm asks for, the cache key,
and the docker command sequence."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml

from harness.backends.kind.host import debianrootfs, nodebuild, nodefiles, nodeinputs
from harness.binaries import manifest
from harness.core.errors import HarnessError

KIND_CONTAINERD = '''version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler.options]
    SystemdCgroup = true
'''

KUBEADM_LIST = """registry.k8s.io/kube-apiserver:v1.37.2
registry.k8s.io/kube-controller-manager:v1.37.2
registry.k8s.io/kube-scheduler:v1.37.2
registry.k8s.io/kube-proxy:v1.37.2
registry.k8s.io/coredns/coredns:v1.13.1
registry.k8s.io/pause:3.10.1
registry.k8s.io/etcd:3.6.5-0
"""


def test_containerds_runc_is_the_wrapper_for_every_handler():
    config = tomllib.loads(nodefiles.containerd_config(KIND_CONTAINERD))
    runtimes = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    for handler in ("runc", "test-handler"):
        assert runtimes[handler]["options"] == {"SystemdCgroup": True, "BinaryName": nodefiles.WRAPPER_IN_NODE}
    with pytest.raises(HarnessError, match="layout changed"):
        nodefiles.containerd_config("version = 2\n")


def test_cri_base_spec_gets_kinds_hook_and_loses_rlimits():
    default = {"process": {"args": ["sh"], "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
               "hooks": {"createContainer": [{"path": "/other"}]}}
    spec = nodefiles.cri_base_spec(default)
    assert "rlimits" not in spec["process"] and "rlimits" in default["process"]  # the input is not changed
    assert spec["hooks"]["createContainer"] == [{"path": "/other"}, {"path": "/kind/bin/mount-product-files.sh"}]
    assert nodefiles.cri_base_spec({})["hooks"]["createContainer"] == [{"path": "/kind/bin/mount-product-files.sh"}]


def test_the_static_cni_is_a_bridge_with_host_local_addresses():
    conflist = json.loads(nodefiles.cni_conflist())
    assert [p["type"] for p in conflist["plugins"]] == ["bridge", "portmap"]
    assert conflist["plugins"][0]["ipam"]["ranges"] == [[{"subnet": nodefiles.POD_SUBNET}]]


def test_kubeadm_patches_skip_coredns_and_allow_cgroup_v1():
    patches = [yaml.safe_load(p) for p in nodefiles.kind_config_patches()]
    by_kind = {p["kind"]: p for p in patches}
    assert by_kind["KubeletConfiguration"]["failCgroupV1"] is False
    assert "addon/coredns" in by_kind["InitConfiguration"]["skipPhases"]


def test_control_plane_images_come_from_kubeadms_own_list():
    images = nodebuild.control_plane_images(KUBEADM_LIST)
    assert images == {"registry.k8s.io/kube-apiserver:v1.37.2": "kube-apiserver",
                      "registry.k8s.io/kube-controller-manager:v1.37.2": "kube-controller-manager",
                      "registry.k8s.io/kube-scheduler:v1.37.2": "kube-scheduler",
                      "registry.k8s.io/kube-proxy:v1.37.2": "kube-proxy",
                      "registry.k8s.io/pause:3.10.1": "pause", "registry.k8s.io/etcd:3.6.5-0": "etcd"}
    with pytest.raises(HarnessError, match="did not name etcd"):
        nodebuild.control_plane_images(KUBEADM_LIST.replace("registry.k8s.io/etcd:3.6.5-0", ""))


def test_enable_links_follow_wantedby():
    unit = "[Unit]\nDescription=x\n[Install]\nWantedBy=multi-user.target other.target\n"
    assert nodefiles.enable_unit_links(unit, "kubelet.service") == [
        "etc/systemd/system/multi-user.target.wants/kubelet.service",
        "etc/systemd/system/other.target.wants/kubelet.service"]


def _bins(directory: Path, group: str, names: tuple[str, ...], content: bytes = b"x") -> Path:
    directory.mkdir(parents=True)
    for name in names:
        (directory / name).write_bytes(content + name.encode())
    manifest.record(directory, {"groups": {}}, group, "1", names, "build")
    return directory


@pytest.fixture
def inputs(tmp_path):
    kind_dir = tmp_path / "kind"
    base = kind_dir / "images/base/files"
    for relative, text in (("etc/containerd/config.toml", KIND_CONTAINERD), ("usr/local/bin/entrypoint", "#!/bin/sh\n"),
                           ("kind/bin/mount-product-files.sh", "#!/bin/sh\n"), ("kind/README.txt", "x\n"),
                           ("etc/systemd/system/kubelet.service", "[Install]\nWantedBy=multi-user.target\n")):
        (base / relative).parent.mkdir(parents=True, exist_ok=True)
        (base / relative).write_text(text)
    return nodeinputs.Inputs(
        "1.37.2", kind_dir, "h1:kind", _bins(tmp_path / "cluster", "kubernetes", ("kubelet", "kubectl", "etcd")),
        _bins(tmp_path / "node", "kubernetes-node", ("kubeadm", "kube-proxy")),
        _bins(tmp_path / "runtime", "containerd", ("containerd", "containerd-shim-runc-v2", "ctr", "pause")),
        ("CAP_SYS_RESOURCE",))


def test_overlay_files_put_everything_where_kind_expects_it(inputs):
    files = nodefiles.overlay_files(inputs, {"process": {}})
    assert files["usr/local/bin/entrypoint"][1] == 0o755 and files["kind/bin/mount-product-files.sh"][1] == 0o755
    assert files["kind/README.txt"][1] == 0o644
    for binary in ("usr/bin/kubelet", "usr/bin/kubectl", "usr/bin/kubeadm", "usr/local/bin/containerd",
                   "usr/local/bin/containerd-shim-runc-v2", "usr/local/bin/ctr"):
        assert isinstance(files[binary][0], Path) and files[binary][0].is_file() and files[binary][1] == 0o755
    assert files["kind/version"][0] == b"v1.37.2"
    assert b'BinaryName = "/usr/local/sbin/runc-wrapper"' in files["etc/containerd/config.toml"][0]
    wrapper = files["usr/local/sbin/runc-wrapper"][0].decode()
    assert wrapper.startswith("#!/usr/bin/python3\n") and "RUNC = '/usr/sbin/runc'" in wrapper
    assert "DROP = frozenset(['CAP_SYS_RESOURCE'])" in wrapper and "CLAMP_OOM = True" in wrapper
    assert json.loads(files["etc/cni/net.d/10-dra-harness-bridge.conflist"][0])["plugins"][0]["type"] == "bridge"


def test_the_real_kind_module_files_are_used_when_present(tmp_path):
    """With kind v0.33.0 in the Go module cache: its containerd config takes the wrapper cleanly."""
    real = Path.home() / "go/pkg/mod/sigs.k8s.io/kind@v0.33.0/images/base/files/etc/containerd/config.toml"
    if not real.is_file():
        pytest.skip("sigs.k8s.io/kind@v0.33.0 is not in the Go module cache")
    config = tomllib.loads(nodefiles.containerd_config(real.read_text()))
    runtimes = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["BinaryName"] == nodefiles.WRAPPER_IN_NODE


def test_the_cache_key_changes_with_every_input(inputs, tmp_path):
    key = debianrootfs.cache_key(inputs.key_material())
    assert key == debianrootfs.cache_key(inputs.key_material())  # stable
    assert nodeinputs.image_tag("1.37.2", key) == f"dra-harness.local/kind-node:v1.37.2-{key[:12]}"
    other_drops = nodeinputs.Inputs(*[getattr(inputs, f) for f in ("kubernetes_version", "kind_dir", "kind_sum",
                                                                     "cluster_bins", "node_bins", "runtime_dir")], ())
    assert debianrootfs.cache_key(other_drops.key_material()) != key
    (inputs.node_bins / "kubeadm").write_bytes(b"rebuilt")
    manifest.record(inputs.node_bins, {"groups": {}}, "kubernetes-node", "1", ("kubeadm", "kube-proxy"), "build")
    assert debianrootfs.cache_key(inputs.key_material()) != key


def test_the_docker_sequence_preloads_without_unpacking_and_commits_kinds_entrypoint(tmp_path):
    archives = [tmp_path / "kube-apiserver_v1.37.2.tar", tmp_path / "kube-proxy.tar"]
    steps = [str(s) for s in nodebuild.build_steps("docker", "img:t", tmp_path, "base:1", archives, "b1")]
    assert steps == [
        f"docker build --tag=img:t-stage {tmp_path}/node",
        "docker run --detach --name=b1 --entrypoint=sleep --security-opt=seccomp=unconfined img:t-stage infinity",
        "docker exec b1 bash -c 'nohup containerd >/var/log/containerd-build.log 2>&1 &'",
        "[wait-containerd] waiting for containerd in the build container",
    ] + [f"cat {a} | docker exec --interactive b1 ctr --namespace=k8s.io images import --no-unpack --digests "
         "--label=io.cri-containerd.pinned=pinned -" for a in archives] + [
        "docker exec b1 pkill containerd",
        "docker commit '--change=ENTRYPOINT [\"/usr/local/bin/entrypoint\", \"/sbin/init\"]' b1 img:t",
    ]
    assert nodebuild.node_dockerfile("base:1").startswith("FROM base:1\nCOPY files/ /\n")


def test_cleanups_never_follow_a_link_out_of_the_root_filesystem(tmp_path):
    outside = tmp_path / "machine"
    (outside / "sbin").mkdir(parents=True)
    (outside / "sbin" / "init").write_text("the machine's own init")
    root = tmp_path / "rootfs"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "sbin").symlink_to(outside / "sbin")  # absolute: leaves the tree
    with pytest.raises(HarnessError, match="leads outside the root filesystem"):
        debianrootfs._kind_cleanups(root)
    assert (outside / "sbin" / "init").read_text() == "the machine's own init"


def test_cleanups_do_what_kinds_dockerfile_does(tmp_path):
    root = tmp_path / "rootfs"
    for directory in ("usr/sbin", "usr/lib/systemd/system/multi-user.target.wants", "etc/systemd/system/x.wants"):
        (root / directory).mkdir(parents=True)
    (root / "sbin").symlink_to("usr/sbin")  # debootstrap's merged /usr: relative links
    (root / "lib").symlink_to("usr/lib")
    (root / "usr/lib/systemd/system/multi-user.target.wants/getty.target").write_text("")
    (root / "etc/systemd/system/x.wants/y.service").write_text("")
    (root / "etc/systemd/journald.conf").write_text("[Journal]\n")
    debianrootfs._kind_cleanups(root)
    assert os.readlink(root / "usr/sbin/init") == "/usr/lib/systemd/systemd"
    assert not list((root / "usr/lib/systemd/system/multi-user.target.wants").iterdir())
    assert not list((root / "etc/systemd/system/x.wants").iterdir())
    assert (root / "etc/systemd/journald.conf").read_text().endswith("ReadKMsg=no\n")
    assert os.readlink(root / "opt/cni/bin") == debianrootfs.CNI_BIN and (root / "etc/kubernetes/manifests").is_dir()


def test_mounts_left_in_the_tree_are_found_deepest_first(tmp_path):
    root = tmp_path / "rootfs"
    text = (f"proc /proc proc rw 0 0\nproc {root}/proc proc rw 0 0\nsysfs {root}/sys sysfs rw 0 0\n"
            f"devpts {root}/dev/pts devpts rw 0 0\ntmpfs {root}x tmpfs rw 0 0\n")
    assert debianrootfs.mounts_under(root, text) == [f"{root}/dev/pts", f"{root}/proc", f"{root}/sys"]


def _fake_debootstrap(directory: Path, fails: bool) -> None:
    """A stand-in for debootstrap on PATH: writes a file into the target (its 4th argument) and prints
    progress, or fails saying why on stderr."""
    script = directory / "debootstrap"
    body = ('echo "E: Couldn\'t download packages" >&2; exit 1' if fails else
            'echo "I: Retrieving InRelease"; mkdir -p "$4/etc"; echo fake > "$4/etc/debian_version"')
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


@pytest.mark.parametrize("fails", [False, True])
def test_the_root_filesystem_is_debootstrapped_and_packed_through_the_runner(tmp_path, monkeypatch, fails):
    """debootstrap's progress goes to its log, a failure names the command and its last stderr lines
    (not a traceback), and nothing half-made is left that a later build would trust."""
    from harness.core.progress import Reporter

    tools = tmp_path / "bin"
    tools.mkdir()
    _fake_debootstrap(tools, fails)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    cache = tmp_path / "cache"
    cache.mkdir()
    if fails:
        with pytest.raises(HarnessError) as caught:
            debianrootfs.rootfs_tar(Reporter(quiet=True), cache, suite="fake", packages=("a",), cleanups=None)
        assert "debootstrap" in str(caught.value) and "exited with 1" in str(caught.value)
        assert "Couldn't download packages" in str(caught.value)
        assert not list(cache.glob("rootfs-fake-*.tar")) and not list(cache.glob("*.work"))
        return
    tar = debianrootfs.rootfs_tar(Reporter(quiet=True), cache, suite="fake", packages=("a",), cleanups=None)
    import tarfile

    with tarfile.open(tar) as packed:
        assert "./etc/debian_version" in packed.getnames()
    assert "I: Retrieving InRelease" in (cache / "debootstrap-fake.log").read_text()
    assert tar.with_suffix(".sha256").read_text().strip() == manifest.sha256_file(tar)
    assert not list(cache.glob("*.work")) and not list(cache.glob("*.partial"))
