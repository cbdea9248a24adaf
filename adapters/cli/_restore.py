"""``flowvault accept-restore``: accept a deliberately restored older copy of the store."""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._catalog import verb_help
from flowvault.adapters.cli._context import CliContext
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._verbs import Verbs, add_verb
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


def register(verbs: Verbs) -> None:
    """Add ``accept-restore`` to the parser."""
    accept = add_verb(
        verbs,
        "accept-restore",
        help=verb_help("accept-restore"),
        description=(
            "A store opened below its high-water mark (the highest commit count and the "
            "size of every ledger stream this host saw, kept beside the key file or at "
            "FLOWVAULT_HIGH_WATER_FILE) is refused with STORE_ROLLED_BACK, because an older "
            "copy of the database was put back over it or a stream's newest events were "
            "deleted. When that restore was deliberate, this restarts the mark from the "
            "store as it is so it opens again. The commits made since stay lost. "
            "Asks for confirmation on a terminal; elsewhere needs --yes."
        ),
        handler=_accept_restore,
    )
    accept.add_argument("--yes", action="store_true", help="do not ask for confirmation")
