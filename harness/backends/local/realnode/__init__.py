"""Real nodes for the local backend: a kubelet v1.37.2 and containerd 2.x as local processes.

One job per module:
- hostfacts: what the machine offers (root, cgroups, overlayfs, runc, ...), read once into one record
- preflight: can this machine host one? decided from its HostFacts alone
- (where a node keeps its things, and its record in state.yaml: harness.core.nodelayout)
- images: the pause and shell images, built here as OCI archives (there is no registry)
- containerd, kubelet: configuration and command lines, as data
- network: the node's private bridge and CNI configuration
- cgroups: the node's own cgroup parent in every hierarchy
- host: machine-wide settings (sysctls, iptables), recorded and restored
- plugins: the fake driver's kubelet plugins on a node
- node: start; teardown: remove everything, also after a crash
See docs/real-node.md.
"""
