"""Opt-in OpenTelemetry: wired when the ``otel`` extra is installed, a no-op when it is not."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flowvault.application._observability import use_telemetry

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider


def configure_telemetry(
    tracer_provider: TracerProvider | None = None, meter_provider: MeterProvider | None = None
) -> bool:
    """Send flowvault's spans and metrics to OpenTelemetry; return whether it is installed.

    With no providers, OpenTelemetry's global ones are used (whatever the
    host set up). Without the ``otel`` extra nothing changes and ``False``
    is returned, so a host can call this unconditionally.
    """
    try:
        from flowvault.adapters.otel import OpenTelemetry  # noqa: PLC0415 - the optional extra
    except ImportError:
        return False
    use_telemetry(OpenTelemetry(tracer_provider, meter_provider))
    return True


def disable_telemetry() -> None:
    """Stop sending spans and metrics (what a host's shutdown or a test calls)."""
    use_telemetry(None)
