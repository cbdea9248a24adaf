"""``flowvault accept-restore``: accept a deliberately restored older copy of the store."""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.domain import InvalidInput


def accept_restore_command(accepted: tuple[int | None, int, str] | None, io: CommandIO) -> int:
    """Report the high-water mark reset after a deliberate restore; ``None`` on a cold root."""
    if accepted is None:
        io.emit({"cold_root": True}, ["cold root: no store exists, nothing to accept"])
        return 0
    previous, current, location = accepted
    document = {"cold_root": False, "previous": previous, "epoch": current, "mark": location}
    shown = "none" if previous is None else f"commit {previous}"
    io.emit(
        document,
        [
            f"accepted the store as it is: high-water mark {location} now at commit "
            f"{current} (it was {shown})",
            "commits made after the restored copy was taken are not in this store",
        ],
    )
    return 0


# -- gathering and arguments ----------------------------------------------------


def _accept_restore(args: argparse.Namespace, context: CliContext, io: CommandIO) -> int:
    settings = context.settings
    if context.is_cold_root():
        return accept_restore_command(None, io)
    path = settings.high_water_path
    if path is None:
        raise InvalidInput(
            f"no high-water mark is kept for the {settings.backend} backend: set "
            "FLOWVAULT_HIGH_WATER_FILE to keep one"
        )
    if not args.yes:
        question = (
            "Accept this store as it is? Commits made after the restored copy was taken "
            "stay lost, and the store will no longer be refused as older"
        )
        if not io.interactive:
            raise InvalidInput("accepting a restore needs --yes off a terminal")
        if not io.confirm(question):
            io.err.write("aborted: the high-water mark is unchanged\n")
            return 1
    with context.restore_guard(path) as guard:
        if guard is None:
            raise InvalidInput("this store keeps no commit count (no StoreEpoch)")
        previous, current = guard.accept()
    return accept_restore_command((previous, current, str(path)), io)
