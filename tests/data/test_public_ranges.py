"""Public value ranges (``--feature-range``, and under ``--dp-epsilon`` its default): a site
declares the public range in place of its rows' own smallest and largest values, clips a value
outside it into it, and says so in its own notes only (slate.data.declared, slate.data.parts,
slate.data.party_files); the flag's checks and defaults (slate.config, slate.training.checks)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from slate.cli.commands import config_from_args
from slate.cli.parser import build_parser
from slate.config import DP_FEATURE_RANGE, TrainConfig, resolve_config
from slate.data.declared import ALL_FEATURES, clip_to_range, public_ranges
from slate.data.party_files import PRIVATE_READ_ERROR, read_party_files
from slate.data.spec import DataSpec
from slate.errors import ConfigError
from slate.training.checks import check_feature_range
from tests.sites import slate_here

PLANTED = 4242.5


def write_site(folder: Path, planted: float | None = PLANTED) -> None:
    """A party's LIBSVM training and test files; its first positive row's feature 2 is
    ``planted`` (``None``: every value is 0 or 1)."""
    folder.mkdir(parents=True, exist_ok=True)
    value = "1" if planted is None else f"{planted}"
    train = [f"+1 1:1 2:{value}", "+1 1:1 3:1", "-1 3:1", "-1 2:1", "-1 1:1 3:1", "-1 1:1"]
    (folder / "train.svm").write_text("\n".join(train) + "\n")
    (folder / "test.svm").write_text("+1 1:1\n-1 2:1\n+1 3:1\n-1 1:1\n")


def spec_of(root: Path, **flags) -> DataSpec:
    return DataSpec(dataset="libsvm", train=str(root / "site{rank}" / "train.svm"),
                    test=str(root / "site{rank}" / "test.svm"), party_files=True, nodes=2,
                    positives=1, batch_size=2, **flags)  # fmt: skip


def test_clip_to_range_clips_keeps_the_type_and_says_how_much():
    x = np.array([[0.0, 1.0, PLANTED], [-3.0, 0.5, 1.0]], dtype=np.float32)
    clipped, note = clip_to_range(x, (-1.0, 1.0), "site1/train.svm")
    assert clipped.dtype == np.float32
    assert clipped.tolist() == [[0.0, 1.0, 1.0], [-1.0, 0.5, 1.0]]
    assert note is not None and "site1/train.svm: 2 feature values (from -3 to 4242.5)" in note
    assert "[-1, 1]" in note and "nothing about these values is sent" in note
    same, none = clip_to_range(clipped, (-1.0, 1.0), "f")
    assert none is None and same is clipped
    assert public_ranges((0, 1)) == {ALL_FEATURES: [0.0, 1.0]}


def test_under_dp_a_site_declares_the_public_range_and_clips_at_home(tmp_path):
    write_site(tmp_path / "site0", planted=None)
    write_site(tmp_path / "site1")
    shards, _ = read_party_files(spec_of(tmp_path, dp_epsilon=8.0), [0, 1])
    for shard in shards:
        assert shard.schema.ranges == {ALL_FEATURES: list(DP_FEATURE_RANGE)}
        assert float(shard.train.x.max()) <= 1.0
    assert not any("clipped" in note for note in shards[0].notes)
    clipped = [note for note in shards[1].notes if "clipped" in note]
    assert len(clipped) == 1 and "1 feature value (4242.5)" in clipped[0]
    # the width each site sends is its files' largest index unless --n-features declares it
    assert any("--n-features" in note for note in shards[1].notes)
    declared, _ = read_party_files(spec_of(tmp_path, dp_epsilon=8.0, n_features=3), [1])
    assert not any("--n-features" in note for note in declared[0].notes)


def test_without_a_public_range_a_site_declares_its_own_and_clips_nothing(tmp_path):
    write_site(tmp_path / "site0", planted=None)
    write_site(tmp_path / "site1")
    shards, _ = read_party_files(spec_of(tmp_path), [0, 1])
    assert shards[1].schema.ranges == {ALL_FEATURES: [0.0, PLANTED]}
    assert float(shards[1].train.x.max()) == PLANTED and shards[1].notes == []
    given, _ = read_party_files(spec_of(tmp_path, feature_range=(0.0, 2.0)), [1])
    assert given[0].schema.ranges == {ALL_FEATURES: [0.0, 2.0]}
    assert float(given[0].train.x.max()) == 2.0


def test_the_flag_parses_resolves_and_is_recorded_only_when_in_force():
    args = build_parser().parse_args(
        ["train", "--dataset", "libsvm", "--train", "t.svm", "--feature-range", "-2", "3.5"]
    )
    assert config_from_args(args).feature_range == (-2.0, 3.5)
    private = resolve_config(TrainConfig(dataset="libsvm", train="t.svm", dp_epsilon=8.0))
    assert private.feature_range == DP_FEATURE_RANGE
    assert private.to_dict()["feature_range"] == DP_FEATURE_RANGE
    given = TrainConfig(dataset="libsvm", train="t.svm", dp_epsilon=8.0, feature_range=(0, 1))
    assert resolve_config(given).feature_range == (0, 1)
    plain = resolve_config(TrainConfig(dataset="libsvm", train="t.svm"))
    assert plain.feature_range is None and "feature_range" not in plain.to_dict()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"dataset": "csv"}, "--dataset csv does not take it"),
        ({"feature_range": (0.5, 1.0)}, "zero must lie between them"),
        ({"feature_range": (-1.0, -0.5)}, "zero must lie between them"),
        ({"feature_range": (0.0, 0.0)}, "LO < HI"),
        ({"feature_range": (float("nan"), 1.0)}, "must be finite"),
        ({"feature_range": (0.0, float("inf"))}, "must be finite"),
    ],
)
def test_a_bad_range_is_one_paragraph(flags, words):
    config = TrainConfig(**{"dataset": "libsvm", "feature_range": (0.0, 1.0), **flags})
    with pytest.raises(ConfigError, match="--feature-range") as caught:
        check_feature_range(config)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_under_dp_an_index_beyond_the_declared_width_is_dropped_at_home(tmp_path):
    write_site(tmp_path / "site1", planted=None)
    shards, _ = read_party_files(spec_of(tmp_path, dp_epsilon=8.0, n_features=2), [1])
    shard = shards[0]
    assert shard.schema.error is None and shard.schema.n_features == 2
    assert shard.train.x.shape[1] == 2 and shard.held.x.shape[1] == 2
    dropped = [note for note in shard.notes if "dropped" in note]
    assert dropped and "beyond --n-features 2" in dropped[0]
    plain, _ = read_party_files(spec_of(tmp_path, n_features=2), [1])  # without DP: refused
    assert "feature index 3" in (plain[0].schema.error or "")


def test_under_dp_why_a_file_cannot_be_read_stays_at_its_site(tmp_path):
    write_site(tmp_path / "site0", planted=None)
    write_site(tmp_path / "site1", planted=None)
    (tmp_path / "site1" / "train.svm").write_text("+1 1:1\n-1 2:oops\n")
    shards, _ = read_party_files(spec_of(tmp_path, dp_epsilon=8.0), [0, 1])
    assert shards[1].schema.error == PRIVATE_READ_ERROR and "oops" in shards[1].notes[0]
    plain, _ = read_party_files(spec_of(tmp_path), [1])  # without DP the reason is sent
    assert "oops" in (plain[0].schema.error or "")
    flags = ["train", "--dataset", "libsvm", "--train", str(tmp_path / "site{rank}" / "train.svm"),
             "--test", str(tmp_path / "site{rank}" / "test.svm"), "--nodes", "2",
             "--positives", "1", "--batch-size", "2", "--iterations", "2", "--lr", "0.05",
             "--dp-epsilon", "8", "--no-progress", "--no-plots"]  # fmt: skip
    done = slate_here(*flags)
    assert done.returncode != 0
    said = " ".join(done.stderr.split())
    assert "Party 1 could not read its data: the reason stays at its site" in said
    assert "Party 1 (here):" in said and "oops" in said
