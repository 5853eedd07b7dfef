"""Reading a delimited file's records in blocks: opening (plain or gzip), decoding, the
delimiter and the header."""

from __future__ import annotations

import codecs
import csv
import gzip
import io
import itertools
import re
import zlib
from collections.abc import Iterator, Sequence

from slate.data.readers.cells import CellContext, line_breaks, to_float
from slate.data.readers.files import GZIP_MAGIC, open_data_file
from slate.errors import DataError

__all__ = [
    "WHITESPACE",
    "TextRecords",
    "check_names",
    "describe_columns",
    "describe_named_columns",
    "detect_header",
    "find_label",
    "index_hint",
    "resolve_label_column",
]


#: Rows looked at, after the first, to decide whether the first row is a header.
_HEADER_SAMPLE = 50
#: Text read ahead, at most, to detect the delimiter.
_SNIFF_CHARS = 65_536
_DELIMITERS = (",", ";", "\t")
_WORD, _NUMBER, _NONFINITE = 0, 1, 2


# ----------------------------------------------------------------------------- the file


#: ``--delimiter whitespace``: cells separated by runs of spaces and tabs.
WHITESPACE = "whitespace"
_RUNS_OF_BLANKS = re.compile(r"[ \t]+")


def _tab_separated(line: str) -> str:
    """A whitespace-separated line with its runs of blanks as single tabs, ends stripped."""
    end = len(line) - len(line.rstrip("\r\n"))
    return _RUNS_OF_BLANKS.sub("\t", line[: len(line) - end].strip(" \t")) + line[len(line) - end :]


