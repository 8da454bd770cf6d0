"""The sanity mode: one kubelet plugin checked against the written kubelet-plugin contract of DRA.

`rules` is the contract (one rule per row, with its upstream source), `kubelet` the kubelet's side of the
plugin's sockets, `cdi` how a container runtime reads CDI specs, `target` the throwaway cluster the plugin
runs against. The checks are conformance/sanity; `dra-harness sanity` (harness.jobs.sanity_runner) runs them.
"""
