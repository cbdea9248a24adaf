"""The nonce budget: seals are counted per key in the store and refused before the limit."""

from __future__ import annotations

import threading

import pytest
from log_capture import capture_logs

from flowvault.adapters.crypto import AesGcmCipher
from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.application import Guard, SealedRepository
from flowvault.application._seal_budget import (
    FIRST_SEAL_BLOCK,
    MAX_SEAL_BLOCK,
    NIST_SEAL_LIMIT,
    SealBudget,
)
from flowvault.application.testing import FrozenClock
from flowvault.domain import InvalidInput, KeyExhausted

KEY = bytes(range(32))


def _repository(store: InMemorySecureObjectStore, **limits: int) -> SealedRepository:
    return SealedRepository(
        store, AesGcmCipher(KEY), FrozenClock(), budget=SealBudget(store, **limits)
    )


def _write_until_refused(repository: SealedRepository, prefix: str, cap: int) -> int:
    """Write fresh records until the budget refuses; return how many were acknowledged."""
    for written in range(cap):
        try:
            repository.write("things", f"{prefix}-{written}", {"n": written}, expected=Guard.ABSENT)
        except KeyExhausted:
            return written
    raise AssertionError(f"no refusal within {cap} writes")


def test_default_limit_is_the_nist_bound_for_random_nonces() -> None:
    """2^32 invocations per key (SP 800-38D 8.3), and it cannot be configured higher."""
    assert NIST_SEAL_LIMIT == 2**32
    assert SealBudget(None).limit == NIST_SEAL_LIMIT
    with pytest.raises(InvalidInput):
        SealBudget(None, limit=NIST_SEAL_LIMIT + 1)
    with pytest.raises(InvalidInput):
        SealBudget(None, limit=100, warn_at=101)


def test_sealing_stops_at_the_limit_and_the_refused_write_leaves_nothing() -> None:
    """Exactly ``limit`` seals succeed; the next write is KEY_EXHAUSTED and writes no record."""
    store = InMemorySecureObjectStore()
    repository = _repository(store, limit=100, warn_at=100)
    assert _write_until_refused(repository, "a", 1000) == 100
    assert dict(store.namespace_counts()) == {"things": 100}
    assert repository.read("things", "a-100") is None
    with pytest.raises(KeyExhausted) as caught:
        repository.write("things", "late", {}, expected=Guard.ABSENT)
    assert caught.value.code == "KEY_EXHAUSTED"


def test_the_count_survives_a_restart() -> None:
    """A new process (a new budget over the same store) continues from the stored count.

    Its first block starts after everything reserved before, including the
    unused rest of the first process's block: that part is lost, never reused.
    """
    store = InMemorySecureObjectStore()
    first = _repository(store, limit=200, warn_at=200)
    for n in range(10):
        first.write("things", f"a-{n}", {}, expected=Guard.ABSENT)
    assert store.seal_counts()[first.cipher.primary_key_id] == FIRST_SEAL_BLOCK
    second = _repository(store, limit=200, warn_at=200)
    assert _write_until_refused(second, "b", 1000) == 200 - FIRST_SEAL_BLOCK


def test_many_processes_never_exceed_the_limit_together() -> None:
    """Budgets of several processes over one store share one limit, whatever the interleaving."""
    store = InMemorySecureObjectStore()
    repositories = [_repository(store, limit=500, warn_at=500) for _ in range(4)]
    barrier = threading.Barrier(len(repositories))
    acknowledged: list[int] = []

    def writer(index: int) -> None:
        barrier.wait()
        acknowledged.append(_write_until_refused(repositories[index], f"p{index}", 10_000))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(repositories))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 0 < sum(acknowledged) <= 500
    assert sum(store.namespace_counts().values()) == sum(acknowledged)


def test_blocks_grow_while_a_process_keeps_sealing() -> None:
    """Short-lived processes waste at most one small block; busy ones reserve rarely."""
    store = InMemorySecureObjectStore()
    budget = SealBudget(store)
    reservations = 0
    last = 0
    for _ in range(FIRST_SEAL_BLOCK * 2**11):
        budget.charge("k1")
        total = store.seal_counts()["k1"]
        if total != last:
            reservations += 1
            last = total
    assert reservations <= 12
    assert last - FIRST_SEAL_BLOCK * 2**11 <= MAX_SEAL_BLOCK


def test_a_warning_names_the_fix_before_the_limit() -> None:
    """Past the threshold each reservation logs ``seal_budget_low`` with the key id and fix."""
    store = InMemorySecureObjectStore()
    repository = _repository(store, limit=1000, warn_at=100)
    with capture_logs() as logs:
        for n in range(99 - FIRST_SEAL_BLOCK):
            repository.write("things", f"quiet-{n}", {}, expected=Guard.ABSENT)
        quiet = [entry for entry in logs if entry["event"] == "seal_budget_low"]
        for n in range(FIRST_SEAL_BLOCK * 3):
            repository.write("things", f"loud-{n}", {}, expected=Guard.ABSENT)
    assert quiet == []
    warnings = [entry for entry in logs if entry["event"] == "seal_budget_low"]
    assert warnings
    assert warnings[0]["key_id"] == repository.cipher.primary_key_id
    assert warnings[0]["log_level"] == "warning"
    assert "rotate-key" in warnings[0]["fix"]


def test_without_a_store_counter_the_budget_still_bounds_the_process() -> None:
    """An adapter lacking ``SealCounter`` gets a per-process count, reported as not persistent.

    The block that found the limit is reserved too (a counter is only read
    by adding to it); once refused, the key is refused without reserving more.
    """
    budget = SealBudget(None, limit=70, warn_at=70)
    assert not budget.persistent
    for _ in range(70):
        budget.charge("k1")
    with pytest.raises(KeyExhausted):
        budget.charge("k1")
    reserved = budget.counts()
    assert reserved == {"k1": FIRST_SEAL_BLOCK * (1 + 2 + 4)}
    with pytest.raises(KeyExhausted):
        budget.charge("k1")
    assert budget.counts() == reserved
