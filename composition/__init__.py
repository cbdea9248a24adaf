"""The composition root: settings, the container, logging set-up, bootstrap.

Names are imported on first use, so the ``flowvault`` command's
``--help`` and ``--version`` do not pay for the whole library.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from flowvault.composition._async import AsyncRuntime, async_bootstrap
    from flowvault.composition._binding import bind, bound
    from flowvault.composition._bootstrap import Runtime, bootstrap
    from flowvault.composition._container import Container, build_container
    from flowvault.composition._logging import configure_logging
    from flowvault.composition._settings import Settings
    from flowvault.composition._telemetry import configure_telemetry, disable_telemetry

_HOMES = {
    "AsyncRuntime": "_async",
    "Container": "_container",
    "Runtime": "_bootstrap",
    "Settings": "_settings",
    "async_bootstrap": "_async",
    "bind": "_binding",
    "bootstrap": "_bootstrap",
    "bound": "_binding",
    "build_container": "_container",
    "configure_logging": "_logging",
    "configure_telemetry": "_telemetry",
    "disable_telemetry": "_telemetry",
}

__all__ = [
    "AsyncRuntime",
    "Container",
    "Runtime",
    "Settings",
    "async_bootstrap",
    "bind",
    "bootstrap",
    "bound",
    "build_container",
    "configure_logging",
    "configure_telemetry",
    "disable_telemetry",
]


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
