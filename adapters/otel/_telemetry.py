"""The ``Telemetry`` port on OpenTelemetry: a span per unit of work, and counters.

Every attribute is a store kind, a unit kind (the namespaces a unit
touches), an operation, a key id or a finding code; never a payload, a
key or a natural key.
"""

from __future__ import annotations

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Status, StatusCode, TracerProvider

from flowvault.application._observability import Telemetry

SCOPE = "flowvault"
"""The instrumentation scope every span and instrument is created under."""


class OpenTelemetry(Telemetry):
    """Spans and metrics through the given providers, or OpenTelemetry's global ones."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE)
        self._latency = meter.create_histogram(
            "flowvault.commit.duration", unit="s", description="Time to commit one unit of work"
        )
        self._syncs = meter.create_counter(
            "flowvault.store.syncs", unit="{transaction}", description="Durable transactions"
        )
        self._conflicts = meter.create_counter(
            "flowvault.commit.conflicts", unit="{unit}", description="Units refused at a guard"
        )
        self._retries = meter.create_counter(
            "flowvault.commit.retries", unit="{retry}", description="Units rebuilt after a race"
        )
        self._key_uses = meter.create_counter(
            "flowvault.key.uses", unit="{operation}", description="Seals and opens, by key id"
        )
        self._verify_failures = meter.create_counter(
            "flowvault.verification.failures",
            unit="{verification}",
            description="Ledger verifications that found tampering",
        )

    def unit_committed(
        self, store: str, unit_kind: str, records: int, started_ns: int, ended_ns: int
    ) -> None:
        """Record a span for the commit and its latency."""
        attributes: dict[str, str | int] = {
            "flowvault.store": store,
            "flowvault.unit_kind": unit_kind,
            "flowvault.records_written": records,
        }
        span = self._tracer.start_span("flowvault.commit", start_time=started_ns)
        span.set_attributes(attributes)
        span.end(end_time=ended_ns)
        self._latency.record(
            (ended_ns - started_ns) / 1e9,
            {"flowvault.store": store, "flowvault.unit_kind": unit_kind},
        )

    def revision_conflict(self, store: str, unit_kind: str) -> None:
        """Record a failed commit span and count the conflict."""
        attributes = {"flowvault.store": store, "flowvault.unit_kind": unit_kind}
        span = self._tracer.start_span("flowvault.commit", attributes=attributes)
        span.set_status(Status(StatusCode.ERROR, "REVISION_CONFLICT"))
        span.end()
        self._conflicts.add(1, attributes)

    def store_synced(self, store: str, units: int) -> None:
        """Count one durable transaction."""
        self._syncs.add(1, {"flowvault.store": store})

    def unit_retried(self, what: str) -> None:
        """Count one retry."""
        self._retries.add(1, {"flowvault.what": what})

    def key_used(self, operation: str, key_id: str) -> None:
        """Count one seal or open under ``key_id``."""
        self._key_uses.add(1, {"flowvault.operation": operation, "flowvault.key_id": key_id})

    def ledger_verified(self, ok: bool, findings: tuple[str, ...]) -> None:
        """Count a failed verification by its finding codes."""
        if not ok:
            self._verify_failures.add(1, {"flowvault.findings": ",".join(findings)})
