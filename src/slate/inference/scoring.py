r"""Reading a file for a trained model, and scoring it: what ``predict``, ``evaluate`` and
``calibrate`` share.

A file is read the way the run read its data (``model.json``'s ``input``), through the run's
preprocessing (:class:`slate.inference.model_file.Preprocessing`), and scored with the averaged
model in eval mode, in the same chunks of rows as the run's own evaluation, so that the run's test
file gives the same logits as training reported. Formats: see :mod:`slate.inference.predict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from slate.data.encoding import OTHER
from slate.errors import DataError
from slate.inference.model_file import Preprocessing

__all__ = ["CHUNK", "InputFile", "iter_input", "logits_of", "read_input"]

CHUNK = 256  # rows per forward pass: slate.engines.compute.EVAL_CHUNK, as in training


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
    preprocessing: Preprocessing, path: str | Path, labels: str = "optional", run: str = "the run"
) -> InputFile:
    """Read ``path`` as the run read its data and prepare the model input.

    Args:
        preprocessing: the run's, from :func:`slate.inference.model_file.load_model`.
        path: the file (or image folder).
        labels: ``"optional"`` (predict) or ``"required"`` (evaluate, calibrate).
        run: the run folder, named in errors.

    Raises:
        DataError: the file cannot be read, or its features do not fit the model (a feature
            index above the model's width, columns missing, images of another shape), or
            ``labels="required"`` and it holds none.
    """
    path = str(path)
    kind = preprocessing.input.get("format")
    if kind == "csv":
        read = _read_table(preprocessing, path, labels)
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
    preprocessing: Preprocessing, path: str | Path, labels: str = "optional", run: str = "the run"
) -> Iterator[InputFile]:
    """:func:`read_input` in pieces: a CSV file one block of rows at a time (its notes, about
    the whole file, come with the last piece), any other file whole."""
    if preprocessing.input.get("format") != "csv":
        yield read_input(preprocessing, path, labels, run)
        return
    yield from _table_chunks(preprocessing, str(path), labels)


def _table_chunks(pre: Preprocessing, path: str, labels: str) -> Iterator[InputFile]:
    """A table's pieces, read and encoded with the model's column kinds (``model.json``): the
    model's text columns are read as text whatever this file's cells look like (a one-row file
    with an empty cell, codes that look numeric)."""
    from slate.data.options import TableOptions

    encoder = pre.encoder
    encoder.unseen.clear()  # counted per file
    saved = TableOptions.from_saved(pre.input)
    forced = [c for c in encoder.text if c not in saved.categorical_columns]
    options = dataclasses.replace(saved, categorical_columns=(*saved.categorical_columns, *forced))
    mode = "single_class_ok" if labels == "required" else "optional"
    notes = _TableNotes(path, encoder)
    last = None
    for table in options.read_chunks(path, labels=mode):
        piece = InputFile(path, pre.table_features(table, encoder), table.y, _ids(table, encoder))
        piece.raw = pre.raw_table(table)
        notes.see(table)
        if last is not None:
            yield last
        last = piece
    last.notes = notes.lines()
    yield last


class _TableNotes:
    """What a user should know about a whole file read in pieces, said once."""

    def __init__(self, path: str, encoder) -> None:
        self.path, self.encoder = path, encoder
        self.reader: list[str] = []
        self.filled: set[str] = set()  # numeric columns with a value somewhere
        self.rows = 0
        self.columns: set[str] = set()

    def see(self, table) -> None:
        self.reader += [n for n in table.notes if n not in self.reader]
        self.rows += table.rows
        self.columns = set(table.columns)
        self.filled |= {c for c, v in table.numeric.items() if (~np.isnan(v)).any()}

    def lines(self) -> list[str]:
        encoder, path = self.encoder, self.path
        lines = list(self.reader)
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


def _read_table(pre: Preprocessing, path: str, labels: str) -> InputFile:
    """The whole table: its pieces joined."""
    pieces = list(_table_chunks(pre, path, labels))
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


def logits_of(model: nn.Module, features: np.ndarray, chunk: int = CHUNK) -> Tensor:
    """The model's logits on ``features`` (float32, CPU), in chunks of rows as in training."""
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    model.eval()
    with torch.no_grad():
        if len(x) == 0:
            return torch.zeros(0)
        return torch.cat([model(x[i : i + chunk]) for i in range(0, len(x), chunk)]).reshape(-1)
