"""The verbs of the ``flowvault`` command by name, without importing what they run.

``flowvault --help``, ``--version`` and a usage error need only names and
one line each; importing every verb (and with it the services, pydantic
models and the crypto backend) would make them slow. The parser builds
the grammar of the verb given (``_grammar``) and imports no verb module:
a verb's handler is imported when it runs, so its ``--help`` is quick too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowvault.adapters.cli._verbs import Verbs

EXIT_CODES = """exit codes:
  0  success
  1  a flowvault error (its code and a fix are printed), a declined confirmation,
     or a listing that could not read some rows (printed after the rows)
  2  usage error
  130  interrupted (Ctrl-C): one line is printed; each unit of work is all or
       nothing, so none is left half-written
  141  the reader of stdout stopped early (a closed pipe); the rest of the output is dropped
"""

VERB_GROUPS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("_init", (("init", "create a new store and its key"),)),
    (
        "_status",
        (("status", "show the store's schema version, keys, counts, files and durability"),),
    ),
    (
        "_doctor",
        (
            (
                "doctor",
                "check permissions, SQLite settings and the key, with a fix for each finding",
            ),
        ),
    ),
    ("_restore", (("accept-restore", "accept a deliberately restored older copy of the store"),)),
    ("_workflows", (("workflows", "list and inspect workflows (metadata and hashes only)"),)),
    ("_runs", (("runs", "list and inspect graph runs (metadata and digests only); recover them"),)),
    ("_approvals", (("approvals", "list, inspect and decide approval requests"),)),
    (
        "_ledger",
        (
            (
                "ledger",
                "verify ledger chains, print stream heads, list streams, vouch for legacy streams",
            ),
        ),
    ),
    (
        "_report",
        (("report", "write one self-contained HTML page of the ledger, verdict and receipts"),),
    ),
    ("_scopes", (("scopes", "list the workflow state scopes (names and history streams)"),)),
    ("_fingerprint", (("fingerprint", "print the plaintext-free fingerprint of a scope's state"),)),
    (
        "_retention",
        (
            ("purge", "run the retention job, then compact the store"),
            ("compact", "rebuild the SQLite file so no free page or stale log remains"),
        ),
    ),
    (
        "_keys",
        (
            ("keys", "list, add and retire the keys of the key ring"),
            ("rotate-key", "re-seal every record still under an older key with the primary key"),
        ),
    ),
    (
        "_move",
        (
            (
                "migrate",
                "copy the whole store into an empty SQLite home or PostgreSQL schema, verified",
            ),
            (
                "export",
                "write the whole store, or one scope, to one archive file with a MAC'd manifest",
            ),
            (
                "import",
                "fill an empty store from an archive, or add a scope archive's scope to a store",
            ),
        ),
    ),
    ("_reset", (("reset-progress", "fingerprint a scope's workflow state and reset it"),)),
    ("_demo", (("demo", "run an approval workflow end to end in a fresh store, narrated"),)),
)
"""Each verb module of ``flowvault.adapters.cli``, its verbs and their help, in ``--help`` order."""

GLOBAL_VALUE_OPTIONS = ("--home", "--backend", "--postgres-dsn")
"""The global options that take a value; they may come before or after the verb."""


def chosen_group(argv: list[str]) -> str | None:
    """Return the module of the verb ``argv`` names, or ``None`` when it names none we know."""
    names = {verb: module for module, verbs in VERB_GROUPS for verb, _ in verbs}
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in GLOBAL_VALUE_OPTIONS:
            skip = True
        elif not word.startswith("-"):
            return names.get(word)
    return None


def register_group(verbs: Verbs, module: str) -> None:
    """Add the verbs of ``module``'s group, their arguments and handler names, to ``verbs``."""
    from flowvault.adapters.cli import _grammar  # noqa: PLC0415 - --help lists verbs without it

    getattr(_grammar, module.lstrip("_"))(verbs)


def verb_help(name: str) -> str:
    """Return the one line ``--help`` shows for verb ``name``, as listed in ``VERB_GROUPS``."""
    return next(help for _, verbs in VERB_GROUPS for verb, help in verbs if verb == name)
