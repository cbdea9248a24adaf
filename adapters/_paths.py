"""Paths the operating system can take, and private directories created whatever the umask."""

from __future__ import annotations

import os
from pathlib import Path


def create_private_directories(directory: Path, mode: int = 0o700) -> list[Path]:
    """Create ``directory`` and its missing parents with ``mode``; return those created.

    ``mkdir(parents=True)`` gives the parents it creates the umask's mode,
    and a parent others can write lets them swap a private directory for
    their own. ``chmod`` follows each ``mkdir`` because the umask trims it.
    """
    missing: list[Path] = []
    current = Path(directory)
    while not current.exists():
        missing.append(current)
        current = current.parent
    created: list[Path] = []
    for path in reversed(missing):
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            continue
        os.chmod(path, mode)
        created.append(path)
    return created


def check_os_path(path: Path) -> Path:
    """Return ``path`` if the operating system can take it, else raise ``ValueError``.

    A NUL byte, or text the file system encoding cannot carry (a lone
    surrogate outside the ``surrogateescape`` range), would otherwise fail
    deep inside the first file operation with a bare ``ValueError``.
    """
    text = str(path)
    if "\x00" in text:
        raise ValueError("must not contain a NUL byte")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise ValueError("must be encodable in the file system's encoding") from None
    return path