class TextRecords:
    """The non-blank records of a delimited text file, read in blocks with their first lines.

    The file may be plain or gzip (recognised by its magic bytes). With ``delimiter=None`` the
    delimiter is detected from the first lines, which are read ahead and then parsed as usual.
    Every failure to read, decompress, decode or parse becomes a DataError naming the line.
    """

    def __init__(self, name: str, encoding: str, delimiter: str | None) -> None:
        self.name = name
        self.encoding = encoding
        try:
            info = codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise DataError(
                f"Cannot read {name}: unknown text encoding {encoding!r}. Use a Python codec "
                "name such as utf-8, latin-1 or cp1252."
            ) from None
        self.codec = "utf-8-sig" if info.name == "utf-8" else info.name
        self._raw = open_data_file(name)  # closed by close()
        self._text: io.TextIOWrapper | None = None
        self.gzipped = False
        head: list[str] = []
        try:
            self.gzipped = self._raw.peek(2)[:2] == GZIP_MAGIC
            binary = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.gzipped else self._raw
            self._text = io.TextIOWrapper(binary, encoding=self.codec, newline="")
            if delimiter is None:
                size, complete = 0, False
                while size < _SNIFF_CHARS and len(head) < 2 * _HEADER_SAMPLE:
                    line = self._text.readline()
                    if not line:
                        complete = True
                        break
                    head.append(line)
                    size += len(line)
                delimiter = _sniff_delimiter(head, complete)
        except (UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
            self.close()
            raise self._failure(exc, None) from None
        self.delimiter: str = delimiter
        lines: Iterator[str] = itertools.chain(head, self._text)
        if delimiter == WHITESPACE:
            lines, delimiter = map(_tab_separated, lines), "\t"
        self._reader = csv.reader(lines, delimiter=delimiter, strict=True)

    def __enter__(self) -> TextRecords:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._text is not None:
            self._text.close()
        self._raw.close()

    def block(self, size: int) -> tuple[Sequence[int], list[list[str]]]:
        """The non-blank records among the next ``size`` (more if all are blank), with the line
        on which each starts; empty lists at the end of the file."""
        reader = self._reader
        while True:
            before = reader.line_num
            try:
                rows = list(itertools.islice(reader, size))
            except csv.Error as exc:
                raise DataError(
                    f"CSV file {self.name}, line {reader.line_num}: the line cannot be parsed as "
                    f"CSV ({exc}). Expected delimiter-separated cells ({self.delimiter!r}) with "
                    "balanced quotes."
                ) from None
            except (UnicodeDecodeError, OSError, EOFError, zlib.error) as exc:
                raise self._failure(exc, reader.line_num + 1) from None
            if not rows:
                return [], []
            if reader.line_num - before == len(rows) and min(map(len, rows)) > 1:
                return range(before + 1, before + 1 + len(rows)), rows  # one line per record
            lines: list[int] = []
            kept: list[list[str]] = []
            line = before
            for row in rows:  # blank lines, or cells holding line breaks
                first = line + 1
                line = first + sum(map(line_breaks, row))
                if len(row) <= 1 and (not row or not row[0].strip()):
                    continue
                lines.append(first)
                kept.append(row)
            if kept:
                return lines, kept

    def data_block(self, size: int) -> tuple[Sequence[int], list[list[str]]]:
        """The data rows of :meth:`block`: the interface
        :class:`~slate.data.readers.arrow_records.ArrowRecords` serves as columns."""
        return self.block(size)

    def _failure(self, exc: BaseException, line: int | None) -> DataError:
        if not isinstance(exc, UnicodeDecodeError):
            if self.gzipped:
                return DataError(
                    f"Data file {self.name} starts with the gzip signature (bytes 1f 8b) but "
                    f"cannot be decompressed ({exc}); the file is probably truncated or "
                    "corrupt. Download it again or replace it with an intact copy."
                )
            return DataError(f"Cannot read data file {self.name}: {exc}.")
        label = "UTF-8" if self.codec == "utf-8-sig" else self.encoding
        found = _decode_position(self.name, self.gzipped, self.codec)
        hint = (
            "If it was saved in another encoding (spreadsheets on Windows often write cp1252), "
            "pass it, e.g. --encoding latin-1."
        )
        if found is None:
            where, detail = (f", line {line}" if line else ""), f"({exc.reason})"
        else:
            position, found_line, byte = found
            where = f", line {found_line}"
            detail = f"(byte 0x{byte:02x} at byte offset {position} cannot be decoded)"
            if position <= 1 and byte in (0xFE, 0xFF):
                hint = "It starts like UTF-16 text: pass --encoding utf-16."
        return DataError(
            f"CSV file {self.name}{where}: the file is not valid {label} text {detail}. {hint}"
        )


def _decode_position(name: str, gzipped: bool, codec: str) -> tuple[int, int, int] | None:
    """Where the file stops decoding: byte offset (of the decompressed text), line and byte."""
    decoder = codecs.getincrementaldecoder("utf-8" if codec == "utf-8-sig" else codec)()
    offset = newlines = 0
    try:
        with open(name, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
            while block := stream.read(1 << 20):
                state = decoder.getstate()
                pending = len(state[0]) if isinstance(state[0], bytes) else 0
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as exc:
                    inside = max(0, exc.start - pending)
                    line = newlines + block.count(b"\n", 0, inside) + 1
                    return offset - pending + exc.start, line, exc.object[exc.start]
                offset += len(block)
                newlines += block.count(b"\n")
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                return offset - len(exc.object) + exc.start, newlines + 1, exc.object[exc.start]
    except (OSError, EOFError, zlib.error):
        return None
    return None


def _sniff_delimiter(lines: list[str], complete: bool) -> str:
    """The delimiter among ``, ; tab`` that the first records use, ``,`` if none."""
    records: list[dict[str, int]] = []
    current = dict.fromkeys(_DELIMITERS, 0)
    quoted = nonblank = False
    for char in "".join(lines):
        if char == '"':
            quoted = not quoted
            nonblank = True
        elif quoted:
            continue
        elif char in "\r\n":
            if nonblank:
                records.append(current)
            current, nonblank = dict.fromkeys(_DELIMITERS, 0), False
        elif char in current:
            current[char] += 1
            nonblank = True
        elif not char.isspace():
            nonblank = True
    if nonblank:
        records.append(current)
    if not complete and len(records) > 1:
        records.pop()  # possibly cut short by the read-ahead limit
    if not records:
        return ","
    first = records[0]
    used = [d for d in _DELIMITERS if first[d] > 0]
    if not used:
        return ","
    consistent = [d for d in used if all(r[d] == first[d] for r in records)]
    return max(consistent or used, key=lambda d: first[d])


def detect_header(
    first: list[str], sample: list[list[str]], label_column: str | int | None, context: CellContext
) -> bool:
    """Whether the first row is a header (see :func:`read_table`)."""
    stripped = [cell.strip() for cell in first]
    hint = None if label_column is None else index_hint(label_column, len(first))
    if isinstance(label_column, str) and hint is None and label_column.strip() in stripped:
        return True

    def kind(cell: str) -> int | None:  # None: missing
        text = cell.strip()
        if text.casefold() in context.na:
            return None
        return _WORD if to_float(text) is None else _NUMBER

    words = [j for j, cell in enumerate(first) if j != hint and kind(cell) == _WORD]
    if not words:
        return False
    for j in words:
        below = {kind(row[j]) for row in sample if len(row) > j}
        if _NUMBER in below and _WORD not in below:
            return True  # a name above a column of numbers
    if any(kind(cell) == _NUMBER for j, cell in enumerate(first) if j != hint):
        return False
    return not any(row[j].strip() == stripped[j] for j in words for row in sample if len(row) > j)


def index_hint(label_column: str | int, n_cols: int) -> int | None:
    """The column index that ``label_column`` denotes if it is read as an index, else None."""
    if isinstance(label_column, str):
        key = label_column.strip()
        if not (key.isascii() and key.isdigit()):
            return None
        index = int(key)
    else:
        index = int(label_column)
    if -n_cols <= index < n_cols:
        return index % n_cols
    return None


def check_names(name: str, feature_names: list[str]) -> None:
    """Feature columns are looked up by name, so two of them may not share one."""
    seen: dict[str, int] = {}
    for position, column in enumerate(feature_names):
        if column in seen:
            raise DataError(
                f"CSV file {name}: the header names two feature columns {column!r} (columns "
                f"{seen[column] + 1} and {position + 1} of the features). Rename one of them."
            )
        seen[column] = position


def describe_columns(names: list[str] | None, n_cols: int) -> str:
    """List the available columns for an error message."""
    if names is None:
        return f"the file has no header row, so use a 0-based index from 0 to {n_cols - 1}"
    shown = ", ".join(repr(n) for n in names[:20])
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    return f"available columns: {shown}{more} (or a 0-based index from 0 to {n_cols - 1})"


def describe_named_columns(names: list[str], header: bool, n_cols: int) -> str:
    """List the columns for an error about columns matched by name (not by index)."""
    if header:
        return describe_columns(names, n_cols)
    return (
        f"the file has no header row, so its columns are named 'column 0' to "
        f"'column {n_cols - 1}'; columns are matched by the header names of the training file"
    )


def find_label(
    name: str,
    label_column: str | int | None,
    names: list[str],
    header: bool,
    n_cols: int,
    labels: str,
) -> int | None:
    """The label column's index; None when it is absent and labels are optional."""
    if label_column is None:
        return None
    if labels == "optional" and isinstance(label_column, str):
        key = label_column.strip()
        if (key not in names or not header) and not (key.isascii() and key.isdigit()):
            return None  # a named label column the file does not have: no labels
    return resolve_label_column(name, label_column, names if header else None, n_cols)


def resolve_label_column(
    name: str, label_column: str | int, names: list[str] | None, n_cols: int
) -> int:
    """Turn a label column name or index into a 0-based index, or raise a DataError."""
    if isinstance(label_column, str):
        key = label_column.strip()
        if names is not None and key in names:
            if names.count(key) > 1:
                raise DataError(
                    f"CSV file {name}: the header has {names.count(key)} columns named {key!r}, "
                    "so the label column is ambiguous. Rename the duplicates or give the label "
                    "column by its 0-based index."
                )
            return names.index(key)
        if not (key.isascii() and key.isdigit()):
            raise DataError(
                f"CSV file {name}: label column {label_column!r} not found; "
                f"{describe_columns(names, n_cols)}."
            )
        index = int(key)
    else:
        index = int(label_column)
    if not -n_cols <= index < n_cols:
        raise DataError(
            f"CSV file {name}: label column index {index} is out of range for a file with "
            f"{n_cols} columns; {describe_columns(names, n_cols)}."
        )
    return index % n_cols
