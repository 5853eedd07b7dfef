"""Opening a data file: a clear error when it cannot be read, and gzip told by its magic bytes.

Every reader in :mod:`slate.data.readers` opens its files here.
"""

from __future__ import annotations

import gzip
import os
import zlib

from slate.errors import DataError

__all__ = ["GZIP_MAGIC", "MAX_ELEMENTS", "open_data_file", "read_text"]

#: Largest dense matrix (rows * features) the readers agree to allocate.
MAX_ELEMENTS = 2**31
#: The first two bytes of every gzip stream.
GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"


def open_data_file(name: str):
    """``open(name, "rb")``, or a :class:`DataError` that says why the file cannot be read."""
    try:
        return open(name, "rb")  # the caller closes it
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DataError(
            f"Cannot read data file {name}: {reason}. Check that the path is correct and that "
            "the file is readable."
        ) from None


def read_text(path: str | os.PathLike[str]) -> str:
    """Read a whole text file, transparently decompressing gzip, and decode it as UTF-8.

    Gzip is recognised by its magic bytes ``1f 8b`` rather than by the file name, so a
    decompressed file that kept its ``.gz`` suffix (or a compressed one without it) is read
    correctly. A leading UTF-8 byte-order mark is dropped.

    Args:
        path: The file to read.

    Returns:
        The decoded text.

    Raises:
        DataError: If the file cannot be opened, is a corrupt gzip stream, or is not UTF-8.
    """
    name = os.fspath(path)
    with open_data_file(name) as fh:
        raw = fh.read()
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(
                f"Data file {name} starts with the gzip signature (bytes 1f 8b) but cannot be "
                f"decompressed ({exc}); the file is probably truncated or corrupt. Download it "
                "again or replace it with an intact copy."
            ) from None
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"Data file {name}, line {line}: the file is not valid UTF-8 text (byte "
            f"0x{raw[exc.start]:02x} at offset {exc.start} cannot be decoded). Expected a text "
            "file, plain or gzip-compressed; check that the right file was given and that it "
            "is not damaged."
        ) from None
