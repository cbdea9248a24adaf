"""The composition root: settings, the container, logging set-up, bootstrap."""

from flowvault.composition._binding import bind, bound
from flowvault.composition._bootstrap import Runtime, bootstrap, is_cold_root, open_existing
from flowvault.composition._cli import main
from flowvault.composition._container import Container, build_container
from flowvault.composition._logging import configure_logging, redact_secret_keys
from flowvault.composition._settings import ENV_PREFIX, Settings

__all__ = [
    "ENV_PREFIX",
    "Container",
    "Runtime",
    "Settings",
    "bind",
    "bootstrap",
    "bound",
    "build_container",
    "configure_logging",
    "is_cold_root",
    "main",
    "open_existing",
    "redact_secret_keys",
]
