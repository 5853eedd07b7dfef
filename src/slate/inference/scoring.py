r"""Reading a file for a trained model, and scoring it: what ``predict``, ``evaluate`` and
``calibrate`` share.

A file is read the way the run read its data (``model.json``'s ``input``), through the run's
preprocessing (:class:`slate.inference.model_file.Preprocessing`), and scored with the averaged
model in eval mode, in the same forward passes as the run's own evaluation: passes of 256 rows
aligned to the indices of the rows scored, the last padded (:mod:`slate.models.passes`), so that
the run's test file gives the same logits as training reported, and a row's logit does not
depend on how the file is read in pieces or on which bad rows around it are skipped.
Formats: see :mod:`slate.inference.predict`.

**Bad rows** (CSV files). The model's numeric columns are read as numbers in every block of rows,
whatever a block holds; a row whose cell in one of them is not a number (nor in the format the
column's other cells show: ``45%``, ``1,234``, an ISO date) or lies beyond the float32 range, a
row with the wrong number of cells, or (labels required: evaluate, calibrate) a row without a
label, is a *bad row*. By default (``on_bad_row="error"``) the
first one stops the reading, with the file, line, column and cell in the message; with
``on_bad_row="skip"`` bad rows are left out (no score is written for them) and one note gives
their count and first line numbers. Notes about a file (categories training never saw, empty
columns, numbers in disguise, missing labels) are said once per file, however many blocks it is
read in.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from slate.data.encoding import OTHER
from slate.data.readers.table import BadCell
from slate.errors import ConfigError, DataError
from slate.inference.model_file import Preprocessing
from slate.models.passes import EVAL_CHUNK, ChunkedScorer, forward_in_chunks

__all__ = [
    "BAD_ROW_CHOICES",
    "CHUNK",
    "InputFile",
    "PieceScorer",
    "iter_input",
    "logits_of",
    "read_input",
]

CHUNK = EVAL_CHUNK  # rows per forward pass, as in training (slate.models.passes)
BAD_ROW_CHOICES = ("error", "skip")  # --on-bad-row
_LISTED_LINES = 5  # line numbers of skipped rows named in the note


@dataclass
class InputFile:
    """A file read for a model: its model input, labels (if any) and ID columns."""

    path: str
    features: np.ndarray  # float32 (n, *input_shape)
    labels: np.ndarray | None  # int64 0/1, or None when the file holds none
    ids: dict[str, list[str]] = field(default_factory=dict)
    raw: np.ndarray | None = None  # raw features (the exported program's input)
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.features)


def read_input(
    preprocessing: Preprocessing,
    path: str | Path,
    labels: str = "optional",
    run: str = "the run",
    on_bad_row: str = "error",
    delimiter: str | None = None,
) -> InputFile:
    """Read ``path`` as the run read its data and prepare the model input.

    Args:
        preprocessing: the run's, from :func:`slate.inference.model_file.load_model`.
        path: the file (or image folder).
        labels: ``"optional"`` (predict) or ``"required"`` (evaluate, calibrate).
        run: the run folder, named in errors.
        on_bad_row: a CSV file's bad rows (module docstring): ``"error"`` or ``"skip"``.
        delimiter: a CSV file's delimiter, instead of the run's (``"whitespace"``: runs of
            spaces and tabs).

    Raises:
        DataError: the file cannot be read, or its features do not fit the model (a feature
            index above the model's width, columns missing, images of another shape), or
            ``labels="required"`` and it holds none.
    """
    path = str(path)
    kind = preprocessing.input.get("format")
    _check_reading(kind, on_bad_row, delimiter, run)
    if kind == "csv":
        read = _read_table(preprocessing, path, labels, on_bad_row, delimiter)
    elif kind == "images":
        read = _read_images(preprocessing, path, run)
    elif kind == "libsvm":
        read = _read_libsvm(preprocessing, path, run)
    else:
        raise DataError(f"{run}: model.json names an unknown input format {kind!r}.")
    if labels == "required" and read.labels is None:
        raise DataError(
            f"{path} holds no labels, but they are needed here (to measure the model, or to "
            "choose a threshold). Give a labelled file."
        )
    return read


def _read_libsvm(pre: Preprocessing, path: str, run: str) -> InputFile:
    from slate.data.readers.libsvm import read_libsvm

    d = int(pre.input["n_features"])
    if path.endswith(".npy"):
        return _from_array(pre, path, _load_npy(path), run)
    try:
        x, y = read_libsvm(path, n_features=d, zero_based=bool(pre.input.get("zero_based")),
                           positive=pre.input.get("positive_label"))  # fmt: skip
    except DataError as err:
        raise DataError(
            f"{err} The model of {run} takes {d} features (LIBSVM indices 1 to {d}); a file "
            "with other features would get wrong scores, so it is refused."
        ) from None
    return InputFile(path, pre(x), y, raw=x)


def _from_array(pre: Preprocessing, path: str, raw: np.ndarray, run: str) -> InputFile:
    want = pre.raw_shape
    if raw.ndim == len(want) and len(want) == 3 and want[0] == 1:
        raw = raw[:, None]  # (n, H, W) images of one channel
    if tuple(raw.shape[1:]) != want:
        raise DataError(
            f"{path} holds rows of shape {tuple(raw.shape[1:])}, but the model of {run} takes "
            f"rows of shape {want}: {_shape_difference(tuple(raw.shape[1:]), want)}."
        )
    if not np.issubdtype(raw.dtype, np.number) or np.iscomplexobj(raw):
        raise DataError(f"{path} holds {raw.dtype} values; expected real numbers.")
    raw = raw.astype(np.float32)
    return InputFile(path, pre(raw), None, raw=raw)


def _shape_difference(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    if len(got) == 1 and len(want) == 1:
        more = "more" if got[0] > want[0] else "fewer"
        return f"{abs(got[0] - want[0])} {more} features than the model's {want[0]}"
    return f"{len(got)}-D rows {got} against {want}"


def _load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"{path} does not exist.") from None
    except (OSError, ValueError) as err:
        raise DataError(f"{path} cannot be read as a .npy array ({err}).") from None


def _read_images(pre: Preprocessing, path: str, run: str) -> InputFile:
    from slate.data.datasets import IMAGE_SETS
    from slate.data.imbalance import binarize_classes

    dataset = pre.input["dataset"]
    if path.endswith(".npy"):
        return _from_array(pre, path, _load_npy(path), run)
    where = Path(path)
    if not where.exists():
        raise DataError(f"{path} does not exist.")
    if dataset in ("mnist", "fashion-mnist"):
        images, classes = _mnist_images(where)
    elif dataset == "cifar10":
        images, classes = _cifar_images(where)
    else:
        from slate.data.readers.tinyimagenet import read_tiny_imagenet

        images, classes = read_tiny_imagenet(where, image_size=pre.input_shape[-1])[2:4]
    read = _from_array(pre, path, images, run)
    if classes is not None:
        read.labels = binarize_classes(classes, IMAGE_SETS[dataset].n_classes)
    return read


def _mnist_images(where: Path) -> tuple[np.ndarray, np.ndarray | None]:
    from slate.data.readers.idx import read_idx, read_mnist_split

    if where.is_dir():
        return read_mnist_split(where, "test")
    images = read_idx(where)
    name = where.name
    for image_part, label_part in (("images-idx3", "labels-idx1"), ("images.idx3", "labels.idx1")):
        if image_part in name:
            sibling = where.with_name(name.replace(image_part, label_part))
            if sibling.is_file():
                classes = read_idx(sibling).astype(np.int64)
                if len(classes) != len(images):
                    raise DataError(
                        f"{where} holds {len(images)} images but {sibling} holds "
                        f"{len(classes)} labels."
                    )
                return images, classes
    return images, None


def _cifar_images(where: Path) -> tuple[np.ndarray, np.ndarray]:
    from slate.data.readers.cifar import CIFAR_TEST_FILE, read_cifar_file

    if where.is_dir():
        nested = where / "cifar-10-batches-bin" / CIFAR_TEST_FILE
        where = nested if nested.is_file() else where / CIFAR_TEST_FILE
    return read_cifar_file(where)


def iter_input(
    preprocessing: Preprocessing,
    path: str | Path,
    labels: str = "optional",
    run: str = "the run",
    on_bad_row: str = "error",
    delimiter: str | None = None,
) -> Iterator[InputFile]:
    """:func:`read_input` in pieces: a CSV file one block of rows at a time (its notes, about
    the whole file, come with the last piece), any other file whole."""
    _check_reading(preprocessing.input.get("format"), on_bad_row, delimiter, run)
    if preprocessing.input.get("format") != "csv":
        yield read_input(preprocessing, path, labels, run)
        return
    yield from _table_chunks(preprocessing, str(path), labels, on_bad_row, delimiter)


def _check_reading(kind: str | None, on_bad_row: str, delimiter: str | None, run: str) -> None:
    """``--on-bad-row`` is known; it and ``--delimiter`` are for CSV runs only."""
    if on_bad_row not in BAD_ROW_CHOICES:
        raise ConfigError(f"--on-bad-row is one of {BAD_ROW_CHOICES}, got {on_bad_row!r}.")
    given = [f for f, v in (("--on-bad-row skip", on_bad_row == "skip"),
                            ("--delimiter", delimiter is not None)) if v]  # fmt: skip
    if kind != "csv" and given:
        raise ConfigError(
            f"{' and '.join(given)} apply to the CSV files of a CSV run; {run} reads "
            f"{kind or 'another format'} files."
        )


def _table_chunks(
    pre: Preprocessing, path: str, labels: str, on_bad_row: str, delimiter: str | None
) -> Iterator[InputFile]:
    """A table's pieces, read and encoded with the model's column kinds (``model.json``): the
    model's text columns are read as text and its numeric columns as numbers whatever this
    file's cells look like (a one-row file with an empty cell, codes that look numeric, a word
    in a numeric column: a bad row, module docstring)."""
    from slate.data.options import TableOptions

    encoder = pre.encoder
    encoder.unseen.clear()  # counted per file
    saved = TableOptions.from_saved(pre.input)
    if delimiter is not None:
        saved = dataclasses.replace(saved, delimiter=delimiter)
    forced = [c for c in encoder.text if c not in saved.categorical_columns]
    options = dataclasses.replace(saved, categorical_columns=(*saved.categorical_columns, *forced))
    mode = "single_class_ok" if labels == "required" else "optional"
    notes = _TableNotes(path, encoder)
    bad = _BadRows(path, on_bad_row)
    last = None
    for table in options.read_chunks(path, mode, encoder.numeric, keep_going=True):
        keep = bad.keep(table)
        if keep is not None:
            table = _table_rows(table, keep)
        try:
            features = pre.table_features(table, encoder)
        except DataError as err:  # e.g. one column: a space-separated file read with ','
            hint = _whitespace_hint(path, table)
            if not hint:
                raise
            raise DataError(f"{err}{hint}") from None
        piece = InputFile(path, features, table.y, _ids(table, encoder))
        piece.raw = pre.raw_table(table)
        notes.see(table)
        if last is not None:
            yield last
        last = piece
    last.notes = notes.lines() + bad.lines()
    yield last


def _whitespace_hint(path: str, table) -> str:
    from slate.data.readers.delimited import whitespace_hint

    names = table.header if table.has_header else table.header[:1]
    hint = whitespace_hint(path, table.delimiter, names)
    return f"{hint[:-1]}, e.g. slate predict --delimiter whitespace." if hint else ""


def _table_rows(table, keep: np.ndarray):
    """The table's rows where ``keep`` is True (before encoding: a skipped row counts in no
    note)."""
    return dataclasses.replace(
        table,
        numeric={c: v[keep] for c, v in table.numeric.items()},
        text={c: dataclasses.replace(t, codes=t.codes[keep]) for c, t in table.text.items()},
        y=None if table.y is None else table.y[keep],
        rows=int(keep.sum()),
        first_lines=table.first_lines[keep],
        bad_cells=(),
    )


class _BadRows:
    """A file's bad rows (module docstring): refused at the first, or counted and skipped."""

    def __init__(self, path: str, mode: str) -> None:
        self.path, self.mode = path, mode
        self.count = 0
        self.first: list[BadCell] = []  # the first rows skipped, one cell each

    def keep(self, table) -> np.ndarray | None:
        """The rows of ``table`` to score (None: all of them); raises on a bad row unless
        skipping."""
        cells = table.bad_cells
        if not cells:
            return None
        if self.mode == "error":
            raise DataError(self._refusal(cells[0], table))
        lines = sorted({b.line for b in cells})
        self.count += len(lines)
        for cell in cells:
            if len(self.first) < _LISTED_LINES and all(b.line != cell.line for b in self.first):
                self.first.append(cell)
        return ~np.isin(table.first_lines, lines)

    def _refusal(self, cell: BadCell, table) -> str:
        skip = (
            "or pass --on-bad-row skip to score the other rows (a skipped row gets no prediction)."
        )
        more = len({b.line for b in table.bad_cells}) - 1
        others = f" ({more} more bad row{' follows' if more == 1 else 's follow'} in this block)"
        others = others if more else ""
        if cell.reason == "missing label":
            return (
                f"{self.path}, line {cell.line}, column {cell.column!r}: the label cell is "
                f"missing, and every row needs one to be measured{others}. Fill it in, {skip}"
            )
        if cell.column is None:
            return (
                f"{self.path}, line {cell.line}: {cell.value} cells, but {cell.reason} (as in "
                f"the header){others}. Check for a missing or extra delimiter (this file is "
                f"read with {table.delimiter!r}) or an unbalanced quote, {skip}"
            )
        return (
            f"{self.path}, line {cell.line}, column {cell.column!r}: {_what(cell)}, but the "
            f"model was trained on {cell.column!r} as a numeric column{others}. Fix the cell "
            f"(an empty or NA cell is missing, and imputed), {skip}"
        )

    def lines(self) -> list[str]:
        """The note on the skipped rows, if any."""
        if not self.count:
            return []
        listed = ", ".join(str(b.line) for b in self.first)
        more = ", ..." if self.count > len(self.first) else ""
        first = self.first[0]
        where = f"line {first.line}" + (f", column {first.column!r}" if first.column else "")
        what = _what(first) if first.column else f"{first.value} cells, {first.reason}"
        return [
            f"note: skipped {self.count} bad row{'s' if self.count != 1 else ''} of {self.path} "
            f"(--on-bad-row skip; nothing is written or measured for them), at "
            f"line{'s' if self.count != 1 else ''} {listed}{more}; the first, {where}: {what}"
        ]


