"""The grammar of the ``flowvault`` command: each verb's arguments and the handler it runs.

Parsing, ``--help`` included, needs only this module: a handler is named
as ``"module:function"`` of ``flowvault.adapters.cli`` and imported when
its verb runs, so asking a verb for its help loads none of the library.
Values that belong to the library (states, limits, variable names) are
repeated here as literals, and a test holds them equal to their source.
"""

from __future__ import annotations

import argparse

from flowvault.adapters.cli._catalog import verb_help
from flowvault.adapters.cli._verbs import (
    COLD_NOTE,
    EVENT_LIMIT,
    DeferredType,
    Verbs,
    add_paging,
    add_verb,
    file_path,
    verb_group,
)

APPROVAL_STATUSES = ("pending", "decided", "expired")
"""``ApprovalStatus``'s values, in its order."""
RUN_STATUSES = (
    "accepted",
    "awaiting_approval",
    "cancelled",
    "checkpointed",
    "completed",
    "failed",
    "interrupted_non_resumable",
    "running",
)
"""The run lifecycle's states, sorted."""
DEFAULT_BATCH = 200
MAX_BATCH = 1000
"""``rotate-key``'s batch size: the rotation's default and ceiling."""
KEY_ENV = "FLOWVAULT_KEY"
REVEAL_HELP = (
    "print the sealed audience and allowed decisions in clear (and name the allowed "
    "decisions when one is refused); never an actor or a decision"
)


def init(verbs: Verbs) -> None:
    """Add ``init`` to the parser."""
    add_verb(
        verbs,
        "init",
        help=verb_help("init"),
        description=(
            "Create a new store and its key with private permissions (0700 directories, "
            "0600 files) at the configured home, and print where they are and the key id "
            "(never the key). Refuses, with exit status 1, when a store already exists. "
            f"With postgres, the key must come from {KEY_ENV} or FLOWVAULT_KEY_FILE; memory "
            "has nothing to init."
        ),
        handler="_init:_init",
    )


def status(verbs: Verbs) -> None:
    """Add ``status`` to the parser."""
    add_verb(
        verbs,
        "status",
        help=verb_help("status"),
        description=(
            "Show the backend, home, schema version, key ids in use, records per namespace, "
            "file sizes and durability settings; workflows by state, approvals pending, "
            "expired and decided, the ledger's streams and events, the commit count and how "
            "far the high-water mark is behind it. Reads no sealed payload; only the mark "
            "is read with the key, when one exists. "
            "On a cold root it says so, creates nothing and exits 0."
        ),
        handler="_status:_status",
    )


def doctor(verbs: Verbs) -> None:
    """Add ``doctor`` to the parser."""
    add_verb(
        verbs,
        "doctor",
        help=verb_help("doctor"),
        description=(
            "Check directory and file permissions, read the SQLite pragmas back, and check "
            "that the key is found, opens every record's key id and is kept apart from the "
            "data. Exits 0 when no check fails with severity error, 1 otherwise (also on a "
            "cold root, where it reports 'no store' and creates nothing)."
        ),
        handler="_doctor:_doctor",
    )


def restore(verbs: Verbs) -> None:
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
        handler="_restore:_accept_restore",
    )
    accept.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def workflows(verbs: Verbs) -> None:
    group = verb_group(verbs, "workflows", verb_help("workflows"))
    listing = add_verb(
        group,
        "list",
        help="list workflows, newest written first",
        description="List workflows by id, kind, state and version, newest written first. "
        + COLD_NOTE,
        handler="_workflows:_workflows_list",
    )
    listing.add_argument("--state", help="only workflows in this state, e.g. 'decision'")
    add_paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one workflow's metadata, hashes and ledger length",
        description="Show one workflow: state, version, times, hashes and the length of its "
        "verified ledger. Never prints the work order's parameters or requester.",
        handler="_workflows:_workflows_show",
    )
    show.add_argument("id", help="the workflow id")
    events = add_verb(
        group,
        "events",
        help="list one workflow's verified events, oldest first",
        description="List one workflow's ledger events by index, type, states, time and hash, "
        "oldest first, each page verified against the event before it. Never prints an "
        "event's payload.",
        handler="_workflows:_workflows_events",
    )
    events.add_argument("id", help="the workflow id")
    add_paging(events, default=EVENT_LIMIT)


