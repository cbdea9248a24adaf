"""The composition root: settings, the container, logging set-up, bootstrap."""

from flowvault.composition._bootstrap import Runtime, bootstrap
from flowvault.composition._container import Container, build_container
from flowvault.composition._logging import configure_logging, redact_secret_keys
from flowvault.composition._settings import ENV_PREFIX, Settings

__all__ = [
    "ENV_PREFIX",
    "Container",
    "Runtime",
    "Settings",
    "bootstrap",
    "build_container",
    "configure_logging",
    "redact_secret_keys",
]
