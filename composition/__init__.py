"""The composition root: settings, the container, logging set-up, bootstrap."""

from flowvault.composition._binding import bind, bound
from flowvault.composition._bootstrap import Runtime, bootstrap
from flowvault.composition._container import Container, build_container
from flowvault.composition._logging import configure_logging
from flowvault.composition._settings import Settings

__all__ = [
    "Container",
    "Runtime",
    "Settings",
    "bind",
    "bootstrap",
    "bound",
    "build_container",
    "configure_logging",
]
