"""The node half of the fake DRA driver: a kubelet plugin (gRPC over unix sockets) that registers
with the kubelet, prepares allocated claims by writing CDI specs, keeps a checkpoint, and streams
device health derived from injected faults. One process per driver name and node; see
docs/kubelet-plugin.md. Needs grpcio and protobuf at run time (stubs are committed in generated/).

Imports are lazy, so `python -m fake_devices.kubeletplugin.generate` works even when generated/ is
missing or stale.
"""

__all__ = ["KubeletPlugin", "PluginConfig", "PluginError"]


def __getattr__(name: str):
    # lazy (see above): generate.py must import this package when generated/ is missing or stale
    if name == "PluginConfig":
        from fake_devices.kubeletplugin.config import PluginConfig

        return PluginConfig
    if name in ("KubeletPlugin", "PluginError"):
        from fake_devices.kubeletplugin import plugin

        return getattr(plugin, name)
    raise AttributeError(name)
