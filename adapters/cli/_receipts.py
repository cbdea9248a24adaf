"""Reading the small files verbs take (receipts, public keys, statements) and showing receipts."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from flowvault.domain import InvalidInput, TerminalReceipt, parse_terminal_receipt
from flowvault.domain._receipt import MAX_RECEIPT_BYTES, HeadReceipt, parse_receipt


def _read_stdin(stdin: TextIO) -> bytes:
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(MAX_RECEIPT_BYTES + 1)
        return data
    return stdin.read(MAX_RECEIPT_BYTES + 1).encode("utf-8", "surrogateescape")


def read_text_file(path: str, stdin: TextIO, what: str = "receipt") -> str:
    """Read a small UTF-8 file, or ``stdin`` for ``-``; ``InvalidInput`` naming ``what``."""
    try:
        if path == "-":
            content = _read_stdin(stdin)
        else:
            with Path(path).open("rb") as file:
                content = file.read(MAX_RECEIPT_BYTES + 1)
    except OSError as error:
        raise InvalidInput(
            f"cannot read {what} {path}: {error.strerror}",
            path=path,
            fix=f"check the {what} path and that this user can read it ('-' reads stdin)",
        ) from None
    except ValueError:
        raise InvalidInput(f"a {what} path must not contain a NUL byte") from None
    if len(content) > MAX_RECEIPT_BYTES:
        raise InvalidInput(f"{what} {path} is larger than {MAX_RECEIPT_BYTES} bytes", path=path)
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} {path} is not UTF-8 text", path=path) from None


def read_any_receipt_file(path: str, stdin: TextIO) -> HeadReceipt | TerminalReceipt:
    """Read a head receipt or a terminal receipt, told apart by their first character.

    A head receipt opens with its origin line, a terminal receipt with the
    ``{`` of its JSON object.
    """
    text = read_text_file(path, stdin)
    return parse_terminal_receipt(text) if text.startswith("{") else parse_receipt(text)


def terminal_receipt_document(receipt: TerminalReceipt) -> dict[str, object]:
    """Return a terminal receipt's fields as shown, its kind first and its text last."""
    body = receipt.body()
    return {"kind": body.pop("kind"), **body, "receipt": receipt.text()}