def runs(verbs: Verbs) -> None:
    group = verb_group(verbs, "runs", verb_help("runs"))
    listing = add_verb(
        group,
        "list",
        help="list graph runs, newest written first",
        description="List graph runs by id, definition, status and times, newest written "
        "first. " + COLD_NOTE,
        handler="_runs:_runs_list",
    )
    listing.add_argument("--status", choices=RUN_STATUSES, help="only this status")
    add_paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one run's metadata, counts and terminal receipt digest",
        description="Show one graph run: status, times, counts, definition version, the "
        "number of its events and, once finished, its terminal receipt's digests. Never "
        "prints its input, budgets or state.",
        handler="_runs:_runs_show",
    )
    show.add_argument("run_id", help="the run id")
    receipt = add_verb(
        group,
        "receipt",
        help="print a finished run's terminal receipt, to keep outside the store",
        description="Print the terminal receipt of a finished run as one line of canonical "
        "JSON, after checking it under the store key: digests, status and counts only. "
        "When the run ended with FLOWVAULT_SIGNING_KEY_FILE set, it carries an Ed25519 "
        "signature that 'ledger check-receipt' checks with the public key alone.",
        handler="_runs:_runs_receipt",
    )
    receipt.add_argument("run_id", help="the run id")

    events = add_verb(
        group,
        "events",
        help="list one run's verified events, oldest first",
        description="List one run's events by index, type, states, time and hash, oldest "
        "first, each page verified against the event before it. The cursor is the index of "
        "the next event. Never prints an event's payload.",
        handler="_runs:_runs_events",
    )
    events.add_argument("run_id", help="the run id")
    add_paging(events, default=EVENT_LIMIT)
    add_verb(
        group,
        "recover",
        help="end interrupted the runs whose host's lease expired",
        description="Take over every accepted or running run whose owner's lease expired "
        "(judged by the database server's clock on PostgreSQL): each ends "
        "interrupted_non_resumable with its terminal receipt, owned by this host, so the "
        "host that lost it is refused (RUN_FENCED) if it comes back. Runs whose owner still "
        "holds its lease, and paused runs, are left alone. Safe to repeat and to run from "
        "any host; FLOWVAULT_HOST_ID names this host. On a cold root it creates nothing.",
        handler="_runs:_runs_recover",
    )


def approvals(verbs: Verbs) -> None:
    group = verb_group(verbs, "approvals", verb_help("approvals"))
    listing = add_verb(
        group,
        "list",
        help="list approvals, of one run or of all, most recently written first",
        description="List approvals by id, status, times and run, most recently written "
        "first (a request or a decision writes one). " + COLD_NOTE,
        handler="_approvals:_approvals_list",
    )
    listing.add_argument("--run", metavar="RUN_ID", help="only this run's approvals")
    listing.add_argument("--status", choices=APPROVAL_STATUSES, help="only this status")
    add_paging(listing)
    show = add_verb(
        group,
        "show",
        help="show one approval: deadline, quorum, digests; --reveal adds audience and decisions",
        description="Show one approval: status, deadline, quorum (required and votes so "
        "far), and keyed digests of its prompt, audience, allowed decisions and who decided. "
        "With --reveal it also prints the audience and the allowed decisions in clear. "
        "Never prints an actor or a decision in clear; the prompt text is not stored, only "
        "its digest.",
        handler="_approvals:_approvals_show",
    )
    show.add_argument("approval_id", help="the approval id")
    show.add_argument("--reveal", action="store_true", help=REVEAL_HELP)
    decide = add_verb(
        group,
        "decide",
        help="record a decision and consume the approval's checkpoint",
        description="Record a decision on a pending approval and consume its checkpoint in "
        "one unit of work, then print the approval receipt's digests. On a terminal it asks "
        "first unless --yes is given. Fails with APPROVAL_EXPIRED, APPROVAL_ALREADY_DECIDED "
        "or APPROVAL_DECISION_NOT_ALLOWED.",
        handler="_approvals:_approvals_decide",
    )
    decide.add_argument("approval_id", help="the approval id")
    decide.add_argument("--decision", required=True, help="one of the allowed decisions")
    decide.add_argument("--actor", required=True, help="who decides (stored sealed, shown keyed)")
    decide.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    decide.add_argument("--reveal", action="store_true", help=REVEAL_HELP)
    decide.add_argument(
        "--signature-file",
        type=file_path,
        metavar="FILE",
        help="the actor's Ed25519 signature of the decision statement (raw or hex); "
        "required once the actor has a registered key",
    )
    _approval_signing_verbs(group)
    add_verb(
        group,
        "expire",
        help="record every overdue approval's expiry and fail the runs left waiting",
        description="Record the expiry of every pending approval past its deadline (its "
        "checkpoint is consumed with it), then move each run still awaiting_approval whose "
        "newest approval expired, with none pending, to failed. Prints the counts; safe to "
        "repeat. On a cold root it creates nothing.",
        handler="_approvals:_approvals_expire",
    )