def _what(cell: BadCell) -> str:
    if cell.reason == "missing label":
        return "the label cell is missing"
    if cell.reason == "out of range":
        return f"cell {cell.value!r} is a number beyond the float32 range (about +-3.4e38)"
    return f"cell {cell.value!r} is not a number"


#: The reader's note on rows without a label (one per block of rows).
_UNLABELLED = re.compile(r"^note: (\d+) of \d+ rows of .* have no label in column (.*?); ")
#: The example that ends a note on numbers in disguise (``('45%' as 45)``).
_EXAMPLE = re.compile(r" \('.*\)$")


class _TableNotes:
    """What a user should know about a whole file read in pieces, said once."""

    def __init__(self, path: str, encoder) -> None:
        self.path, self.encoder = path, encoder
        self.reader: list[str] = []
        self.keys: set[str] = set()  # the reader's notes said, without their examples
        self.unlabelled, self.label_column = 0, ""  # rows without a label, their column
        self.filled: set[str] = set()  # numeric columns with a value somewhere
        self.rows = 0
        self.columns: set[str] = set()

    def see(self, table) -> None:
        for note in table.notes:
            unlabelled = _UNLABELLED.match(note)
            if unlabelled:  # a count per block: summed over the file
                self.unlabelled += int(unlabelled.group(1))
                self.label_column = unlabelled.group(2)
                continue
            key = _EXAMPLE.sub("", note)  # a note per block, with that block's example
            if key not in self.keys:
                self.keys.add(key)
                self.reader.append(note)
        self.rows += table.rows
        self.columns = set(table.columns)
        self.filled |= {c for c, v in table.numeric.items() if (~np.isnan(v)).any()}

    def lines(self) -> list[str]:
        encoder, path = self.encoder, self.path
        lines = list(self.reader)
        if self.unlabelled:
            lines.append(
                f"note: {self.unlabelled} of {self.rows} rows of {path} have no label in column "
                f"{self.label_column}; the labels are ignored (no metrics are computed)"
            )
        lines += [
            f"note: column {c!r} of {path} holds {n} cell{'s' if n != 1 else ''} of categories "
            "training never saw; they are encoded as "
            + ("<other>" if OTHER in encoder.categories.get(c, ()) else "all zeros")
            for c, n in sorted(encoder.unseen.items())
            if c in encoder.categories
        ]
        lines += [
            f"note: column {c!r} of {path} is empty in every row; it is imputed with the "
            f"training mean ({encoder.means[c]:.6g})"
            for c in encoder.numeric
            if self.rows and c in self.columns and c not in self.filled
        ]
        lines += [
            f"note: {path} has no ID column {c!r}; it is left out"
            for c in encoder.choice.id_columns
            if c not in self.columns
        ]
        return lines


