"""Binding a host's runtime for its lifetime and resolving it with ``bound()``."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from flowvault.composition import Runtime, Settings, bind, bootstrap, bound
from flowvault.domain import FlowvaultError, NotBound


def _runtime() -> Runtime:
    return bootstrap(Settings(backend="memory"), create=True)


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    """Yield a memory-backed runtime, closed after the test."""
    with _runtime() as opened:
        yield opened


@pytest.fixture
def second() -> Iterator[Runtime]:
    """Yield a second, distinct memory-backed runtime."""
    with _runtime() as opened:
        yield opened


def test_nothing_bound_raises_not_bound() -> None:
    """Without a binding, bound() raises NotBound with its code and how to bind."""
    with pytest.raises(NotBound) as caught:
        bound()
    assert isinstance(caught.value, FlowvaultError)
    assert caught.value.code == "NOT_BOUND"
    assert "bind(bootstrap(" in caught.value.message


def test_bind_makes_the_runtime_resolvable(runtime: Runtime) -> None:
    """Inside the block bound() returns the bound runtime, which bind also yields."""
    with bind(runtime) as yielded:
        assert yielded is runtime
        assert bound() is runtime
        assert bound() is runtime


def test_bound_runtime_is_usable(runtime: Runtime) -> None:
    """The resolved runtime is the live one: state saved through it is read back."""
    runtime.state("main").save(runtime.state("main").load().state)
    with bind(runtime):
        assert bound().state("main").load().revision == 1


def test_unbinds_after_the_block(runtime: Runtime) -> None:
    """After the block ends bound() raises NotBound again."""
    with bind(runtime):
        pass
    with pytest.raises(NotBound):
        bound()


def test_nesting_returns_the_innermost_and_restores_the_outer(
    runtime: Runtime, second: Runtime
) -> None:
    """A nested binding wins inside its block; the outer one is back after it."""
    with bind(runtime):
        with bind(second):
            assert bound() is second
        assert bound() is runtime
    with pytest.raises(NotBound):
        bound()


def test_a_thread_started_inside_the_block_resolves_the_same_runtime(runtime: Runtime) -> None:
    """Binding is process-wide: a thread started in the block sees the same runtime."""
    seen: list[object] = []

    def resolve() -> None:
        try:
            seen.append(bound())
        except NotBound as error:
            seen.append(error)

    with bind(runtime):
        worker = threading.Thread(target=resolve)
        worker.start()
        worker.join(timeout=10)
        assert not worker.is_alive()
    assert seen == [runtime]
    assert seen[0] is runtime


def test_a_thread_after_the_block_sees_nothing_bound(runtime: Runtime) -> None:
    """Once the block ends, other threads also get NotBound."""
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            bound()
        except NotBound as error:
            errors.append(error)

    with bind(runtime):
        pass
    worker = threading.Thread(target=resolve)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive()
    assert len(errors) == 1


def test_an_exception_inside_the_block_still_unbinds(runtime: Runtime) -> None:
    """An exception escaping the block propagates and leaves nothing bound."""
    seen: list[Runtime] = []

    def fail_while_bound() -> None:
        with bind(runtime):
            seen.append(bound())
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_while_bound()
    assert seen == [runtime]
    with pytest.raises(NotBound):
        bound()


def test_an_exception_in_a_nested_block_restores_the_outer(
    runtime: Runtime, second: Runtime
) -> None:
    """An exception leaving an inner block unbinds only the inner runtime."""
    with bind(runtime):
        with pytest.raises(ValueError, match="inner"), bind(second):
            raise ValueError("inner")
        assert bound() is runtime


def test_rebinding_an_outer_runtime_restores_the_middle_one(
    runtime: Runtime, second: Runtime
) -> None:
    """Binding A, then B, then A again and leaving the last block leaves B bound."""
    with bind(runtime), bind(second):
        with bind(runtime):
            assert bound() is runtime
        assert bound() is second