def _approval_signing_verbs(group: Verbs) -> None:
    statement = add_verb(
        group,
        "statement",
        help="print the exact bytes a decider signs for a decision",
        description="Print the decision statement (canonical JSON) a decider with a "
        "registered key signs, e.g. with 'openssl pkeyutl -sign -rawin'.",
        handler="_approvals:_approvals_statement",
    )
    statement.add_argument("approval_id", help="the approval id")
    statement.add_argument("--decision", required=True, help="one of the allowed decisions")
    register = add_verb(
        group,
        "register-key",
        help="register a decider's Ed25519 public key; their decisions must then be signed",
        description="Register the Ed25519 public key (PEM) of a decider. From then on a "
        "decision by that actor counts only with --signature-file, and its signed statement "
        "can be checked by anyone holding the public key.",
        handler="_approvals:_approvals_register_key",
    )
    register.add_argument("--actor", required=True, help="the decider (stored sealed)")
    register.add_argument(
        "public_key", type=file_path, metavar="PUBLIC_KEY", help="the public key file (PEM)"
    )
    signed = add_verb(
        group,
        "signed",
        help="print an approval's signed decisions, one JSON line each, for an auditor",
        description="Print each signed decision of an approval as one JSON line: the "
        "statement, the signature and the decider's keyed digest. Check a line with "
        "'approvals verify-decision' and the decider's public key alone.",
        handler="_approvals:_approvals_signed",
    )
    signed.add_argument("approval_id", help="the approval id")
    verify = add_verb(
        group,
        "verify-decision",
        help="check a signed decision with the decider's public key alone",
        description="Check that a line printed by 'approvals signed' was signed by the "
        "holder of the given key: no store and no store key are needed. Exits 1 "
        "(INTEGRITY_FAILURE) when the signature is not that key's.",
        handler="_approvals:_approvals_verify_decision",
    )
    verify.add_argument("statement", metavar="FILE", help="the signed decision ('-' for stdin)")
    verify.add_argument(
        "--public-key", type=file_path, metavar="FILE", required=True, help="the public key (PEM)"
    )


