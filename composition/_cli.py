"""The ``flowvault`` console script: parse, build the verb's context, run the verb.

It sits in the outermost ring so the verbs (``flowvault.adapters.cli``)
receive a ``CliContext`` and never import the composition root. Each verb
group registers itself from its own module there, imported only when its
verb is given (``VERB_GROUPS`` names them all).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from flowvault.adapters.cli._catalog import EXIT_CODES, VERB_GROUPS, chosen_group, register_group

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""What a shell reports for a process ended by Ctrl-C."""

_GLOBAL_OPTIONS: tuple[tuple[str, dict[str, object]], ...] = (
    ("--home", {"help": "the flowvault home directory (FLOWVAULT_HOME)"}),
    ("--backend", {"choices": ["sqlite", "postgres", "memory"], "help": "FLOWVAULT_BACKEND"}),
    (
        "--postgres-dsn",
        {"help": "FLOWVAULT_POSTGRES_DSN (prefer the variable: argv is visible)"},
    ),
    ("--debug", {"action": "store_true", "help": "show tracebacks of crashes"}),
)


def _installed_version() -> str:
    try:
        return version("flowvault")
    except PackageNotFoundError:
        return "unknown"


def _add_global_options(parser: argparse.ArgumentParser, *, after_verb: bool) -> None:
    """Add the global options; after a verb they default to nothing, so one given before stands."""
    for option, settings in _GLOBAL_OPTIONS:
        if option in parser._option_string_actions:
            continue
        extra: dict[str, object] = {"default": argparse.SUPPRESS} if after_verb else {}
        parser.add_argument(option, **settings, **extra)  # type: ignore[arg-type]


def _accept_global_options(parser: argparse.ArgumentParser) -> None:
    """Let the global options follow a verb too, at every level of its sub-verbs."""
    _add_global_options(parser, after_verb=True)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _accept_global_options(sub)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Return the argument parser; with ``argv``, only the verb it names is built in full.

    The other verbs are listed by name and help alone, so ``--help`` and a
    usage error import none of them; without ``argv`` every verb is built.
    """
    parser = argparse.ArgumentParser(
        prog="flowvault",
        description="Durable, sealed, tamper-evident workflow state.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flowvault {_installed_version()}")
    _add_global_options(parser, after_verb=False)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    chosen = None if argv is None else chosen_group(list(argv))
    for module, names in VERB_GROUPS:
        if argv is not None and module != chosen:
            for name, help in names:
                verbs.add_parser(name, help=help, add_help=False)
            continue
        before = set(verbs.choices)
        register_group(verbs, module)
        for name in set(verbs.choices) - before:
            _accept_global_options(verbs.choices[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb and return its exit status (0 ok, 1 flowvault error, 2 usage, 130 Ctrl-C)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(arguments).parse_args(arguments)
        from flowvault.composition._cli_run import run_verb  # noqa: PLC0415 - keeps --help fast

        return run_verb(args)
    except KeyboardInterrupt:
        sys.stderr.write(
            "flowvault: interrupted; each unit of work is all or nothing, "
            "so none is left half-written\n"
        )
        return EXIT_INTERRUPTED


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""What a shell reports for a writer whose reader stopped early, as for ``yes | head``."""


def run() -> None:
    """Console-script entry point.

    A reader that stops early (``flowvault workflows list | head``) closes
    the pipe: the rest of the output is dropped without a traceback, and
    the exit status is that of a process ended by SIGPIPE. Stdout is pointed
    at the null device first, so the interpreter's own flush at exit cannot
    fail again.
    """
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        sys.exit(EXIT_BROKEN_PIPE)
    sys.exit(status)
