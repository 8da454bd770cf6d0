"""The device-plugin -> DRA migration rehearsal (docs/migration.md): one unchanged workload manifest
asking for an extended resource, a stream of such pods, and the nodes moved one by one from a legacy
device plugin to a DRA driver whose DeviceClass names the same resource (DRAExtendedResource, GA in 1.37).

- workload: the manifest, and which path served a bound pod
- rehearsal: the phases, the bounded pod stream, the per-phase counts and their report
- command: `dra-harness migration rehearse`
"""
