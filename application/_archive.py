"""A store's contents as one archive file: a zip of row lines and a MAC'd manifest.

The manifest names the format, the source and the line count and SHA-256 of
each part, and is MAC'd under the store's integrity key, so an archive that
was edited, cut or stitched together is refused before anything is written
anywhere. The zip is built and read in memory: writing the file is the
caller's job.
"""

from __future__ import annotations

import hmac
import io
import zipfile
import zlib
from collections.abc import Mapping
from typing import Final

from flowvault.application._keyed_digester import KeyedDigester
from flowvault.application._records import StoreContents
from flowvault.application._transfer import (
    COUNTS_PART,
    EVENTS_PART,
    RECORDS_PART,
    PartSummary,
    counts_text,
    event_from_line,
    event_line,
    record_from_line,
    record_line,
    summarise_lines,
)
from flowvault.domain import IntegrityFailure, InvalidInput
from flowvault.domain._canonical import (
    canonical_bytes,
    canonical_json,
    digest_bytes,
    parse_canonical,
)

ARCHIVE_FORMAT: Final = "flowvault-archive"
ARCHIVE_VERSION: Final = 1
MANIFEST: Final = "manifest.json"
MANIFEST_MAC_TAG: Final = "flowvault.archive.manifest.v1"
"""Purpose tag of the manifest's MAC, so no other keyed digest can stand in for it."""

_PARTS: Final = (RECORDS_PART, EVENTS_PART, COUNTS_PART)
_MEMBERS: Final = (MANIFEST, *_PARTS)
_UNREADABLE = (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError, ValueError)


def _refused(message: str, part: str) -> IntegrityFailure:
    return IntegrityFailure(f"{message}; nothing was written", part=part)


def encode_archive(
    contents: StoreContents, digester: KeyedDigester, source: Mapping[str, str | int]
) -> tuple[bytes, dict[str, object]]:
    """Return the archive of ``contents`` and its manifest body.

    ``source`` names where it came from (backend, epoch): safe labels only,
    never a DSN or a path with a password.
    """
    records, records_part = summarise_lines(record_line(record) for record in contents.records)
    events, events_part = summarise_lines(event_line(event) for event in contents.events)
    counts = counts_text(contents) + b"\n"
    parts = {
        RECORDS_PART: records_part,
        EVENTS_PART: events_part,
        COUNTS_PART: PartSummary(1, digest_bytes(counts)),
    }
    body: dict[str, object] = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "source": dict(source),
        "parts": {name: part.document() for name, part in parts.items()},
    }
    mac = digester.keyed_digest(MANIFEST_MAC_TAG, canonical_json(body))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(MANIFEST, canonical_bytes({"body": body, "mac": mac}) + b"\n")
        for name, data in ((RECORDS_PART, records), (EVENTS_PART, events), (COUNTS_PART, counts)):
            archive.writestr(name, data)
    return buffer.getvalue(), body


def _members(data: bytes) -> dict[str, bytes]:
    """Return the archive's members; anything but exactly the expected members is refused."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            if sorted(names) != sorted(_MEMBERS):
                raise _refused("the archive does not hold exactly a manifest and its parts", "zip")
            return {name: archive.read(name) for name in names}
    except _UNREADABLE:
        raise _refused("the archive is not a readable zip file", "zip") from None


def _manifest(raw: bytes, digester: KeyedDigester) -> dict[str, object]:
    """Return the manifest body once its MAC verifies under the store's integrity key."""
    try:
        document = parse_canonical(raw.decode("utf-8").rstrip("\n"))
        if not isinstance(document, dict) or sorted(document) != ["body", "mac"]:
            raise TypeError("manifest")
        body, mac = document["body"], document["mac"]
        if not isinstance(body, dict) or not isinstance(mac, str):
            raise TypeError("manifest")
        expected = digester.keyed_digest(MANIFEST_MAC_TAG, canonical_json(body))
    except (*_UNREADABLE, TypeError, InvalidInput):
        raise _refused("the archive's manifest is malformed", MANIFEST) from None
    if not hmac.compare_digest(mac.encode("utf-8"), expected.encode("utf-8")):
        raise _refused(
            "the archive's manifest does not verify under this store key: it was edited, "
            "or it was written under another key",
            MANIFEST,
        )
    if body.get("format") != ARCHIVE_FORMAT or body.get("version") != ARCHIVE_VERSION:
        raise _refused("the archive is of an unknown format or version", MANIFEST)
    return dict(body)


def decode_archive(data: bytes, digester: KeyedDigester) -> tuple[StoreContents, dict[str, object]]:
    """Verify the whole archive, then return its contents and its manifest body.

    The manifest's MAC is checked first, then every part's line count and
    digest against it, and only then is any line parsed.

    Raises:
        IntegrityFailure: the file is not a flowvault archive, its manifest
            does not verify under this key, or a part differs from the
            manifest (a changed, dropped or added byte or line).

    """
    members = _members(data)
    body = _manifest(members[MANIFEST], digester)
    parts = body.get("parts")
    if not isinstance(parts, dict):
        raise _refused("the archive's manifest lists no parts", MANIFEST)
    for name in _PARTS:
        found = PartSummary(members[name].count(b"\n"), digest_bytes(members[name]))
        if parts.get(name) != found.document():
            raise _refused(f"the archive's part {name} differs from its manifest", name)
    records = tuple(record_from_line(line) for line in members[RECORDS_PART].splitlines(True))
    events = tuple(event_from_line(line) for line in members[EVENTS_PART].splitlines(True))
    try:
        counts = parse_canonical(members[COUNTS_PART].decode("utf-8").rstrip("\n"))
        if not isinstance(counts, dict):
            raise TypeError("counts")
        seal_counts, epoch = counts["seal_counts"], counts["epoch"]
        if not isinstance(seal_counts, dict) or not isinstance(epoch, int):
            raise TypeError("counts")
        seals: dict[str, int] = {}
        for key_id, count in seal_counts.items():
            if not isinstance(count, int):
                raise TypeError("seal count")
            seals[key_id] = count
        contents = StoreContents(
            records=records,
            events=events,
            seal_counts=seals,
            epoch=epoch,
        )
    except (*_UNREADABLE, TypeError, InvalidInput):
        raise _refused("the archive's contents are malformed", COUNTS_PART) from None
    return contents, body
