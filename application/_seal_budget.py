"""The AES-GCM nonce budget: count seals per key and refuse before the safe limit.

NIST SP 800-38D bounds a key used with random 96-bit nonces to 2^32
invocations; beyond that the chance of a repeated nonce, which exposes
plaintext and the authentication key, stops being negligible. The count
must cover every process and host sealing under the key, and survive
restarts, so it is kept in the store (``SealCounter``) and taken in blocks:
each process reserves a block before using it, so the stored total is never
below the seals actually made. A reserved block a process does not finish
is simply lost, which errs on the safe side; blocks start small and grow
while a process keeps sealing, so short-lived processes waste little.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from flowvault.application._observability import EventLog
from flowvault.application.ports import SealCounter
from flowvault.domain import InvalidInput, KeyExhausted

NIST_SEAL_LIMIT = 2**32
"""Seals per key allowed with random 96-bit nonces (NIST SP 800-38D, section 8.3)."""

DEFAULT_SEAL_WARNING = 2**31
"""Reserved total from which each new reservation logs a warning to rotate."""

FIRST_SEAL_BLOCK = 64
"""Seals a process reserves first; each further block doubles, up to ``MAX_SEAL_BLOCK``."""
MAX_SEAL_BLOCK = 65_536

_log = EventLog("flowvault.keys")


@dataclass(slots=True)
class _Block:
    next: int
    end: int
    size: int


class SealBudget:
    """Charge one seal at a time against a per-key budget kept by ``counter``.

    Without a counter (an adapter lacking ``SealCounter``) the count is this
    process's alone and restarts from zero: the limit still bounds one
    process, but not the key's lifetime.
    """

    def __init__(
        self,
        counter: SealCounter | None,
        *,
        limit: int = NIST_SEAL_LIMIT,
        warn_at: int = DEFAULT_SEAL_WARNING,
    ) -> None:
        if type(limit) is not int or not 1 <= limit <= NIST_SEAL_LIMIT:
            raise InvalidInput(f"the seal limit must be between 1 and {NIST_SEAL_LIMIT}")
        if type(warn_at) is not int or not 1 <= warn_at <= limit:
            raise InvalidInput("the seal warning threshold must be between 1 and the limit")
        self._counter = counter
        self._limit = limit
        self._warn_at = warn_at
        self._blocks: dict[str, _Block] = {}
        self._local: dict[str, int] = {}
        self._exhausted: set[str] = set()
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """Seals allowed per key."""
        return self._limit

    @property
    def persistent(self) -> bool:
        """Whether the count is kept by the store, across processes and restarts."""
        return self._counter is not None

    def charge(self, key_id: str) -> None:
        """Count one seal under ``key_id``, reserving a new block when this one is used up.

        Raises:
            KeyExhausted: the key has reached the limit; nothing was counted.

        """
        with self._lock:
            if key_id in self._exhausted:
                raise self._refusal(key_id)
            block = self._blocks.get(key_id)
            if block is None or block.next >= block.end:
                block = self._reserve(key_id, block)
            block.next += 1

    def counts(self) -> Mapping[str, int]:
        """Return the seals counted (reserved) per key id, from the store when it keeps them."""
        if self._counter is not None:
            return dict(self._counter.seal_counts())
        with self._lock:
            return dict(self._local)

    def _reserve(self, key_id: str, spent: _Block | None) -> _Block:
        size = FIRST_SEAL_BLOCK if spent is None else min(spent.size * 2, MAX_SEAL_BLOCK)
        if self._counter is not None:
            total = self._counter.reserve_seals(key_id, size)
        else:
            total = self._local.get(key_id, 0) + size
            self._local[key_id] = total
        start, end = total - size, min(total, self._limit)
        if start >= end:
            self._blocks.pop(key_id, None)
            self._exhausted.add(key_id)
            raise self._refusal(key_id)
        if end >= self._warn_at:
            _log.warning(
                "seal_budget_low",
                key_id=key_id,
                reserved=total,
                limit=self._limit,
                fix="run 'flowvault keys add', then 'flowvault rotate-key'",
            )
        block = _Block(next=start, end=end, size=size)
        self._blocks[key_id] = block
        return block

    def _refusal(self, key_id: str) -> KeyExhausted:
        return KeyExhausted(
            f"key {key_id} has reached its limit of {self._limit} seals with random nonces: "
            "add a new primary key and rotate onto it",
            key_id=key_id,
            limit=self._limit,
        )

    def __repr__(self) -> str:
        return f"SealBudget(limit={self._limit}, persistent={self.persistent})"
