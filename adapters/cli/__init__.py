"""The ``flowvault`` command functions: a driving adapter that formats and asks, nothing more."""

from flowvault.adapters.cli._io import CommandIO
from flowvault.adapters.cli._reset import ResetRequest, reset_progress_command

__all__ = ["CommandIO", "ResetRequest", "reset_progress_command"]
