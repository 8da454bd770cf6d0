"""The users registered with our dockerd (the engine record's `users`, each with the process that
registered it): added and removed under the engine lock, and a user a killed run left is forgotten."""

from __future__ import annotations

from collections.abc import Callable

from harness.backends.local import process
from harness.core.progress import Reporter

InUse = Callable[[str], bool]  # whether a user still needs the engine, whatever process registered it


def always_in_use(user: str) -> bool:
    return True


def register(record: dict, user: str, in_use: InUse, reporter: Reporter) -> None:
    """`user` added to the record, registered by this process (the stale users dropped first)."""
    forget_stale(record, user, in_use, reporter)
    record["users"] = sorted(set(record["users"]) | {user})
    record["registeredBy"][user] = process.identity()


def unregister(record: dict, user: str, in_use: InUse, reporter: Reporter) -> None:
    """`user` removed from the record (the stale users with it)."""
    forget_stale(record, user, in_use, reporter)
    record["users"] = [u for u in record["users"] if u != user]
    record["registeredBy"].pop(user, None)


def forget_stale(record: dict, acting: str, in_use: InUse, reporter: Reporter) -> None:
    """Drop the users a killed run left: registering process gone and not `in_use` (e.g. a SIGKILL
    while the node image was built, before the cluster had state: no `cluster down` could release it,
    and our dockerd would run for good)."""
    registered = record.get("registeredBy", {})
    kept = []
    for user in record.get("users", []):
        owner = process.Running(name=user, **process.identity_fields(registered.get(user, {})))
        if user == acting or process.alive(owner) or in_use(user):
            kept.append(user)
        else:
            reporter.info(f"forgetting {user!r} as a user of the harness's dockerd: the run that registered it "
                          "is gone and left nothing in use")
            registered.pop(user, None)
    record["users"], record["registeredBy"] = kept, registered
