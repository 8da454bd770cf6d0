"""Simulated nodes, shared by the backends: KWOK's stages (`stages`), the Node objects it keeps Ready
(`nodes`), and KWOK's controller deployed into a cluster that has none (`in_cluster`: kind)."""
