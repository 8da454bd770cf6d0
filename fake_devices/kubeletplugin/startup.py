"""The lines the plugin prints on its way up, and how a caller that started it reads them.

`ready` (stdout) means both of its sockets serve; the kubelet's NotifyRegistrationStatus then logs whether the
kubelet took it. A caller that goes on at `ready` races the kubelet's plugin watcher: a pod created at once can
fail its prepare with "DRA driver ... is not registered", and a plugin stopped at once was never registered, so
the kubelet never wipes its slices. The harness waits for both.
"""

from __future__ import annotations

READY = "ready"
REGISTERED = "registered with the kubelet as {driver}"
REFUSED = "the kubelet refused registration of {driver}: {error}"


class RegistrationRefused(Exception):
    """The kubelet answered the plugin's registration with an error (the line it logged says which)."""


def registered(log_text: str, driver: str) -> bool:
    """Whether a plugin's log (from its start on) shows it serving and registered as `driver`; raises
    RegistrationRefused with the kubelet's answer when the kubelet refused it."""
    lines = log_text.splitlines()
    refused = REFUSED.format(driver=driver, error="")
    for line in lines:
        if refused in line:
            raise RegistrationRefused(line[line.index(refused):])
    ours = REGISTERED.format(driver=driver)
    return READY in lines and any(line.rstrip().endswith(ours) for line in lines)
