"""The dependency-injector container: settings in, adapters and services out."""

from __future__ import annotations

from dependency_injector import containers, providers

from flowvault.adapters.memory import InMemorySecureObjectStore
from flowvault.adapters.system import RandomIdFactory, SystemClock
from flowvault.composition._settings import Settings


def _backend(settings: Settings) -> str:
    return settings.backend


class Container(containers.DeclarativeContainer):
    """Selects adapters from ``Settings``; any provider can be overridden by a host.

    ``store`` is a ``Selector`` keyed by ``settings.backend``; a host that
    brings its own adapter overrides it with ``container.store.override(...)``.
    """

    settings = providers.Singleton(Settings.from_env)
    clock = providers.Singleton(SystemClock)
    ids = providers.Singleton(RandomIdFactory)
    store = providers.Selector(
        providers.Callable(_backend, settings),
        memory=providers.Singleton(InMemorySecureObjectStore),
    )


def build_container(settings: Settings | None = None) -> Container:
    """Return a container for ``settings`` (read from the environment when ``None``)."""
    container = Container()
    if settings is not None:
        container.settings.override(providers.Object(settings))
    container.check_dependencies()
    return container
