"""Reading the files a profile names (and the profile itself): regular files only, size-capped.

A device (``file: /dev/zero``), a pipe or a folder is refused before it is opened, and a file is
read up to its cap plus one byte, so neither an endless stream nor a huge file can stall
validation or exhaust memory.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

MIB = 1024 * 1024
MAX_PROFILE_BYTES = 1 * MIB        # a profile is hand-written; long sample lists go in a file
MAX_DATA_BYTES = 64 * MIB          # traces and empirical length files (~1M rows)


class FileLimitError(OSError):
    """A file that is not a regular file or is over its size cap; the message says which."""


def read_text(path, max_bytes: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` (default ``MAX_DATA_BYTES``)."""
    path = Path(path)
    max_bytes = MAX_DATA_BYTES if max_bytes is None else max_bytes
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
        raise FileLimitError(f"{kind}, not a regular file")
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileLimitError(f"larger than {_size(max_bytes)} (the cap for this file)")
    return data.decode("utf-8")


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n:,} bytes"
