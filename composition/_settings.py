"""Settings read from ``FLOWVAULT_*`` environment variables, validated once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from flowvault.domain import InvalidInput

ENV_PREFIX = "FLOWVAULT_"

Backend = Literal["memory"]
"""Backends this build can select; durable ones join as their adapters land."""


class Settings(BaseModel):
    """What the composition root needs to choose and configure adapters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend = "memory"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``FLOWVAULT_<FIELD>`` variables; unknown ones are refused.

        Refusing unknown variables catches typos such as ``FLOWVAULT_BAKCEND``
        that would otherwise silently fall back to a default.
        """
        source = os.environ if environ is None else environ
        values = {
            name[len(ENV_PREFIX) :].lower(): value.strip().lower()
            for name, value in source.items()
            if name.startswith(ENV_PREFIX)
        }
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            fields = sorted({str(error["loc"][0]) for error in exc.errors() if error["loc"]})
            raise InvalidInput(
                "invalid flowvault settings: " + ", ".join(ENV_PREFIX + f.upper() for f in fields)
            ) from None
