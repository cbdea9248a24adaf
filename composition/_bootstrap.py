"""One plain factory for hosts that do not want a DI container."""

from __future__ import annotations

from dataclasses import dataclass

from flowvault.application import Clock, IdFactory, SecureObjectStore
from flowvault.composition._container import build_container
from flowvault.composition._settings import Settings


@dataclass(frozen=True, slots=True)
class Runtime:
    """The wired ports a host hands to flowvault's services."""

    settings: Settings
    store: SecureObjectStore
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
    store: SecureObjectStore | None = None,
    clock: Clock | None = None,
    ids: IdFactory | None = None,
) -> Runtime:
    """Wire flowvault from settings, keeping any port the host passes in."""
    container = build_container(settings)
    return Runtime(
        settings=container.settings(),
        store=store if store is not None else container.store(),
        clock=clock if clock is not None else container.clock(),
        ids=ids if ids is not None else container.ids(),
    )
