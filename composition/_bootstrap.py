"""One plain factory for hosts that do not want a DI container."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application import (
    Cipher,
    Clock,
    IdFactory,
    SealedRepository,
    SecureObjectStore,
    WorkflowService,
)
from flowvault.composition._container import build_container
from flowvault.composition._settings import Settings


@dataclass(frozen=True, slots=True)
class Runtime:
    """The wired ports and the sealed repository a host hands to flowvault's services."""

    settings: Settings
    store: SecureObjectStore
    cipher: Cipher
    repository: SealedRepository
    workflows: WorkflowService
    clock: Clock
    ids: IdFactory

    def close(self) -> None:
        """Release the store's connections and files."""
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def bootstrap(
    settings: Settings | None = None,
    *,
    key: bytes | None = None,
    store: SecureObjectStore | None = None,
    clock: Clock | None = None,
    ids: IdFactory | None = None,
) -> Runtime:
    """Wire flowvault from settings, keeping any port the host passes in.

    ``key`` is a 32-byte master key the host manages itself; without it the
    key comes from ``FLOWVAULT_KEY`` or the key file, and is created only
    for a store that holds no data yet.
    """
    container = build_container(settings, key=key)
    if store is not None:
        container.store.override(store)
    if clock is not None:
        container.clock.override(clock)
    if ids is not None:
        container.ids.override(ids)
    opened = container.store()
    try:
        return Runtime(
            settings=container.settings(),
            store=opened,
            cipher=container.cipher(),
            repository=container.repository(),
            workflows=container.workflows(),
            clock=container.clock(),
            ids=container.ids(),
        )
    except BaseException:
        if store is None:
            opened.close()
        raise
