"""The ``flowvault`` command functions: a driving adapter that formats and asks, nothing more."""

from flowvault.adapters.cli._browse import (
    DecideRequest,
    approvals_decide_command,
    approvals_list_command,
    approvals_show_command,
    runs_list_command,
    runs_show_command,
    workflows_list_command,
    workflows_show_command,
)
from flowvault.adapters.cli._demo import (
    DemoNarrator,
    DemoStep,
    StepFailed,
    StepReport,
    expect,
    fingerprint_lines,
    short,
)
from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._keys import (
    KeyEntry,
    key_entries,
    keys_add_command,
    keys_list_command,
    keys_retire_command,
    rotate_key_command,
)
from flowvault.adapters.cli._ledger import (
    fingerprint_command,
    ledger_head_command,
    ledger_verify_command,
    purge_command,
)
from flowvault.adapters.cli._reset import ResetRequest, reset_progress_command
from flowvault.adapters.cli._store import (
    Check,
    InitReport,
    Severity,
    StoreStatus,
    doctor_command,
    init_command,
    status_command,
)

__all__ = [
    "Check",
    "CommandIO",
    "DecideRequest",
    "DemoNarrator",
    "DemoStep",
    "InitReport",
    "KeyEntry",
    "ResetRequest",
    "Severity",
    "StepFailed",
    "StepReport",
    "StoreStatus",
    "approvals_decide_command",
    "approvals_list_command",
    "approvals_show_command",
    "doctor_command",
    "expect",
    "fingerprint_command",
    "fingerprint_lines",
    "init_command",
    "key_entries",
    "keys_add_command",
    "keys_list_command",
    "keys_retire_command",
    "ledger_head_command",
    "ledger_verify_command",
    "purge_command",
    "reset_progress_command",
    "rotate_key_command",
    "runs_list_command",
    "runs_show_command",
    "short",
    "status_command",
    "workflows_list_command",
    "workflows_show_command",
]