def ledger(verbs: Verbs) -> None:
    """Add the ``ledger`` group to the parser."""
    group = verbs.add_parser(
        "ledger",
        help=verb_help("ledger"),
        description=(
            "Audit the tamper-evident ledger. Every verb but 'vouch --head-hash' only reads."
        ),
    )
    leaves = group.add_subparsers(dest="ledger_verb", required=True, metavar="VERB")
    verify = add_verb(
        leaves,
        "verify",
        help="verify the hash chain of one stream or of every stream",
        description=(
            "Verify ledger hash chains from each stream's first retained event to its head. "
            "With --all, every stream is verified and every record is opened with the key "
            "and counted readable or unreadable (unverified when no key is available). "
            "With --against, each receipt is authenticated (its MAC under the store key, "
            "and its signature when --public-key is given), its stream verified, and the "
            "stream must still hold the receipt's head at the receipt's index: deleted "
            "events, a restored older copy and rewritten history all fail. "
            "The store is opened read-only: on SQLite nothing is created, migrated or "
            "written, so a copy of a database file can be audited unchanged. Exits 1 "
            "(INTEGRITY_FAILURE) when any stream fails."
        ),
        handler="_ledger:_ledger_verify",
    )
    target = verify.add_mutually_exclusive_group(required=True)
    target.add_argument("--stream", metavar="NAME", help="verify this stream only")
    target.add_argument("--all", action="store_true", help="verify every stream and record")
    target.add_argument(
        "--against",
        metavar="RECEIPT",
        type=DeferredType("_ledger:_receipt_path"),
        action="append",
        help="a receipt file from 'ledger head' ('-' for stdin); repeat for several",
    )
    verify.add_argument(
        "--public-key",
        type=file_path,
        metavar="FILE",
        help="also check each receipt's Ed25519 signature with this public key",
    )
    head = add_verb(
        leaves,
        "head",
        help="print a stream's head receipt, MAC'd and optionally signed",
        description=(
            "Print a head receipt of a stream: its origin line, size, base64 head hash, "
            "first retained index and time, then a MAC line under the store key and, when "
            "FLOWVAULT_SIGNING_KEY_FILE is set, an Ed25519 signature line. Keep it outside "
            "the store and check the store against it later with 'ledger verify --against'. "
            "Read-only; needs the store key."
        ),
        handler="_ledger:_ledger_head",
    )
    head.add_argument("--stream", metavar="NAME", required=True, help="the stream")
    streams = add_verb(
        leaves,
        "streams",
        help="list the ledger streams: name, kind, size and head index",
        description=(
            "List the ledger streams in name order: each stream's name (as 'ledger head "
            "--stream' and 'ledger verify --stream' take it), its kind (workflow, run, "
            "scope, a record kind such as checkpoint, or host), its size (the events it "
            "has had, trimmed ones included) and its head index. Names are what the store "
            "keeps in the clear: a record stream is named by a keyed digest, never a "
            "natural key. Reads no event payload and needs no key. On a cold root it "
            "creates nothing."
        ),
        handler="_ledger:_ledger_streams",
    )
    add_paging(streams)
    vouch = add_verb(
        leaves,
        "vouch",
        help="vouch, under the key, for a stream host code wrote without MACs or cut unrecorded",
        description=(
            "A stream host code appended to without the stream writer carries no chain MAC, "
            "and one whose oldest events host code dropped has no ledger.trimmed "
            "event: both fail every keyed verifier (unkeyed, truncated), exactly as a "
            "stream an editor stripped or cut would. Without --head-hash, check the "
            "stream's plain chain and print its size and head hash, writing nothing; "
            "compare them with a copy you trust. With --head-hash, append one keyed "
            "ledger.vouched event after that head (refused if the head is another), and "
            "the stream verifies from then on. A stream that verifies, or fails in any "
            "other way (edited, forged, a MAC missing after a keyed event), is refused."
        ),
        handler="_ledger:_ledger_vouch",
    )
    vouch.add_argument("--stream", metavar="NAME", required=True, help="the stream")
    vouch.add_argument(
        "--head-hash",
        metavar="HASH",
        help="the head hash you compared with a trusted copy; without it nothing is written",
    )
    check = add_verb(
        leaves,
        "check-receipt",
        help="check a head or terminal receipt's Ed25519 signature with a public key alone",
        description=(
            "Check that a receipt (a head receipt from 'ledger head' or a terminal receipt "
            "from 'runs receipt') was signed by the holder of the signing key, using only "
            "its public key: no store and no store key are needed. Exits 1 "
            "(INTEGRITY_FAILURE) when no valid signature by that key is on it."
        ),
        handler="_ledger:_check_receipt",
    )
    check.add_argument(
        "receipt",
        type=DeferredType("_ledger:_receipt_path"),
        metavar="RECEIPT",
        help="the receipt file ('-' for stdin)",
    )
    check.add_argument(
        "--public-key", type=file_path, metavar="FILE", required=True, help="the public key (PEM)"
    )


