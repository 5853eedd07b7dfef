"""tests/spawned.py: ranks forked from the preloaded server give what torch's spawned
interpreters give for a gloo all_reduce, a failing rank's traceback is reported with its rank,
and a hung rank is killed at the timeout."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing import ProcessRaisedException

from tests import forked, spawned

pytestmark = pytest.mark.processes

WORLD = 3


def _all_reduce(rank: int, init: str, folder: str) -> None:
    """Each rank's own values summed over a gloo group; each rank saves the sum, its pid, what
    it inherited, and whether slate's training loop was loaded before ``fn`` ran (it is in the
    forkserver, not in a fresh interpreter)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    value = torch.randn(17, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    dist.all_reduce(value)
    saved = {"sum": value, "pid": os.getpid(), "variable": os.environ.get("SPAWNED_TEST"),
             "folder": os.getcwd(), "preloaded": "slate.training.loop" in sys.modules}  # fmt: skip
    torch.save(saved, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def _results(folder) -> list[dict]:
    return [torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_forked_ranks_give_what_spawned_interpreters_give(tmp_path, monkeypatch):
    monkeypatch.setenv("SPAWNED_TEST", "seen")
    monkeypatch.chdir(tmp_path)
    runs = {}
    for way, fresh in (("fork", ""), ("spawn", "1")):
        monkeypatch.setenv(forked.FRESH, fresh)
        (tmp_path / way).mkdir()
        init = f"file://{tmp_path / way / 'store'}"
        spawned.spawn(_all_reduce, (init, str(tmp_path / way)), nprocs=WORLD, timeout=120)
        runs[way] = _results(tmp_path / way)
    for fork, spawn in zip(runs["fork"], runs["spawn"], strict=True):
        assert torch.equal(fork["sum"], spawn["sum"])
        assert fork["variable"] == spawn["variable"] == "seen"
        assert fork["folder"] == spawn["folder"] == str(tmp_path)
        assert fork["preloaded"] and not spawn["preloaded"]  # (a fork of the server, and not)
    assert torch.equal(runs["fork"][0]["sum"], runs["fork"][2]["sum"])
    assert len({r["pid"] for run in runs.values() for r in run} | {os.getpid()}) == 2 * WORLD + 1


def _fails_at_rank_1(rank: int, marker: str) -> None:
    if rank == 1:
        raise ValueError(f"rank {rank} gave up")
    time.sleep(60)  # stopped when rank 1 fails
    open(marker, "w").close()  # (never reached)


def test_a_failing_ranks_traceback_is_reported_and_the_others_are_stopped(tmp_path):
    started = time.monotonic()
    with pytest.raises(ProcessRaisedException) as raised:
        spawned.spawn(_fails_at_rank_1, (str(tmp_path / "marker"),), nprocs=3, timeout=120)
    assert raised.value.error_index == 1
    text = str(raised.value)
    assert "Traceback (most recent call last)" in text and "_fails_at_rank_1" in text
    assert "ValueError: rank 1 gave up" in text
    assert time.monotonic() - started < 30
    assert not (tmp_path / "marker").exists()


def _hangs_at_rank_2(rank: int) -> None:
    if rank == 2:
        time.sleep(600)


def test_a_hung_rank_is_killed_at_the_timeout():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[2\] of 3 still running after 2 s"):
        spawned.spawn(_hangs_at_rank_2, nprocs=3, timeout=2)
    assert time.monotonic() - started < 2 + spawned.GRACE_S + 10


def test_a_variable_read_at_start_makes_fresh_interpreters(monkeypatch):
    """A worker environment that sets ``OMP_NUM_THREADS`` other than the server's is not
    forked (the server's torch read its own), nor is any under ``SLATE_TEST_FRESH_PROCESSES``."""
    monkeypatch.delenv(forked.FRESH, raising=False)
    here = dict(os.environ)
    assert spawned._forkable(here)
    threads = str(int(here.get("OMP_NUM_THREADS", "1")) + 1)
    assert not spawned._forkable({**here, "OMP_NUM_THREADS": threads})
    monkeypatch.setenv(forked.FRESH, "1")
    assert not spawned._forkable(here)
