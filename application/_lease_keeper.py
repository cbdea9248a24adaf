"""Renewing a host's run leases from one background thread while its steps write nothing.

A run's lease is renewed by its owner's writes; a step that calls a model
or waits on another system for longer than the lease writes nothing, and
another host's recovery would take the run over. The keeper calls
``RunService.renew_leases`` every ``interval`` seconds until stopped. It
only renews: a run taken over meanwhile stays taken over, and the step
that owns it learns so (``RUN_FENCED``) at its next write.
"""

from __future__ import annotations

import threading

from flowvault.application._observability import EventLog
from flowvault.application._run_service import RunService
from flowvault.domain import FlowvaultError, InvalidInput

_log = EventLog("flowvault.run_leases")


class LeaseKeeper:
    """One daemon thread renewing every lease its run service took and holds, until ``stop``.

    A failed pass (the store busy or unreachable, or any other error) is
    logged as ``run_lease_renewal_failed`` with its code or error type, and
    the next pass tries again; renew well within the lease so one failed
    pass costs nothing.
    """

    def __init__(self, runs: RunService, interval: float) -> None:
        if runs.host_id is None:
            raise InvalidInput("a run service without a host id holds no leases to keep")
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise InvalidInput("a lease keeper's interval is a positive number of seconds")
        self._runs = runs
        self._interval = float(interval)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flowvault-leases", daemon=True)
        self._passes = 0

    @property
    def passes(self) -> int:
        """Renewal passes completed so far, failed ones included."""
        return self._passes

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread.is_alive()

    def start(self) -> LeaseKeeper:
        """Start the thread; its first pass runs at once. Returns the keeper."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread after the pass in progress, if any, and wait for it."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._runs.renew_leases()
            except FlowvaultError as failed:
                _log.warning("run_lease_renewal_failed", code=failed.code)
            except Exception as failed:
                _log.warning("run_lease_renewal_failed", error=type(failed).__name__)
            self._passes += 1
            self._stopping.wait(self._interval)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


__all__ = ["LeaseKeeper"]
