"""One plain factory for hosts that do not want a DI container."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application import (
    Cipher,
    Clock,
    IdFactory,
    RunRepository,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    WorkflowService,
)
from flowvault.composition._container import build_container
from flowvault.composition._settings import Settings
from flowvault.domain import WorkflowState


@dataclass(frozen=True, slots=True)
class Runtime:
    """The wired ports and the sealed repository a host hands to flowvault's services."""

    settings: Settings
    store: SecureObjectStore
    cipher: Cipher
    repository: SealedRepository
    workflows: WorkflowService
    runs: RunRepository
    clock: Clock
    ids: IdFactory

    def state(self, scope: str) -> StateRepository[WorkflowState]:
        """Return the workflow state repository of ``scope``."""
        return StateRepository(self.repository, scope)

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
            runs=RunRepository(container.repository()),
            clock=container.clock(),
            ids=container.ids(),
        )
    except BaseException:
        if store is None:
            opened.close()
        raise


def is_cold_root(settings: Settings) -> bool:
    """Whether nothing exists yet for ``settings``: opening would have to create a store.

    Recovery verbs use this to report on a cold root without creating one.
    """
    if settings.backend == "sqlite":
        return not settings.database_path.exists()
    return settings.backend == "memory"


def open_existing(settings: Settings, *, key: bytes | None = None) -> Runtime | None:
    """Open the store of ``settings`` if one exists; ``None`` on a cold root."""
    return None if is_cold_root(settings) else bootstrap(settings, key=key)
