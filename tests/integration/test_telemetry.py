"""OpenTelemetry spans and metrics through the SDK's in-memory exporters; a no-op without it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from flowvault.application import UnitOfWork
from flowvault.application import _observability as observe
from flowvault.application._backoff import RetryPolicy
from flowvault.application.testing import make_upsert
from flowvault.composition import Settings, bootstrap, configure_telemetry, disable_telemetry
from flowvault.domain import RevisionConflict, WorkflowState

KEY = bytes(range(32))
SECRET_STEP = "payload-sentinel-5b1e"
NATURAL_KEY = "natural-key-sentinel-93c2"


class Exported:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer = TracerProvider()
        tracer.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.tracer_provider = tracer
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def metrics(self) -> dict[str, list[tuple[dict[str, object], float]]]:
        found: dict[str, list[tuple[dict[str, object], float]]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        found.setdefault(metric.name, []).append(
                            (dict(point.attributes or {}), value)
                        )
        return found


@pytest.fixture
def exported() -> Iterator[Exported]:
    """Route flowvault's telemetry to in-memory exporters for one test."""
    sink = Exported()
    assert configure_telemetry(sink.tracer_provider, sink.meter_provider) is True
    try:
        yield sink
    finally:
        disable_telemetry()


def test_commits_are_spans_and_the_write_path_is_counted(
    tmp_path: Path, exported: Exported
) -> None:
    """Each unit committed is a ``flowvault.commit`` span; latency, syncs and seals are metrics."""
    settings = Settings(backend="sqlite", home=tmp_path / "home")
    with bootstrap(settings, key=KEY, create=True) as vault:
        vault.state(NATURAL_KEY).save(WorkflowState(step=1, data={"note": SECRET_STEP}))
        assert vault.state(NATURAL_KEY).load().state.data == {"note": SECRET_STEP}
        assert vault.audit().run().ok
        key_id = vault.repository.cipher.primary_key_id
    spans = exported.spans.get_finished_spans()
    commits = [span for span in spans if span.name == "flowvault.commit"]
    assert commits
    attributes = dict(commits[0].attributes or {})
    assert attributes["flowvault.store"] == "sqlite"
    assert int(str(attributes["flowvault.records_written"])) >= 1
    assert commits[0].end_time is not None
    assert commits[0].start_time is not None
    assert commits[0].end_time >= commits[0].start_time
    metrics = exported.metrics()
    latency = metrics["flowvault.commit.duration"]
    assert sum(count for _, count in latency) == len(commits)
    assert sum(value for _, value in metrics["flowvault.store.syncs"]) >= 1
    uses = {
        (attrs["flowvault.operation"], attrs["flowvault.key_id"]): value
        for attrs, value in metrics["flowvault.key.uses"]
    }
    assert uses[("seal", key_id)] >= 1
    assert uses[("open", key_id)] >= 1
    shown = repr([dict(span.attributes or {}) for span in spans]) + repr(metrics)
    for secret in (SECRET_STEP, NATURAL_KEY, KEY.hex()):
        assert secret not in shown


def test_conflicts_retries_and_failed_verifications_are_counted(exported: Exported) -> None:
    """A refused unit is an error span and a conflict; a lost race a retry; a failure by codes."""
    with bootstrap(Settings(backend="memory"), key=KEY) as vault:
        vault.store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
        with pytest.raises(RevisionConflict):
            vault.store.commit(UnitOfWork(upserts=[make_upsert("ns", "k")]))
    RetryPolicy(sleep=lambda _: None).start().after_lost_race("the thing")
    observe.ledger_verified(False, 3, 10, ("edited", "stale"))
    failed = [
        span
        for span in exported.spans.get_finished_spans()
        if span.name == "flowvault.commit" and not span.status.is_ok
    ]
    assert len(failed) == 1
    metrics = exported.metrics()
    assert metrics["flowvault.commit.conflicts"] == [
        ({"flowvault.store": "memory", "flowvault.unit_kind": "ns"}, 1)
    ]
    assert metrics["flowvault.commit.retries"] == [({"flowvault.what": "the thing"}, 1)]
    assert metrics["flowvault.verification.failures"] == [
        ({"flowvault.findings": "edited,stale"}, 1)
    ]


SHIM = "raise ModuleNotFoundError(\"No module named 'opentelemetry'\", name='opentelemetry')\n"

WITHOUT_OTEL = textwrap.dedent(
    """
    from flowvault.composition import Settings, bootstrap, configure_telemetry
    from flowvault.domain import WorkflowState

    print(configure_telemetry())
    with bootstrap(Settings(backend="memory"), key=bytes(range(32))) as vault:
        vault.state("main").save(WorkflowState(step=1))
        print(vault.state("main").load().state.step)
    """
)


def test_without_opentelemetry_it_is_a_no_op(tmp_path: Path) -> None:
    """With ``opentelemetry`` unimportable, ``configure_telemetry`` says so; writes still work."""
    shim = tmp_path / "shim" / "opentelemetry"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(SHIM)
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(shim.parent)},
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "1"]