def report(verbs: Verbs) -> None:
    """Add the ``report`` verb to the parser."""
    parser = add_verb(
        verbs,
        "report",
        help=verb_help("report"),
        description=(
            "Write one self-contained HTML page (inline CSS; no script, link, font or "
            "address) of the whole store, or of one workflow, run or scope: the verdict "
            "'ledger verify' gives (with --all for the whole store, with --stream for "
            "one subject's stream), each finding highlighted, the timeline of the ledger "
            "(time, stream, sequence, event type, lifecycle states, actor digest, "
            "decision) and the terminal receipts of finished runs by digest. Payloads are "
            "never copied: only digests, ids, types, states and times. The store is opened "
            "read-only. The page is written in a temporary file and renamed over OUT. "
            "Exits 0 when everything verified, 1 (INTEGRITY_FAILURE) when there are "
            "findings, with the page still written."
        ),
        handler="_report:_report",
    )
    parser.add_argument(
        "--html",
        type=DeferredType("_report:_page_path"),
        metavar="OUT",
        required=True,
        help="the page to write",
    )
    subject = parser.add_mutually_exclusive_group()
    subject.add_argument("--workflow", metavar="ID", help="only the stream workflow/ID")
    subject.add_argument("--run", metavar="ID", help="only the stream run/ID")
    subject.add_argument("--scope", metavar="S", help="only the stream scope/S")


def scopes(verbs: Verbs) -> None:
    """Add the ``scopes`` group to the parser."""
    leaves = verb_group(verbs, "scopes", verb_help("scopes"))
    listing = add_verb(
        leaves,
        "list",
        help="list the scopes, in name order, with their history streams",
        description=(
            "List every workflow state scope in name order: its name (as 'fingerprint "
            "--scope', 'reset-progress --scope' and 'export --scope' take it), its history "
            "stream 'scope/<name>' and that stream's size (the events it has had). A scope "
            "appears once any state was written to it. Reads no sealed record and needs no "
            "key. On a cold root it creates nothing."
        ),
        handler="_scopes:_scopes_list",
    )
    add_paging(listing)


def fingerprint(verbs: Verbs) -> None:
    """Add ``fingerprint`` to the parser."""
    fingerprint = add_verb(
        verbs,
        "fingerprint",
        help=verb_help("fingerprint"),
        description=(
            "Print what can be said of a scope's workflow state without its content: "
            "readability, revision, sizes and digests. On a cold root it reports the "
            "state absent and creates nothing."
        ),
        handler="_fingerprint:_fingerprint",
    )
    fingerprint.add_argument("--scope", required=True, help="the scope (bucket or profile)")
    fingerprint.add_argument("--reason", help="a reason class such as 'corrupt' (default: derived)")


def _purge(verbs: Verbs) -> None:
    purge = add_verb(
        verbs,
        "purge",
        help=verb_help("purge"),
        description=(
            "Delete what retention allows, each deletion leaving a digest-only tombstone "
            "in the ledger: expired action results first, then decided approvals, consumed "
            "checkpoints, idempotency records and (only if asked) finished runs; then "
            "compact the store. Prints the count per kind. On a cold root it creates nothing."
        ),
        handler="_retention:_purge",
    )
    purge.add_argument(
        "--older-than-days",
        type=DeferredType("_retention:_days"),
        metavar="DAYS",
        help=(
            "age past which decided approvals, consumed checkpoints and idempotency "
            "records go (default: 90, 30 and 7 days)"
        ),
    )
    purge.add_argument(
        "--finished-runs-older-than-days",
        type=DeferredType("_retention:_days"),
        metavar="DAYS",
        help="also delete runs finished this long ago (default: keep finished runs)",
    )


