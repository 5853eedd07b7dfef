"""Scoring a CSV file with bad rows (slate predict / evaluate on real files).

A bad cell names the file, line, column and value, with a non-zero exit and no traceback;
``--on-bad-row skip`` scores the other rows (nothing is written for a skipped row) and says how
many were skipped and where; notes about a file come once however many blocks it is read in;
a space-separated file read with the run's delimiter is told about ``--delimiter whitespace``.
Every count and line number is checked against the files these tests write.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from slate.cli import main
from slate.config import TrainConfig
from slate.data.readers.blocks import block_rows
from slate.training.loop import train

HEADER = ["id", "sex", "length", "weight", "share", "visit", "rings"]


def _rows(n: int, rng: np.random.Generator) -> list[list[str]]:
    """``n`` rows with ids 0..n-1: each column drawn for all rows at once (three blocks of rows
    drawn row by row cost about 2 s of CPU)."""
    length = rng.normal(size=n)
    old = length + rng.normal(scale=0.5, size=n) > 0.8
    sex = rng.choice(["M", "F", "I"], size=n)
    weight, share = rng.normal(size=n), rng.uniform(0, 100, size=n)
    month, day = rng.integers(1, 13, size=n), rng.integers(1, 29, size=n)
    columns = zip(sex.tolist(), length.tolist(), weight.tolist(), share.tolist(),
                  month.tolist(), day.tolist(), old.tolist(), strict=True)  # fmt: skip
    return [
        [str(k), s, f"{a:.4f}", f"{w:.4f}", f"{p:.1f}%", f"2024-{m:02d}-{d:02d}",
         "old" if o else "young"]
        for k, (s, a, w, p, m, d, o) in enumerate(columns)
    ]  # fmt: skip


def _write(path: Path, rows: list[list[str]], delimiter: str = ",") -> None:
    path.write_text("\n".join(delimiter.join(r) for r in [HEADER, *rows]) + "\n")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run on a table with a text column, numeric ones, percentages and ISO dates."""
    where = tmp_path_factory.mktemp("bad_rows")
    rng = np.random.default_rng(0)
    _write(where / "train.csv", _rows(400, rng))
    config = TrainConfig(
        dataset="csv", train=str(where / "train.csv"), label_column="rings",
        positive_label="old", id_columns=("id",), nodes=2, iterations=30, threads=1,
        party_ap=False, out=str(where / "run"),
    )  # fmt: skip
    threads = torch.get_num_threads()
    try:
        train(config, progress=False, figures=False, log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    info = json.loads((where / "run" / "model.json").read_text())
    table = next(s for s in info["preprocessing"] if s["kind"] == "table")
    assert {"length", "weight", "share", "visit"} <= set(table["numeric"])
    return where / "run"


@pytest.fixture(scope="module")
def rows() -> list[list[str]]:
    """Three blocks of rows and more (the reader's block for 7 columns)."""
    rng = np.random.default_rng(1)
    return _rows(3 * block_rows(len(HEADER)) + 500, rng)


def _predict(run: Path, data: Path, out: Path, capsys, *flags: str):
    capsys.readouterr()
    code = main(["predict", "--run", str(run), "--data", str(data), "--out", str(out), *flags])
    return code, capsys.readouterr()


def _scores(path: Path) -> dict[str, str]:
    with open(path, newline="") as handle:
        return {r["id"]: r["score"] for r in csv.DictReader(handle)}


def _spoil(rows: list[list[str]], where: dict[int, tuple[int, str]]) -> list[list[str]]:
    """A copy of ``rows`` with cell ``column`` of row ``k`` set to ``value``."""
    spoilt = [list(r) for r in rows]
    for k, (column, value) in where.items():
        spoilt[k][column] = value
    return spoilt


def _line(k: int) -> int:
    return k + 2  # the header is line 1


def test_a_bad_cell_names_the_file_line_column_and_value(run, rows, tmp_path, capsys):
    k = 2 * block_rows(len(HEADER)) + 17  # in the third block, alone among numbers there
    _write(tmp_path / "bad.csv", _spoil(rows, {k: (3, "12.5kg")}))
    for command in ("predict", "evaluate"):
        capsys.readouterr()
        assert main([command, "--run", str(run), "--data", str(tmp_path / "bad.csv")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(
            f"slate: error: {tmp_path / 'bad.csv'}, line {_line(k)}, column 'weight': cell "
            "'12.5kg' is not a number, but the model was trained on 'weight' as a numeric column"
        )
        assert "--on-bad-row skip" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1


def test_skip_scores_the_rest_and_reports_the_count_and_lines(run, rows, tmp_path, capsys):
    block = block_rows(len(HEADER))
    spoilt = {5: (2, "n/a?"), block + 3: (4, "lots%"), block + 4: (5, "2024-13-45"),
              2 * block + 1: (3, "1e39"), 2 * block + 9: (2, "ten")}  # fmt: skip
    _write(tmp_path / "bad.csv", _spoil(rows, spoilt))
    kept = [r for k, r in enumerate(rows) if k not in spoilt]
    _write(tmp_path / "clean.csv", kept)
    code, printed = _predict(run, tmp_path / "bad.csv", tmp_path / "bad_scores.csv", capsys,
                             "--on-bad-row", "skip")  # fmt: skip
    assert code == 0, printed.err
    lines = sorted(_line(k) for k in spoilt)
    notes = [n for n in printed.out.splitlines() if n.startswith("note: skipped")]
    assert notes == [
        f"note: skipped 5 bad rows of {tmp_path / 'bad.csv'} (--on-bad-row skip; nothing is "
        f"written or measured for them), at lines {', '.join(map(str, lines))}; the first, "
        f"line {lines[0]}, column 'length': cell 'n/a?' is not a number"
    ]
    assert f"{len(rows) - 5} predictions written" in printed.out
    assert _main_ok(run, tmp_path / "clean.csv", tmp_path / "clean_scores.csv", capsys)
    # The other rows score exactly as in a file without the bad rows (guaranteed: they pass
    # through the model in the same passes of 256, aligned to the rows scored).
    assert _scores(tmp_path / "bad_scores.csv") == _scores(tmp_path / "clean_scores.csv")

    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--data", str(tmp_path / "bad.csv"), "--json",
                 "--on-bad-row", "skip"]) == 0  # fmt: skip
    skipped = json.loads(capsys.readouterr().out)
    assert (
        main(["evaluate", "--run", str(run), "--data", str(tmp_path / "clean.csv"), "--json"]) == 0
    )
    clean = json.loads(capsys.readouterr().out)
    assert skipped["rows"] == len(rows) - 5
    assert skipped["ap"] == clean["ap"] and skipped["positives"] == clean["positives"]


def _main_ok(run: Path, data: Path, out: Path, capsys) -> bool:
    code, printed = _predict(run, data, out, capsys)
    assert code == 0, printed.err
    return True


def test_a_row_with_the_wrong_number_of_cells(run, rows, tmp_path, capsys):
    spoilt = [list(r) for r in rows[:300]]
    spoilt[40].append("extra")
    spoilt[41] = spoilt[41][:3]
    _write(tmp_path / "ragged.csv", spoilt)
    code, printed = _predict(run, tmp_path / "ragged.csv", tmp_path / "s.csv", capsys)
    assert code == 2
    assert printed.err.startswith(
        f"slate: error: {tmp_path / 'ragged.csv'}, line {_line(40)}: 8 cells, but 7 cells "
        "expected (as in the header) (1 more bad row follows in this block)"
    )
    assert "--on-bad-row skip" in printed.err and "Traceback" not in printed.err
    code, printed = _predict(run, tmp_path / "ragged.csv", tmp_path / "s.csv", capsys,
                             "--on-bad-row", "skip")  # fmt: skip
    assert code == 0, printed.err
    assert f"skipped 2 bad rows of {tmp_path / 'ragged.csv'}" in printed.out
    assert f"at lines {_line(40)}, {_line(41)};" in printed.out
    assert len(_scores(tmp_path / "s.csv")) == 298


def test_notes_come_once_per_file(run, rows, tmp_path, capsys):
    """A category training never saw, and percentages whose first example differs per block,
    in every block: one note each, with the file's whole count."""
    spoilt = [list(r) for r in rows]
    block = block_rows(len(HEADER))
    unseen = [3, block + 5, 2 * block + 7, 3 * block + 9]
    for k in unseen:
        spoilt[k][1] = "Q"
    for b in range(4):  # each block's first percentage differs
        spoilt[b * block][4] = f"{b + 1}.5%"
    _write(tmp_path / "many.csv", spoilt)
    code, printed = _predict(run, tmp_path / "many.csv", tmp_path / "s.csv", capsys)
    assert code == 0, printed.err
    notes = [n for n in printed.out.splitlines() if n.startswith("note")]
    name = tmp_path / "many.csv"
    assert len(notes) == 3, notes
    assert notes[0] == (
        f"note: column 'share' of {name} holds numbers written with '%'; read as numbers "
        "('1.5%' as 1.5)"
    )
    assert notes[1].startswith(f"note: column 'visit' of {name} holds ISO dates")
    assert notes[2].startswith(
        f"note: column 'sex' of {name} holds 4 cells of categories training never saw"
    )


def test_a_space_separated_file_is_told_about_the_flag(run, rows, tmp_path, capsys):
    _write(tmp_path / "spaces.txt", rows[:50], delimiter="   ")
    code, printed = _predict(run, tmp_path / "spaces.txt", tmp_path / "s.csv", capsys)
    assert code == 2 and "Traceback" not in printed.err
    assert "looks separated by spaces or tabs" in printed.err
    assert "--delimiter whitespace" in printed.err
    code, printed = _predict(run, tmp_path / "spaces.txt", tmp_path / "s.csv", capsys,
                             "--delimiter", "whitespace")  # fmt: skip
    assert code == 0, printed.err
    _write(tmp_path / "commas.csv", rows[:50])
    assert _main_ok(run, tmp_path / "commas.csv", tmp_path / "c.csv", capsys)
    assert _scores(tmp_path / "s.csv") == _scores(tmp_path / "c.csv")


def test_evaluate_skips_rows_without_a_label(run, rows, tmp_path, capsys):
    block = block_rows(len(HEADER))
    unlabelled = {12: "", block + 2: "?"}
    spoilt = [list(r) for r in rows[: block + 100]]
    for k, cell in unlabelled.items():
        spoilt[k][6] = cell
    _write(tmp_path / "unlabelled.csv", spoilt)
    _write(tmp_path / "labelled.csv", [r for k, r in enumerate(spoilt) if k not in unlabelled])
    data = str(tmp_path / "unlabelled.csv")
    capsys.readouterr()
    assert main(["evaluate", "--run", str(run), "--data", data]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"slate: error: {data}, line {_line(12)}, column 'rings': the label cell is missing"
    )
    assert main(["evaluate", "--run", str(run), "--data", data, "--json",
                 "--on-bad-row", "skip"]) == 0  # fmt: skip
    printed = capsys.readouterr()
    skipped = json.loads(printed.out)
    assert f"skipped 2 bad rows of {data}" in printed.err
    assert f"at lines {_line(12)}, {_line(block + 2)};" in printed.err
    assert main(["evaluate", "--run", str(run), "--data", str(tmp_path / "labelled.csv"),
                 "--json"]) == 0  # fmt: skip
    clean = json.loads(capsys.readouterr().out)
    assert skipped["rows"] == clean["rows"] == len(spoilt) - 2
    assert skipped["ap"] == clean["ap"]