def _ids(table, encoder) -> dict[str, list[str]]:
    """The run's ID columns of ``table``, as text, for the predictions."""
    ids = {}
    for column in encoder.choice.id_columns:
        if column in table.numeric:
            ids[column] = [_number_text(v) for v in table.numeric[column]]
        elif column in table.text:
            col = table.text[column]
            names = [*col.categories, ""]
            ids[column] = [names[c] for c in col.codes]
    return ids


def _read_table(
    pre: Preprocessing, path: str, labels: str, on_bad_row: str, delimiter: str | None
) -> InputFile:
    """The whole table: its pieces joined."""
    pieces = list(_table_chunks(pre, path, labels, on_bad_row, delimiter))
    joined = InputFile(
        path,
        np.concatenate([p.features for p in pieces]),
        None if any(p.labels is None for p in pieces) else np.concatenate(
            [p.labels for p in pieces]),
        {c: [v for p in pieces for v in p.ids[c]] for c in pieces[0].ids},
        notes=pieces[-1].notes,
    )  # fmt: skip
    joined.raw = np.concatenate([p.raw for p in pieces])
    return joined


def _number_text(value: float) -> str:
    if math.isnan(value):
        return ""
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _rows(features: np.ndarray) -> Tensor:
    return torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))


def logits_of(model: nn.Module, features: np.ndarray, chunk: int = CHUNK) -> Tensor:
    """The model's logits on ``features`` (float32, CPU), in forward passes of ``chunk`` rows
    aligned to the rows' indices, the last padded, as in training
    (:func:`slate.models.passes.forward_in_chunks`)."""
    model.eval()
    with torch.no_grad():
        return forward_in_chunks(model, _rows(features), chunk).reshape(-1)


class PieceScorer:
    """:func:`logits_of` over a file read in pieces (:func:`iter_input`): the passes are
    aligned to the indices of the rows scored, not to the pieces, so a row gets the same logit
    however the file is cut, and whichever bad rows around it are skipped."""

    def __init__(self, model: nn.Module, chunk: int = CHUNK) -> None:
        model.eval()
        self._scorer = ChunkedScorer(model, chunk)

    def add(self, features: np.ndarray) -> None:
        with torch.no_grad():
            self._scorer.add(_rows(features))

    def finish(self) -> Tensor:
        with torch.no_grad():
            return self._scorer.finish().reshape(-1)
