"""OpenTelemetry traces and metrics for flowvault (the ``otel`` extra)."""

from flowvault.adapters.otel._telemetry import OpenTelemetry

__all__ = ["OpenTelemetry"]
