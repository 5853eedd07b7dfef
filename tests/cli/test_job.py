"""The job file: ``slate job init`` writes every agreed setting once, with its help; ``slate
train --job`` takes them from it and only a site's own flags from the command line; a
malformed file, an agreed flag beside it and two sites with different files are refused, each
in one paragraph."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pytest

from slate.cli.commands import config_from_args, given_flags
from slate.cli.job_command import with_job
from slate.cli.job_file import agreed_settings, job_digest, read_job
from slate.cli.parser import build_parser
from slate.config import TrainConfig, resolve_config
from slate.training.agreement import RunMismatch, check_same_run
from tests.sites import (
    HAVE_W7A,
    finish,
    free_port,
    identity_flags,
    make_roster,
    serve,
    slate_here,
    start_party,
    write_sites,
)

AGREED = ["--lr", "0.05", "--iterations", "40", "--nodes", "2", "--compress", "topk:0.1",
          "--feature-range", "-1", "1", "--no-standardize", "--gradient-tracking",
          "--momentum", "ema", "--seed", "3", "--consensus-step", "0.5"]  # fmt: skip
OWN = ["--dataset", "libsvm", "--train", "train.svm", "--test", "test.svm", "--out", "run",
       "--features", "300", "--threads", "1", "--no-plots"]  # fmt: skip


def _init(path: Path, *flags: str) -> str:
    done = slate_here("job", "init", *flags, "--out", str(path))
    assert done.returncode == 0, done.stderr
    return path.read_text()


def _config(argv: list[str]) -> TrainConfig:
    """The TrainConfig that ``slate train ARGV`` runs with (its job file applied)."""
    args = build_parser().parse_args(["train", *argv])
    config = config_from_args(args)
    return with_job(config, args.job, given_flags(["train", *argv])) if args.job else config


def test_init_writes_every_agreed_key_once_with_its_help(tmp_path):
    text = _init(tmp_path / "job.toml", *AGREED)
    lines = text.splitlines()
    for setting in agreed_settings():
        found = [i for i, line in enumerate(lines) if re.match(rf"(# )?{setting.dest} = ", line)]
        assert len(found) == 1, setting.dest
        assert lines[found[0] - 1].startswith("# "), setting.dest  # its help above it
    assert "# --lr: step size eta, or 'auto'" in text and "on 20% of" in text
    data = tomllib.loads(text)
    assert data["lr"] == 0.05 and data["compress"] == "topk:0.1" and data["standardize"] is False
    assert data["feature_range"] == [-1.0, 1.0] and "iterations" in data
    assert "margin" not in data  # unset: commented out, the dataset's default at every site


def test_an_existing_job_file_is_never_replaced(tmp_path):
    path = tmp_path / "job.toml"
    before = _init(path, "--lr", "0.05")
    done = slate_here("job", "init", "--lr", "0.5", "--out", str(path))
    assert done.returncode == 2 and "exists already" in done.stderr
    assert "never replaces" in done.stderr and "Traceback" not in done.stderr
    assert path.read_text() == before


def test_the_job_and_a_site_s_flags_give_the_config_of_the_full_flag_line(tmp_path):
    path = tmp_path / "job.toml"
    _init(path, *AGREED)
    full = _config([*AGREED, *OWN])
    from_job = _config(["--job", str(path), *OWN])
    assert from_job.job_sha256 == job_digest(read_job(path))
    assert dataclasses.replace(from_job, job_sha256=None) == full
    assert resolve_config(dataclasses.replace(from_job, job_sha256=None)) == resolve_config(full)


def test_the_digest_ignores_comments_order_and_written_defaults(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    _init(a, "--lr", "0.05")
    b.write_text('# another comment\nseed = 0\nlr = 0.05\nalgorithm = "slate"\n')
    assert job_digest(read_job(a)) == job_digest(read_job(b))
    b.write_text("lr = 0.06\n")
    assert job_digest(read_job(a)) != job_digest(read_job(b))


def test_an_agreed_flag_beside_the_job_is_refused_naming_it(tmp_path):
    path = tmp_path / "job.toml"
    _init(path, "--lr", "0.05")
    done = slate_here("train", "--job", str(path), "--lr", "0.1", "--seed", "2", "--rank", "0")
    assert done.returncode == 2, done.stderr
    assert "it also gives --lr, --seed" in done.stderr and str(path) in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ('lr = "fast"\n', ["lr (line 1)", 'a number or "auto"']),
        ("seed = 1\niterations = 1.5\n", ["iterations (line 2)", "an integer"]),
        ('compile = "sometimes"\n', ["compile (line 1)", 'one of "auto", "on", "off"']),
        ("feature_range = [1]\n", ["feature_range (line 1)", "a list of 2 numbers"]),
        ("bogus = 1\n", ["bogus (line 1) is no setting of slate train"]),
        ('train = "x.svm"\n', ["train (line 1) is this site's own", "give --train"]),
        ("lr = \n", ["not valid TOML", "line 1"]),
    ],
)
def test_a_malformed_job_names_the_file_and_the_key(tmp_path, content, named):
    path = tmp_path / "job.toml"
    path.write_text(content)
    done = slate_here("train", "--job", str(path), "--rank", "0", "--rendezvous", "x:1")
    assert done.returncode == 2, done.stderr
    assert f"--job {path}" in done.stderr and "Traceback" not in done.stderr
    for text in named:
        assert text in done.stderr
    assert done.stderr.count("\n") == 1  # one paragraph


def test_a_run_from_a_job_file_records_its_digest(tmp_path):
    path = tmp_path / "job.toml"
    _init(path, "--nodes", "3", "--iterations", "10", "--eval-every", "5")
    out = tmp_path / "run"
    done = slate_here("train", "--job", str(path), "--out", str(out), "--no-plots", "--no-progress")
    assert done.returncode == 0, done.stderr
    config = json.loads((out / "summary.json").read_text())["config"]
    assert config["job_sha256"] == job_digest(read_job(path))
    assert config["iterations"] == 10 and config["nodes"] == 3


def test_the_agreement_names_the_keys_of_another_job_file():
    ours = {"lr": 0.05, "seed": 3, "job_sha256": "a" * 64, "roster": None}
    theirs = {**ours, "lr": 0.5, "job_sha256": "b" * 64}
    with pytest.raises(RunMismatch) as caught:
        check_same_run([(0, ours), (1, theirs)])
    message = str(caught.value)
    assert "different job files" in message and "party 1's job file" in message
    assert "lr 0.5 against 0.05" in message and "seed" not in message


def _short_command(roster: Path, rank: int) -> list[str]:
    """A site's flags beside ``--rank`` and ``--rendezvous``: the job file, its identity, the
    external store and its own files and folder."""
    return ["--job", "job.toml", *identity_flags(roster, rank), "--external-store", *OWN,
            "--timeout", "20", "--no-progress"]  # fmt: skip


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_two_sites_run_from_one_job_file_with_the_short_command(tmp_path):
    """The same job file at both sites, each command giving only the site's own flags."""
    write_sites(tmp_path, parties=2)
    roster = make_roster(tmp_path, 2)
    for r in range(2):
        _init(tmp_path / f"site{r}" / "job.toml", "--nodes", "2", "--iterations", "20")
    port = free_port()
    server = serve(port, "--roster", str(roster), "--linger", "0")
    try:
        sites = [start_party(tmp_path, r, port, *_short_command(roster, r)) for r in range(2)]
        for code, output in finish(sites, timeout=50):
            assert code == 0, output
    finally:
        server.kill()
        server.communicate()
    digests = {
        json.loads((tmp_path / f"site{r}" / "run" / "summary.json").read_text())["config"][
            "job_sha256"
        ]
        for r in range(2)
    }
    assert digests == {job_digest(read_job(tmp_path / "site0" / "job.toml"))}


@pytest.mark.processes
@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_two_sites_with_different_job_files_are_refused_naming_the_key(tmp_path):
    """Each site runs the short command: its job file, identity, rendezvous and own files;
    site 1's job file has another --lr, so both stop before step 1 naming lr."""
    write_sites(tmp_path, parties=2)
    roster = make_roster(tmp_path, 2)
    for r, lr in enumerate(("0.05", "0.1")):
        _init(tmp_path / f"site{r}" / "job.toml", "--nodes", "2", "--iterations", "20", "--lr", lr)
    port = free_port()
    server = serve(port, "--roster", str(roster), "--linger", "0")
    try:
        sites = [start_party(tmp_path, r, port, *_short_command(roster, r)) for r in range(2)]
        for code, output in finish(sites, timeout=50):
            assert code == 2, output
            assert "different job files" in output and "in lr: lr 0.1 against 0.05" in output
    finally:
        server.kill()
        server.communicate()
    assert not list(tmp_path.rglob("model.pt"))
