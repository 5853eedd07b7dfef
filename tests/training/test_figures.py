"""A run folder's figures are drawn from its files (``slate.training.outputs.draw_figures``):
``slate train --no-plots`` writes none, and ``slate plot`` draws later the very PNGs that
``slate train`` draws itself, compared byte for byte."""

from __future__ import annotations

import shutil

import pytest

from tests.sites import HAVE_W7A, slate_here, write_sites

FIGURES = ("pr_curve.png", "ap_curve.png", "ap_bytes.png", "ap_wan_time.png")
RUN = ("train", "--train", "train.svm", "--test", "test.svm", "--dataset", "libsvm",
       "--features", "300", "--nodes", "2", "--iterations", "20", "--eval-every", "10",
       "--seed", "3", "--wan", "80,10", "--no-progress")  # fmt: skip


@pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared")
def test_slate_plot_draws_the_figures_train_draws_and_no_plots_draws_none(tmp_path):
    write_sites(tmp_path, parties=1, rows=400)
    site = tmp_path / "site0"
    assert slate_here(*RUN, "--out", "drawn", cwd=site).returncode == 0
    assert slate_here(*RUN, "--no-plots", "--out", "bare", cwd=site).returncode == 0
    assert sorted(p.name for p in (site / "bare").glob("*.png")) == []
    drawn = {name: (site / "drawn" / name).read_bytes() for name in FIGURES}
    assert all(len(png) > 1000 for png in drawn.values())
    # The same seed, the same model: only the figures are missing from the bare folder.
    assert (site / "bare" / "model.pt").read_bytes() == (site / "drawn" / "model.pt").read_bytes()

    copy = tmp_path / "copy"  # the drawn run's files, its figures removed, drawn again
    shutil.copytree(site / "drawn", copy)
    for name in FIGURES:
        (copy / name).unlink()
    done = slate_here("plot", "--run", str(copy))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(copy / name) for name in FIGURES]
    for name in FIGURES:
        assert (copy / name).read_bytes() == drawn[name], name
        assert (copy / name).stat().st_mode & 0o777 == 0o600


def test_slate_plot_names_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    done = slate_here("plot", "--run", str(tmp_path))
    assert done.returncode == 2
    assert str(tmp_path) in done.stderr and "history.csv" in done.stderr