def _compact(verbs: Verbs) -> None:
    add_verb(
        verbs,
        "compact",
        help=verb_help("compact"),
        description=(
            "Rebuild the database file with VACUUM, which rewrites every page and gives "
            "free pages back to the file system, then checkpoint and truncate the "
            "write-ahead log. Deletions already zero what they free and truncate the log; "
            "this also shrinks the file. It rewrites the whole file and blocks writers "
            "meanwhile: run it when the store is quiet. SQLite only. Prints each file's "
            "size before and after. On a cold root it creates nothing."
        ),
        handler="_retention:_compact",
    )


def retention(verbs: Verbs) -> None:
    """Add ``purge`` and ``compact`` to the parser."""
    _purge(verbs)
    _compact(verbs)


def keys(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    group = verbs.add_parser(
        "keys",
        help=verb_help("keys"),
        description="Manage the key ring kept in the key file. Never prints key material.",
    )
    leaves = group.add_subparsers(dest="keys_verb", required=True, metavar="VERB")
    add_verb(
        leaves,
        "list",
        help="show each key id, its role, and the records and seals under it",
        description=(
            "Show every key id of the ring (primary first, then open-only keys), the records "
            "sealed under each, and the seals counted against its nonce budget. Key ids that "
            "records name but the ring lacks are listed as missing."
        ),
        handler="_keys:_keys_list",
    )
    add_verb(
        leaves,
        "add",
        help="generate a new key and make it the primary key",
        description=(
            "Generate a new key and make it primary: the key file is rewritten atomically, "
            "the previous keys stay to open what they sealed, and processes opening the "
            "store from now on seal under the new key (restart running ones). Then run "
            "'flowvault rotate-key'."
        ),
        handler="_keys:_keys_add",
    )
    retire = add_verb(
        leaves,
        "retire",
        help="remove an open-only key that no record uses any more",
        description=(
            "Remove an open-only key from the ring. Refused while any record is still "
            "sealed under it (the message names how many) and for the primary key."
        ),
        handler="_keys:_keys_retire",
    )
    retire.add_argument("key_id", metavar="KEY_ID", help="the key id, as 'keys list' shows it")
    signing = add_verb(
        leaves,
        "signing-key",
        help="create an Ed25519 key pair for signing ledger head receipts",
        description=(
            "Create a new Ed25519 signing key at FILE (0600, PEM) and its public key at "
            "FILE.pub. Neither is ever overwritten. Point FLOWVAULT_SIGNING_KEY_FILE at FILE "
            "so 'ledger head' signs receipts, and hand FILE.pub to whoever checks them with "
            "'ledger check-receipt'. Needs no store."
        ),
        handler="_keys:_signing_key",
    )
    signing.add_argument(
        "--out", type=file_path, required=True, metavar="FILE", help="where to write the key"
    )
    rotate = add_verb(
        verbs,
        "rotate-key",
        help=verb_help("rotate-key"),
        description=(
            "Re-seal every record still sealed under an older key with the primary key, in "
            "batches that each commit as one unit guarded by the revisions read; a record "
            "changed meanwhile is re-read, never overwritten. Safe beside running writers "
            "and resumable: after a crash, run it again. Prints the records per key id "
            "after; exits 1 if any record was left under an older key."
        ),
        handler="_keys:_rotate_key",
    )
    rotate.add_argument(
        "--batch-size",
        type=DeferredType("_keys:_batch_size"),
        default=DEFAULT_BATCH,
        help=f"records per unit of work (default {DEFAULT_BATCH}, at most {MAX_BATCH})",
    )


def _target_options(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--to",
        required=required,
        type=DeferredType("_move:target_location"),
        metavar="TARGET",
        help="a PostgreSQL DSN (postgres://...) or the home directory of a SQLite store",
    )
    parser.add_argument(
        "--to-schema",
        metavar="NAME",
        help="the PostgreSQL schema to fill (default: FLOWVAULT_POSTGRES_SCHEMA)",
    )


def move(verbs: Verbs) -> None:
    """Add ``migrate``, ``export`` and ``import`` to the parser."""
    migrate = add_verb(
        verbs,
        "migrate",
        help=verb_help("migrate"),
        description=(
            "Copy every record (its sealed bytes and header as they are), every ledger event, "
            "the seal counts and the commit count into an empty target, in one transaction, "
            "then verify it: it must read back byte for byte as the source, and pass a keyed "
            "audit (every stream verified, every record opened). The source is only read. "
            "An interrupted migrate leaves the target empty; run it again. The target opens "
            "with the source's key (copy the key file, or set FLOWVAULT_KEY)."
        ),
        handler="_move:_migrate",
    )
    _target_options(migrate)
    export = add_verb(
        verbs,
        "export",
        help=verb_help("export"),
        description=(
            "Write every record, ledger event, seal count and the commit count to a new zip "
            "archive whose manifest (counts and SHA-256 of each part) is MAC'd under the store "
            "key. With --scope, only that workflow state scope's state row and history stream "
            "(and the store's seal counts). With --sign, the manifest is also signed with the "
            "Ed25519 signing key (FLOWVAULT_SIGNING_KEY_FILE), so anyone with its public key "
            "can check the archive's origin. The store is only read. Import it with "
            "'flowvault import'."
        ),
        handler="_move:_export",
    )
    export.add_argument("--to", required=True, type=file_path, metavar="FILE", help="new file")
    export.add_argument(
        "--scope",
        type=DeferredType("_move:scope_name"),
        metavar="NAME",
        help="export only this workflow state scope",
    )
    export.add_argument(
        "--sign", action="store_true", help="sign the manifest with the Ed25519 signing key"
    )
    imported = add_verb(
        verbs,
        "import",
        help=verb_help("import"),
        description=(
            "Verify the archive's manifest under the store key (and its signature, with "
            "--public-key) and every part against it. A whole-store archive then fills an "
            "empty target in one transaction, verified as 'migrate' does; a scope archive is "
            "added to a target that holds none of the scope's rows, verified likewise. An "
            "archive that fails any check is refused before the target is opened. --check "
            "verifies only, and with --public-key alone needs no store key."
        ),
        handler="_move:_import",
    )
    imported.add_argument("archive", type=file_path, metavar="FILE", help="the archive to import")
    _target_options(imported, required=False)
    imported.add_argument(
        "--public-key",
        type=file_path,
        metavar="PEM",
        help="refuse the archive unless its manifest is signed by this Ed25519 public key",
    )
    imported.add_argument(
        "--check", action="store_true", help="verify the archive and write nothing"
    )


def reset(verbs: Verbs) -> None:
    """Add ``reset-progress`` to the parser."""
    reset = add_verb(
        verbs,
        "reset-progress",
        help=verb_help("reset-progress"),
        description=(
            "Record a workflow_state.reset event with a plaintext-free fingerprint of the "
            "scope's state, then delete only that state row. Works on a cold root, where "
            "it reports the state as absent and creates nothing."
        ),
        handler="_reset:_reset_progress",
    )
    reset.add_argument("--scope", required=True, help="the scope (bucket or profile) to reset")
    reset.add_argument("--actor", default="cli", help="who resets, for the audit event")
    reset.add_argument("--reason", help="a reason class such as 'corrupt' (default: derived)")
    reset.add_argument("--dry-run", action="store_true", help="print the fingerprint only")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def demo(verbs: Verbs) -> None:
    """Add this group's verbs to the parser."""
    demo = add_verb(
        verbs,
        "demo",
        help=verb_help("demo"),
        description=(
            "Create a fresh SQLite store (a new temporary directory unless --home names "
            "a directory that does not exist or is empty) and run a realistic approval "
            "workflow through it: work order, lifecycle, action result, checkpoint, "
            "approval, resume, terminal receipt, ledger verification, tamper detection "
            "on a copy of the database, fingerprint and reset-progress. Exits 0 only if "
            "every step behaved as expected; otherwise names the step that did not."
        ),
        handler="_demo:_demo",
    )
    demo.add_argument(
        "--home",
        dest="demo_home",
        metavar="DIR",
        help="where to create the demo store (must not exist, or be empty)",
    )
