"""A run folder and everything in it are private to the user, whatever the umask
(slate.permissions): a run's outputs and checkpoints hold the site's model and data."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from slate.cli import main
from slate.permissions import private_files, private_folder


def modes(root: Path) -> dict[str, int]:
    """Every path under ``root`` (itself included) and its permission bits."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_a_run_folder_is_0700_and_its_files_0600_under_umask_022(tmp_path):
    rng = np.random.default_rng(0)
    lines = ["a,b,y", *(f"{rng.random():.3f},{rng.random():.3f},{int(i % 4 == 0)}"
                        for i in range(120))]  # fmt: skip
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    previous = os.umask(0o022)
    try:
        code = main(["train", "--dataset", "csv", "--train", str(tmp_path / "t.csv"),
                     "--label-column", "y", "--positive-label", "1", "--nodes", "2",
                     "--iterations", "20", "--eval-every", "10", "--checkpoint-every", "10",
                     "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
        after = os.umask(0o022)
    finally:
        os.umask(previous)
    assert code == 0
    assert after == 0o022  # the umask is the user's again once the run is written
    found = modes(tmp_path / "run")
    names = set(found)
    assert {"model.pt", "model.json", "summary.json", "history.csv", "checkpoint.pt"} <= names
    assert any(name.endswith(".png") for name in names)
    for name, mode in found.items():
        is_dir = (tmp_path / "run" / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), f"{name}: {oct(mode)}"


def test_private_folder_narrows_a_folder_that_existed(tmp_path):
    folder = tmp_path / "made" / "before"
    folder.mkdir(parents=True, mode=0o755)
    folder.chmod(0o755)
    private_folder(folder)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    with private_files():
        (folder / "x").write_text("1")
    assert stat.S_IMODE((folder / "x").stat().st_mode) == 0o600
