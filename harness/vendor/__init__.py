"""Vendor mode in one place: testing a driver that is not the harness's own.

- `file`: the vendor file (`--driver-config vendor.yaml`, kind VendorDriver), read and checked alone;
- `cluster_check`: the file checked against the cluster under test, before any test;
- `setup`: what the file asks the run to set up (spec.manifests, spec.kubeletPlugin) and take down,
  for `dra-harness conformance run` and plain pytest alike;
- `plugins`: the vendor's kubelet plugin as a process on a local cluster's real node;
- `diagnostics`: vendor mode's part of a failed test's diagnostics.

Layered between the sanity checks (which drive a vendor's plugin) and the backends (whose real nodes
run it); the suite reaches it only through the pytest plugin.
"""
