"""The committed gRPC stubs of the kubelet plugin are what the pinned generator makes of our protos,
and our protos are wire-compatible with the kubelet's (same packages, services, methods, messages,
field numbers and types) as published in k8s.io/kubelet v0.37.2."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fake_devices.kubeletplugin import generate

KUBELET_MODULE = "k8s.io/kubelet@v0.37.2"
UPSTREAM = {  # our file -> the upstream file in the kubelet module
    "pluginregistration_v1.proto": "pkg/apis/pluginregistration/v1/api.proto",
    "dra_v1.proto": "pkg/apis/dra/v1/api.proto",
    "dra_v1beta1.proto": "pkg/apis/dra/v1beta1/api.proto",
    "dra_health_v1alpha1.proto": "pkg/apis/dra-health/v1alpha1/api.proto",
    "dra_health_v1.proto": "pkg/apis/dra-health/v1/api.proto",
    "deviceplugin_v1beta1.proto": "pkg/apis/deviceplugin/v1beta1/api.proto",  # fake_devices/deviceplugin
}
# Protos of APIs the suite only calls as a client: a subset of the upstream one (what it reads), field by field.
UPSTREAM_SUBSETS = {
    "podresources_v1.proto": "pkg/apis/podresources/v1/api.proto",  # conformance/test_kubelet_node.py
}


def _tools_or_skip() -> None:
    try:
        version = importlib.metadata.version("grpcio-tools")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"grpcio-tools is not installed (pip install grpcio-tools=={generate.GRPCIO_TOOLS_VERSION}, "
                    "or the project's [dev] extra)")
    if version != generate.GRPCIO_TOOLS_VERSION:
        pytest.skip(f"grpcio-tools {version} is installed; the stubs are pinned to {generate.GRPCIO_TOOLS_VERSION}")


def test_regenerating_the_stubs_changes_nothing():
    _tools_or_skip()
    problems = generate.differences(generate.fresh(), generate.committed())
    assert not problems, ("generated/ differs from what the protos generate; run "
                          "`python -m fake_devices.kubeletplugin.generate`:\n" + "\n".join(problems))


def test_every_proto_has_stubs_and_relative_imports():
    committed = generate.committed()
    for proto in generate.proto_files():
        stem = proto.stem
        assert f"{stem}_pb2.py" in committed and f"{stem}_pb2_grpc.py" in committed
        assert f"from . import {stem}_pb2 as" in committed[f"{stem}_pb2_grpc.py"]
    assert set(UPSTREAM) | set(UPSTREAM_SUBSETS) == {p.name for p in generate.proto_files()}


def _descriptor_set(proto_dir: Path, name: str):
    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        assert protoc.main(["protoc", f"-I{proto_dir}", f"--descriptor_set_out={out}", name]) == 0, name
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (only,) = files.file
    return only


def _shape(file) -> dict:
    """Everything that decides the wire format and the RPC paths; no file names, comments or options."""
    def fields(message):
        return sorted((f.name, f.number, f.type, f.label, f.type_name, f.proto3_optional,
                       f.HasField("oneof_index")) for f in message.field)

    def messages(items, prefix=""):
        out = {}
        for m in items:
            out[prefix + m.name] = {"fields": fields(m), "map": m.options.map_entry}
            out.update(messages(m.nested_type, prefix + m.name + "."))
        return out

    return {"package": file.package, "syntax": file.syntax,
            "messages": messages(file.message_type),
            "enums": {e.name: sorted((v.name, v.number) for v in e.value) for e in file.enum_type},
            "services": {s.name: sorted((m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                                        for m in s.method) for s in file.service}}


def _kubelet_module_dir() -> Path:
    if shutil.which("go") is None:
        pytest.skip("needs Go to find the upstream protos in the Go module cache")
    proc = subprocess.run(["go", "mod", "download", "-json", KUBELET_MODULE], capture_output=True, text=True,
                          timeout=300, cwd=tempfile.gettempdir())
    try:
        directory = json.loads(proc.stdout).get("Dir")
    except ValueError:
        directory = None
    if proc.returncode != 0 or not directory:
        pytest.skip(f"cannot get {KUBELET_MODULE} from the Go module proxy: {proc.stderr.strip()[-300:]}")
    return Path(directory)


@pytest.mark.parametrize("ours", sorted(UPSTREAM))
def test_protos_match_the_kubelets_wire_format(ours):
    _tools_or_skip()
    upstream = _kubelet_module_dir() / UPSTREAM[ours]
    assert _shape(_descriptor_set(generate.PROTO_DIR, ours)) == _shape(_descriptor_set(upstream.parent, upstream.name))


@pytest.mark.parametrize("ours", sorted(UPSTREAM_SUBSETS))
def test_client_protos_are_a_subset_of_the_kubelets_wire_format(ours):
    """Every message, field and method we declare is upstream's, with the same number and type: fewer
    fields only means the reader skips them."""
    _tools_or_skip()
    upstream_file = _kubelet_module_dir() / UPSTREAM_SUBSETS[ours]
    mine, theirs = _shape(_descriptor_set(generate.PROTO_DIR, ours)), _shape(
        _descriptor_set(upstream_file.parent, upstream_file.name))
    assert (mine["package"], mine["syntax"]) == (theirs["package"], theirs["syntax"])
    for name, message in mine["messages"].items():
        assert name in theirs["messages"], f"{ours}: message {name} is not upstream's"
        missing = set(message["fields"]) - set(theirs["messages"][name]["fields"])
        assert not missing, f"{ours}: {name} fields differ from upstream's: {sorted(missing)}"
    for service, methods in mine["services"].items():
        assert set(methods) <= set(theirs["services"].get(service, [])), f"{ours}: service {service}"
