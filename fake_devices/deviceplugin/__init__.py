"""A legacy device plugin for the migration rehearsal: the fake devices of a node profile served
through the kubelet's device plugin API v1beta1 (the pre-DRA way), as one extended resource such as
`example.com/gpu`. One process per resource and node; see docs/migration.md.

    <registry_dir>/<name>-reg.sock   pluginregistration.Registration, type "DevicePlugin" (plugin watcher)
    <plugin_dir>/device-plugin.sock  v1beta1.DevicePlugin: options, ListAndWatch, Allocate, ...

Every call the kubelet makes is appended to a journal (`calls.jsonl` in the state directory), so a
test can tell that the kubelet really allocated a device through this plugin, and which.
On simulated nodes there is no kubelet to talk to: `simulated.py` advertises the same resource by
patching the node's status, as the kubelet would.
"""
