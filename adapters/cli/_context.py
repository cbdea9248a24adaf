"""What the verbs need from the composition root, declared here so the CLI never imports it.

The console entry point builds one ``CliContext`` from the settings and
hands it to the verb it runs: the settings' facts, and a few callables
that open what the container wires. A verb reaches a store only through
these, so it never names a backend's store class.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal, Protocol

from pydantic import SecretStr

from flowvault.application import (
    ActionResultService,
    ApprovalService,
    CheckpointService,
    Cipher,
    Clock,
    DefinitionRegistry,
    ReceiptSigner,
    RetentionJob,
    RetentionPolicy,
    RunService,
    SealedRepository,
    SecureObjectStore,
    StateRepository,
    StoreCapabilities,
    TerminalReceipts,
    WorkflowEventService,
    WorkflowService,
)
from flowvault.application._anti_rollback import AntiRollback
from flowvault.application._keys import KeyRingStore
from flowvault.domain import WorkflowState


class CliSettings(Protocol):
    """The settings the verbs read; the composition root's ``Settings`` fits by shape."""

    @property
    def backend(self) -> str: ...
    @property
    def home(self) -> Path: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def keys_dir(self) -> Path: ...
    @property
    def database_path(self) -> Path: ...
    @property
    def database_sidecars(self) -> tuple[Path, Path]: ...
    @property
    def key(self) -> SecretStr | None: ...
    @property
    def key_file(self) -> Path | None: ...
    @property
    def key_path(self) -> Path: ...
    @property
    def high_water_path(self) -> Path | None: ...
    @property
    def signing_key_file(self) -> Path | None: ...
    @property
    def allow_insecure_permissions(self) -> bool: ...
    @property
    def synchronous(self) -> Literal["full", "normal"]: ...
    @property
    def busy_timeout(self) -> float: ...
    @property
    def postgres_schema(self) -> str: ...
    @property
    def postgres_statement_timeout(self) -> float: ...
    @property
    def postgres_lock_timeout(self) -> float: ...


class Services(Protocol):
    """An open store with its services wired (the composition root's ``Runtime``)."""

    @property
    def store(self) -> SecureObjectStore: ...
    @property
    def cipher(self) -> Cipher: ...
    @property
    def repository(self) -> SealedRepository: ...
    @property
    def workflows(self) -> WorkflowService: ...
    @property
    def runs(self) -> RunService: ...
    @property
    def definitions(self) -> DefinitionRegistry: ...
    @property
    def workflow_events(self) -> WorkflowEventService: ...
    @property
    def action_results(self) -> ActionResultService: ...
    @property
    def receipts(self) -> TerminalReceipts: ...
    @property
    def checkpoints(self) -> CheckpointService: ...
    @property
    def approvals(self) -> ApprovalService: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def capabilities(self) -> StoreCapabilities: ...

    def state(self, scope: str) -> StateRepository[WorkflowState]:
        """Return the workflow state repository of ``scope``."""
        ...

    def retention(self, policy: RetentionPolicy | None = None) -> RetentionJob:
        """Return the retention job over every service, under ``policy``."""
        ...

    def close(self) -> None:
        """Release the store's connections and files."""
        ...

    def __enter__(self) -> Services: ...
    def __exit__(self, *_: object) -> None: ...


class CliContext(Protocol):
    """The settings and the ways to open a store, as the console entry point wires them."""

    @property
    def settings(self) -> CliSettings: ...

    def is_cold_root(self) -> bool:
        """Whether nothing exists yet: opening would have to create a store."""
        ...

    def open_existing(self) -> Services | None:
        """Open the store and its services if it exists; ``None`` on a cold root."""
        ...

    def bootstrap(self) -> Services:
        """Open the store and its services, creating them (and a key) when absent: init only."""
        ...

    def open_store(self, *, read_only: bool = False, lenient: bool = False) -> SecureObjectStore:
        """Open the existing store alone: no cipher, so no key is read, resolved or created.

        A missing store is ``NotFound`` naming ``flowvault init``, and nothing
        is created. ``read_only`` opens an SQLite file with ``mode=ro``;
        ``lenient`` opens despite loose file modes.
        """
        ...

    def open_target(self, location: str, *, schema: str | None = None) -> SecureObjectStore:
        """Open, creating it if need be, the store a move or an import writes to.

        ``location`` is a PostgreSQL DSN (``postgres://`` or
        ``postgresql://``; ``schema`` defaults to the configured one) or the
        home directory of a SQLite store. No key is read or created.
        """
        ...

    def key_file(self) -> KeyRingStore:
        """Return the key file; ``KeyRequired`` where the backend keeps none."""
        ...

    def anti_rollback(
        self, store: SecureObjectStore, cipher: Cipher, capabilities: StoreCapabilities | None
    ) -> AntiRollback | None:
        """Return the high-water mark guarding ``store``, or ``None`` where none is kept."""
        ...

    def restore_guard(self, mark: Path) -> AbstractContextManager[AntiRollback | None]:
        """Open the store unguarded and yield the high-water mark at ``mark`` over it.

        The mark is yielded whatever ``FLOWVAULT_MARK_SYNC`` says, so a restore
        can be accepted; ``None`` when the store keeps no commit count.
        """
        ...

    def receipt_signer(self) -> ReceiptSigner | None:
        """Return the configured receipt signer, if ``FLOWVAULT_SIGNING_KEY_FILE`` names one."""
        ...

    def demo(self, home: Path) -> CliContext:
        """Return the context of a fresh SQLite store at ``home``, keyed by its own key file."""
        ...
