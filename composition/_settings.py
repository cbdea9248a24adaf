"""Settings read from ``FLOWVAULT_*`` environment variables, validated once."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from flowvault.adapters._paths import check_os_path
from flowvault.domain import InvalidInput, StoreUnavailable
from flowvault.domain._graph_runs import HOST_ID_PATTERN
from flowvault.domain._values import ValueModel

ENV_PREFIX = "FLOWVAULT_"
DATABASE_FILE = "flowvault.db"
KEY_FILE = "store.key"
HIGH_WATER_FILE = "store.high-water"

Backend = Literal["sqlite", "memory", "postgres"]
"""Backends this build can select; ``postgres`` needs the ``postgres`` extra."""

_CASE_INSENSITIVE = frozenset({"backend", "synchronous", "mark_sync", "log_level", "log_format"})


def postgres_mark_name(dsn: str, schema: str) -> str:
    """Name a host's mark of one PostgreSQL store from the DSN's server and database and the schema.

    A digest of what names the store, not of the DSN's text: the password
    is not in it, and changing a connection option (``sslmode``, a
    timeout) keeps the same mark. A restored dump is named the same way,
    so the mark still compares it.
    """
    try:
        from flowvault.adapters.postgres._connect import server_target  # noqa: PLC0415
    except ImportError:
        raise StoreUnavailable(
            "the postgres backend needs the postgres extra (psycopg is not installed)",
            fix="pip install 'flowvault[postgres]'",
        ) from None
    identity = "\x00".join(("postgres", *server_target(dsn), schema))
    return f"postgres-{hashlib.sha256(identity.encode()).hexdigest()[:24]}.high-water"


def default_home(environ: Mapping[str, str] | None = None) -> Path:
    """Return the per-user data directory, ``$XDG_DATA_HOME/flowvault`` by default."""
    source = os.environ if environ is None else environ
    base = source.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "flowvault"


class Settings(ValueModel):
    """What the composition root needs to choose and configure adapters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Backend = "sqlite"
    home: Path = Field(default_factory=default_home)
    synchronous: Literal["full", "normal"] = "full"
    busy_timeout: float = Field(default=30.0, gt=0, le=3600)
    allow_insecure_permissions: bool = False
    recover_runs_on_open: bool = False
    host_id: str | None = Field(default=None, pattern=HOST_ID_PATTERN.pattern)
    """This runtime's name as a run owner; unset, each runtime draws its own (``run_host_id``)."""
    run_lease: float = Field(default=30.0, ge=1, le=3600)
    """Seconds a host holds a run it executes without writing to it or renewing its lease."""
    key: SecretStr | None = None
    key_file: Path | None = None
    signing_key_file: Path | None = None
    high_water_file: Path | None = None
    mark_sync: Literal["lagged", "strict", "off"] = "lagged"
    """When the high-water mark is written: ``lagged`` (default) in the background,
    about 0.1 s behind the last commit; ``strict`` before each commit
    returns (a second sync per write); ``off`` never: no mark is checked or kept."""
    seal_limit: int = Field(default=2**32, ge=1, le=2**32)
    seal_warn_at: int = Field(default=2**31, ge=1, le=2**32)
    progress_interval: float = Field(default=2.0, ge=0, le=3600)
    """Least seconds between two plain progress lines the CLI prints off a terminal."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    postgres_dsn: SecretStr | None = None
    postgres_pool_size: int = Field(default=4, ge=1, le=100)
    postgres_statement_timeout: float = Field(default=30.0, gt=0, le=3600)
    postgres_lock_timeout: float = Field(default=10.0, gt=0, le=3600)
    postgres_connect_timeout: float = Field(default=5.0, gt=0, le=3600)
    """Seconds one connection attempt may take (libpq counts whole seconds, at least 2),
    and the longest wait for a pooled connection."""
    postgres_schema: str = Field(default="flowvault", pattern=r"^[a-z_][a-z0-9_]{0,62}$")

    @field_validator("home", mode="before")
    @classmethod
    def _home_given(cls, home: object) -> object:
        """Refuse an empty home, which would otherwise mean the current directory."""
        if isinstance(home, str) and not home.strip():
            raise ValueError(
                "must not be empty: unset it for the default home, or name a directory"
            )
        return home

    if TYPE_CHECKING:
        # What a type checker sees without pydantic's plugin: path-like fields take ``str``
        # too (validation makes them a ``Path``), ``key`` and ``postgres_dsn`` a plain ``str``.
        def __init__(
            self,
            *,
            backend: Backend = ...,
            home: Path | str = ...,
            synchronous: Literal["full", "normal"] = ...,
            busy_timeout: float = ...,
            allow_insecure_permissions: bool = ...,
            recover_runs_on_open: bool = ...,
            host_id: str | None = ...,
            run_lease: float = ...,
            key: SecretStr | str | None = ...,
            key_file: Path | str | None = ...,
            signing_key_file: Path | str | None = ...,
            high_water_file: Path | str | None = ...,
            mark_sync: Literal["lagged", "strict", "off"] = ...,
            seal_limit: int = ...,
            seal_warn_at: int = ...,
            progress_interval: float = ...,
            log_level: Literal["debug", "info", "warning", "error"] = ...,
            log_format: Literal["auto", "json", "console"] = ...,
            postgres_dsn: SecretStr | str | None = ...,
            postgres_pool_size: int = ...,
            postgres_statement_timeout: float = ...,
            postgres_lock_timeout: float = ...,
            postgres_connect_timeout: float = ...,
            postgres_schema: str = ...,
        ) -> None: ...

    @field_validator("home")
    @classmethod
    def _usable_home(cls, home: Path) -> Path:
        """Refuse a home no file operation could use, or that is plainly not a directory."""
        check_os_path(home)
        if home.is_symlink() and not home.exists():
            raise ValueError("must not be a symbolic link to nothing: fix or remove the link")
        if home.exists() and not home.is_dir():
            raise ValueError(
                "must name a directory, not a file "
                "(an absent directory is created by 'flowvault init')"
            )
        return home

    @field_validator("key_file", "signing_key_file", "high_water_file")
    @classmethod
    def _usable_key_file(cls, key_file: Path | None) -> Path | None:
        """Refuse a key file path no file operation could use, or one naming a directory."""
        if key_file is None:
            return None
        if not key_file.name or key_file.name in {".", ".."}:
            raise ValueError("must name a file")
        return check_os_path(key_file)

    @model_validator(mode="after")
    def _warning_before_limit(self) -> Settings:
        """Refuse a warning that would come only after sealing is refused."""
        if self.seal_warn_at > self.seal_limit:
            raise ValueError("seal_warn_at must not exceed seal_limit")
        return self

    @field_validator("postgres_schema")
    @classmethod
    def _not_reserved(cls, schema: str) -> str:
        """Refuse the ``pg_`` prefix, which PostgreSQL reserves for its own schemas."""
        if schema.startswith("pg_"):
            raise ValueError("schema names starting with pg_ are reserved")
        return schema

    @property
    def data_dir(self) -> Path:
        """Directory of the database; back it up apart from the keys."""
        return self.home / "data"

    @property
    def database_path(self) -> Path:
        """The SQLite database file."""
        return self.data_dir / DATABASE_FILE

    @property
    def high_water_path(self) -> Path | None:
        """The anti-rollback mark: ``FLOWVAULT_HIGH_WATER_FILE``, else in ``keys_dir``.

        Outside the data directory, so restoring a copy of it does not
        restore the mark. Each host keeps its own mark of what it has seen;
        one host may use several PostgreSQL stores, so each gets its own
        file, named from the store's identity (``postgres_mark_name``).
        None for the memory backend, which keeps nothing to roll back.
        """
        if self.high_water_file is not None:
            return self.high_water_file
        if self.backend == "sqlite":
            return self.keys_dir / HIGH_WATER_FILE
        if self.backend == "postgres" and self.postgres_dsn is not None:
            return self.keys_dir / postgres_mark_name(
                self.postgres_dsn.get_secret_value(), self.postgres_schema
            )
        return None

    @property
    def database_sidecars(self) -> tuple[Path, Path]:
        """SQLite's write-ahead log and shared-memory files beside the database."""
        path = self.database_path
        return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")

    @property
    def keys_dir(self) -> Path:
        """Directory of the key file, apart from the data so copying one does not copy the other."""
        return self.home / "keys" if self.key_file is None else self.key_file.parent

    @property
    def key_path(self) -> Path:
        """The key file (one key or a ring): ``FLOWVAULT_KEY_FILE``, else in ``keys_dir``."""
        return self.home / "keys" / KEY_FILE if self.key_file is None else self.key_file

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``FLOWVAULT_<FIELD>`` variables; unknown ones are refused.

        Refusing unknown variables catches typos such as ``FLOWVAULT_BAKCEND``
        that would otherwise silently fall back to a default. Error messages
        name variables, never their values (``FLOWVAULT_KEY`` is a secret).
        """
        source = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, value in source.items():
            if not name.startswith(ENV_PREFIX):
                continue
            field = name[len(ENV_PREFIX) :].lower()
            values[field] = value.strip().lower() if field in _CASE_INSENSITIVE else value
        if "home" not in values:
            values["home"] = default_home(source)
        try:
            return cls.model_validate(values)
        except InvalidInput as exc:
            raise InvalidInput(
                "invalid flowvault settings: " + "; ".join(_problems(exc, values)),
                fix="correct or unset the variables named; the Settings table of "
                "docs/operations.md lists each one and its values",
            ) from None


def _variable(word: str) -> str:
    """Name a setting as its variable; leave any other word as it is."""
    return ENV_PREFIX + word.upper() if word in Settings.model_fields else word


def _allowed(name: str) -> str:
    """Say which numbers a numeric setting takes, from its declared bounds; else nothing."""
    bounds = []
    for rule in Settings.model_fields[name].metadata:
        for attribute, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            limit = getattr(rule, attribute, None)
            if limit is not None:
                bounds.append(f"{sign} {limit}")
    return f" (allowed: {' and '.join(bounds)})" if bounds else ""


def _problems(error: InvalidInput, values: Mapping[str, object]) -> list[str]:
    """Restate a refusal per variable: its ``FLOWVAULT_`` name, the rule it broke, what is allowed.

    The rules come from ``invalid_values``, which never quotes an input, so
    ``FLOWVAULT_KEY`` or a DSN's password cannot leak into the message.
    """
    problems = [
        f"{ENV_PREFIX}{name.upper()}: unknown setting"
        for name in sorted(set(values) - set(Settings.model_fields))
    ]
    text = error.message.split(": ", 1)[1] if ": " in error.message else error.message
    for problem in text.split("; "):
        name, _, rule = problem.partition(": ")
        if name in Settings.model_fields:
            problems.append(f"{ENV_PREFIX}{name.upper()}: {rule}{_allowed(name)}")
        elif name != "(unknown field)":
            problems.append(
                re.sub(
                    r"\b[a-z_]+\b",
                    lambda word: _variable(word.group()),
                    problem,
                )
            )
    return problems
