"""The data line: a run's config reaches the data modules once, in one direction.

The profiler records every call into a ``slate.data`` module that takes the run's ``config`` (or
the :class:`~slate.data.spec.DataSpec` or ``options`` built from it) and comes from another
module. Each module may be entered at most twice: the run builds the spec once and passes it to
:mod:`slate.data.sources`, the one orchestrator, which builds
:class:`~slate.data.options.TableOptions` once.
"""

from __future__ import annotations

import collections
import sys

import numpy as np
import pytest

from slate.config import TrainConfig
from slate.training.loop import train


def _write(path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["a,b,city,y"]
    for _ in range(rows):
        y = int(rng.random() < 0.2)
        b = "" if rng.random() < 0.05 else f"{rng.normal() * 100:.3f}"
        lines.append(f"{rng.normal() + y:.4f},{b},{rng.choice(['x', 'y', 'z'])},{y}")
    path.write_text("\n".join(lines) + "\n")


def _entries(config: TrainConfig, **options) -> collections.Counter:
    entries: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "")
        arguments = frame.f_code.co_varnames[: frame.f_code.co_argcount]
        carries = bool({"config", "spec", "source", "options"} & set(arguments))
        if module.startswith("slate.data") and module != caller and carries:
            entries[module] += 1

    sys.setprofile(profile)
    try:
        train(config, write=False, progress=False, log=lambda _: None, **options)
    finally:
        sys.setprofile(None)
    return entries


@pytest.mark.parametrize("per_party", [False, True])
def test_a_csv_run_enters_each_data_module_at_most_twice(tmp_path, per_party):
    for rank in range(3):
        _write(tmp_path / f"p{rank}.csv", 200, rank)
    train_file = tmp_path / ("p{rank}.csv" if per_party else "p0.csv")
    config = TrainConfig(
        dataset="csv", train=str(train_file), label_column="y", positive_label="1",
        nodes=3, iterations=10, eval_every=10, lr=0.01,  # --lr auto trains 5 more short runs
    )  # fmt: skip
    entries = _entries(config)
    assert entries["slate.data.sources"] == 1  # the one orchestrator, entered from the run
    assert entries["slate.data.options"] == 1  # the options are built once
    assert entries["slate.data.spec"] <= 2  # the spec is built once (and passed as it is)
    assert max(entries.values()) <= 2, entries


def test_a_table_run_choosing_n_and_its_step_size_enters_each_data_module_at_most_3_times(
    tmp_path,
):
    """N from the table's positives, then ``--lr auto``'s five candidates, then the run: the
    table is read once, the candidates share one cut of their rows, and the run cuts its own."""
    _write(tmp_path / "t.csv", 300, 0)
    config = TrainConfig(dataset="csv", train=str(tmp_path / "t.csv"), label_column="y",
                         positive_label="1", iterations=10, eval_every=10)  # fmt: skip
    entries = _entries(config, parties_from_data=True)
    assert entries["slate.data.sources"] == 3  # the table, the candidates' rows, the run's rows
    assert max(entries.values()) <= 3, entries
