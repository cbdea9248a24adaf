"""The keyed integrity digest a signed record carries over everything its body covers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.domain import Approval, Checkpoint, Witness
from flowvault.domain._canonical import canonical_bytes
from flowvault.domain._ledger import GENESIS_HASH

Signed = TypeVar("Signed", Checkpoint, Approval, Witness)


def signed(model: type[Signed], key: KeyedDigester, tag: str, fields: Mapping[str, Any]) -> Signed:
    """Validate ``fields`` and stamp the keyed digest of everything the model's body covers."""
    draft = model.model_validate({**fields, "integrity_digest": GENESIS_HASH})
    return draft.model_copy(update={"integrity_digest": integrity_digest(key, tag, draft)})


def integrity_digest(key: KeyedDigester, tag: str, value: Checkpoint | Approval | Witness) -> str:
    """Return the keyed digest of ``value``'s integrity body under ``tag``."""
    return key.keyed_digest(tag, canonical_bytes(value.integrity_body()))
