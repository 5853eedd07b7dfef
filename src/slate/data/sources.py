"""Where a run's data comes from, from the file to the parties' tensors: the one data line.

Every run follows the same line:

1. **read** into shards (:class:`~slate.data.parts.Shard`): a whole dataset (the named sets of
   :mod:`slate.data.datasets`, a user's ``--train``/``--test`` file, or a preloaded
   :class:`Dataset`) is one shard; per-party files are one shard per party
   (:mod:`slate.data.party_files`). A held-out part is split off where no test file is given
   (:func:`slate.data.parts.hold_out`);
2. **agree** on one transform and fit it, the only fit, on training rows only
   (:func:`slate.data.line.agree`: with per-party files through the engine's exchange, after the
   parties' schemas were compared);
3. **cut** the shards into the rows of this process's parties (:func:`slate.data.line.cut`), a
   :class:`LocalData`.

Both entry points, :func:`load_dataset` (the whole dataset) and :func:`load_local_data` (this
process's parties), start here, and take a :class:`~slate.data.spec.DataSpec` (a run passes its
data section; a caller holding only a configuration may pass that, and the spec is built here).
Two sources:

* **Partitioned** (the paper's experiments): every process loads the whole dataset, cuts the
  seeded partition and keeps its own parties' rows. The test set is the whole test set, scored
  as one pool.
* **Per-party files** (a deployment): party ``n`` reads only ``--train`` (and ``--test``) with
  ``{rank}`` replaced by ``n``, or, when started alone with ``--rank``, the files on its own
  command line. The simulator takes the same files, reading every party's in one process.

With ``--validation-fraction F`` a seeded stratified share ``F`` of the training rows is held out
as validation rows (of each party's own rows, with per-party files), scored during training; the
test rows are set aside and read only by :attr:`LocalData.final_test`, once training is over.
"""

from __future__ import annotations

import time
from typing import Any

from slate.data.datasets import Dataset
from slate.data.line import agree, local_data
from slate.data.local_data import Exchange, LocalData
from slate.data.parts import Part
from slate.data.party_files import read_party_files
from slate.data.spec import DataSpec
from slate.data.whole import preloaded, read_whole, validated
from slate.errors import ConfigError

__all__ = [
    "load_dataset",
    "load_local_data",
    "validation_split",
]


def load_local_data(
    source: DataSpec | Any,
    local_parties: list[int],
    exchange: Exchange,
    dataset: Dataset | None = None,
) -> LocalData:
    """The data of ``local_parties``, from the source the spec names, or from ``dataset`` read
    before (module docstring). ``source`` is a :class:`DataSpec` or a configuration."""
    spec = _spec(source)
    if spec.per_party:
        if dataset is not None:
            raise ConfigError("Per-party files cannot be combined with a preloaded dataset.")
        shards, options = read_party_files(spec, local_parties)
    elif dataset is None:
        shard, options = read_whole(spec, spec.validation_fraction, spec.split_seed)
        shards = [shard]
    else:
        shards, options = [preloaded(dataset)], None
    return local_data(spec, shards, exchange, options, local_parties)


def _spec(source: DataSpec | Any) -> DataSpec:
    """``source`` itself when it is a spec (a run's data section), else the spec built from
    that configuration (:meth:`DataSpec.of`)."""
    return source if isinstance(source, DataSpec) else DataSpec.of(source)


# --------------------------------------------------------------------------- the whole dataset


def load_dataset(
    source: DataSpec | Any, validation: float | None = None, validation_seed: int = 0
) -> Dataset:
    """The whole dataset the spec (or configuration) ``source`` names, read and split, checked
    to hold both classes in both parts. User tables come encoded, with the encoder fitted on the
    training part (:func:`slate.data.line.agree`); arrays come as read, before any scaling.

    With ``validation`` (a fraction) the held-out rows are a seeded stratified share of the
    training rows, and the test rows are set aside (``Dataset.final_test``; a user's test file
    is read only when that is called).
    """
    started = time.perf_counter()
    spec = _spec(source)
    shard, options = read_whole(spec, validation, validation_seed)
    encoder, notes = None, list(shard.notes)
    if options is not None:  # a table becomes features only through its encoder
        agreement = agree(spec, [shard], None, options)
        encoder, notes = agreement.transform, notes + agreement.notes
    later = shard.later
    data = Dataset(
        shard.name, shard.train.features(encoder), shard.train.labels,
        shard.held.features(encoder), shard.held.labels, shard.held_split, encoder=encoder,
        notes=notes, held_out=shard.held_out,
        final_test=None if later is None else lambda: _rows(later(), encoder),
        final_test_split=shard.test_split if later is not None else "",
    )  # fmt: skip
    data.read_seconds = time.perf_counter() - started
    return data


def _rows(part: Part, encoder: Any) -> tuple[Any, Any]:
    return part.features(encoder), part.labels


def validation_split(data: Dataset, fraction: float, seed: int, keep_test: bool = False) -> Dataset:
    """``data`` with its held-out rows replaced by a seeded stratified share ``fraction`` of its
    training rows (:func:`slate.data.parts.hold_out`); with ``keep_test`` the test rows stay
    available as ``final_test``. Unencoded features only: an encoder fitted before the split
    would have seen the validation rows (CSV tables are split before encoding)."""
    if data.encoder is not None:
        raise ValueError(
            "validation_split needs unencoded features; for a table use tuning_data or "
            "load_dataset(config, validation=...), which split it before encoding."
        )
    shard = validated(preloaded(data), fraction, seed, "the training set")
    final = None
    if keep_test:
        later = shard.later
        final = lambda: _rows(later(), None)  # noqa: E731
    return Dataset(
        data.name, shard.train.x, shard.train.y, shard.held.x, shard.held.y, shard.held_split,
        notes=list(data.notes), held_out="validation", parts=None, final_test=final,
        final_test_split=shard.test_split if keep_test else "",
    )  # fmt: skip
