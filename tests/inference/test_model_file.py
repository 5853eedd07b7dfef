"""The self-describing model files: model.json beside model.pt, slate.load_model, and the
preprocessing steps (numpy for slate predict, torch inside the exported program)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import slate
from slate.config import TrainConfig, resolve_config
from slate.data.encoding import ColumnChoice, TableEncoder
from slate.data.preprocess import Standardizer
from slate.data.readers.delimited import RawTable
from slate.errors import DataError
from slate.inference.model_file import FORMAT_VERSION, describe_run, save_model
from slate.models import MODEL_NAMES, build_model

INPUT_SHAPES = {
    "mlp": (12,),
    "mnist-cnn": (1, 28, 28),
    "fashion-mnist-cnn": (1, 28, 28),
    "cifar10-cnn": (3, 32, 32),
    "resnet18": (3, 32, 32),
}
DATASETS = {
    "mlp": "w7a",
    "mnist-cnn": "mnist",
    "fashion-mnist-cnn": "fashion-mnist",
    "cifar10-cnn": "cifar10",
    "resnet18": "tiny-imagenet",
}


class Payload:
    """Not a tensor: torch.load(weights_only=True) must refuse to unpickle it."""


def _saved_model(folder: Path, name: str, hidden=5, transform=None, dataset=None):
    dataset = dataset or DATASETS[name]
    config = resolve_config(TrainConfig(dataset=dataset, model=name, hidden=hidden))
    model = build_model(name, INPUT_SHAPES[name], hidden=hidden, seed=3)
    for buffer in model.buffers():  # BatchNorm statistics that differ from a fresh model's
        if buffer.is_floating_point():
            buffer.uniform_(0.5, 1.5)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(folder, model, describe_run(config, INPUT_SHAPES[name], transform))
    return model.eval()


def _saved_run(folder: Path, name: str, hidden=5, transform=None, dataset=None) -> Path:
    _saved_model(folder, name, hidden, transform, dataset)
    return folder


def test_every_model_name_is_listed():
    assert set(INPUT_SHAPES) == set(MODEL_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_load_model_round_trips_every_model(name, tmp_path):
    run = tmp_path / name
    original = _saved_model(run, name)
    saved = torch.load(run / "model.pt", weights_only=True)  # still a plain state_dict
    model, preprocessing = slate.load_model(run)
    assert not model.training
    state = model.state_dict()
    assert state.keys() == saved.keys()
    for key, value in saved.items():
        assert torch.equal(state[key], value), key
    x = torch.randn(3, *INPUT_SHAPES[name], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # two forward passes: equal up to CPU kernel rounding
        torch.testing.assert_close(model(x), original(x), rtol=0, atol=1e-6)
    assert preprocessing.input_shape == INPUT_SHAPES[name]


def test_model_json_describes_the_model(tmp_path):
    scaler = Standardizer(np.arange(12.0), np.full(12, 2.0))
    run = _saved_run(tmp_path, "mlp", hidden=7, transform=scaler, dataset="libsvm")
    info = json.loads((run / "model.json").read_text())
    assert info["format"] == "slate-model" and info["format_version"] == FORMAT_VERSION
    assert info["slate_version"] == slate.__version__
    assert info["model"] == {"name": "mlp", "input_shape": [12], "hidden": 7}
    assert info["input"] == {"format": "libsvm", "n_features": 12, "zero_based": False}
    assert info["preprocessing"] == [scaler.to_dict()]
    assert info["labels"]["kind"] == "binary"
    model, preprocessing = slate.load_model(run)
    assert model.hidden.out_features == 7
    x = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    np.testing.assert_array_equal(preprocessing(x), scaler.apply(x))


def test_image_runs_carry_their_normalisation_and_class_mapping(tmp_path):
    from slate.data.datasets import normalise_images

    run = _saved_run(tmp_path, "cifar10-cnn")
    info = json.loads((run / "model.json").read_text())
    assert info["labels"]["positive_classes"] == [5, 9]
    _, preprocessing = slate.load_model(run)
    pixels = np.random.default_rng(1).integers(0, 256, size=(5, 3, 32, 32), dtype=np.uint8)
    expected = normalise_images(pixels, (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))
    np.testing.assert_array_equal(preprocessing(pixels), expected)
    with torch.no_grad():
        inside = preprocessing.module()(torch.from_numpy(pixels.astype(np.float32)))
    np.testing.assert_array_equal(inside.numpy(), expected)


def test_unknown_format_versions_and_broken_files_are_refused(tmp_path):
    run = _saved_run(tmp_path, "mlp")
    info = json.loads((run / "model.json").read_text())
    (run / "model.json").write_text(json.dumps({**info, "format_version": FORMAT_VERSION + 1}))
    with pytest.raises(DataError, match=r"format version 2, but slate .* reads only version 1"):
        slate.load_model(run)
    (run / "model.json").write_text(json.dumps({**info, "model": {**info["model"], "hidden": 9}}))
    with pytest.raises(DataError, match="does not fit the mlp model"):
        slate.load_model(run)
    (run / "model.json").write_text("{not json")
    with pytest.raises(DataError, match="cannot be read as JSON"):
        slate.load_model(run)
    (run / "model.json").unlink()
    with pytest.raises(DataError, match=r"no model\.json"):
        slate.load_model(run)


def test_weights_are_read_with_weights_only(tmp_path):
    run = _saved_run(tmp_path, "mlp")
    torch.save({"hidden.weight": Payload()}, run / "model.pt")  # a pickled object, not tensors
    with pytest.raises(DataError, match=r"weights_only=True"):
        slate.load_model(run)


# --------------------------------------------------------------------------- steps


def table(path: str = "t.csv", y=None, **columns) -> RawTable:
    """Numbers (NaN = missing) or lists of strings (None = missing) per column."""
    return RawTable.from_columns(path, y, **columns)


NAN = float("nan")


def test_table_steps_in_numpy_and_torch_equal_the_encoder():
    """Raw table features (numbers with NaN, one-hot) give the encoder's exact output, both in
    numpy and inside the torch module of the exported program."""
    from slate.inference.model_file import Preprocessing

    train = table(
        age=[20.0, NAN, 40.0, 61.5, 33.0], city=["a", "b", None, "a", "c"],
        income=[1e5, 2e5, 3.5e5, 4e5, 1.2e5],
    )  # fmt: skip
    encoder = TableEncoder.fit([train], ColumnChoice(), standardize=True)
    pre = Preprocessing([encoder.to_dict()], (encoder.width,))
    assert pre.raw_columns == ["age", "income", "city=a", "city=b", "city=c", "city=<missing>"]
    new = table(age=[NAN, 25.0], city=["c", "zzz"], income=[NAN, 5e4])
    raw = pre.raw_table(new)
    assert np.isnan(raw[0, 0]) and raw.shape == (2, 6)
    expected = encoder.transform(new)
    np.testing.assert_array_equal(pre(raw), expected)
    np.testing.assert_array_equal(pre.table_features(new), expected)
    with torch.no_grad():
        inside = pre.module()(torch.from_numpy(raw)).numpy()
    np.testing.assert_array_equal(inside, expected)


def test_standardize_and_divide_steps_equal_in_numpy_and_torch():
    from slate.inference.model_file import Preprocessing

    rng = np.random.default_rng(2)
    scaler = Standardizer(rng.normal(size=64), rng.uniform(0.5, 2.0, size=64))
    pre = Preprocessing([{"kind": "divide", "by": 16.0}, scaler.to_dict()], (64,))
    raw = rng.integers(0, 17, size=(7, 64)).astype(np.float32)
    expected = scaler.apply((raw / 16.0).astype(np.float32))
    np.testing.assert_array_equal(pre(raw), expected)
    with torch.no_grad():
        np.testing.assert_array_equal(pre.module()(torch.from_numpy(raw)).numpy(), expected)
    with pytest.raises(DataError, match=r"shape \(63,\) per row, but the model takes \(64,\)"):
        pre(raw[:, :63])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_exports_with_its_preprocessing(name, tmp_path):
    """slate export works for every model name; the program equals sigmoid(model(prep(x)))."""
    from slate.inference.export import export_run

    run = tmp_path / name
    model = _saved_model(run, name)
    exported = export_run(run)
    assert exported.path == run / "model.pt2" and exported.input_shape == INPUT_SHAPES[name]
    program = torch.export.load(exported.path).module()
    shape = INPUT_SHAPES[name]
    generator = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (3, *shape), generator=generator).float()  # pixels or features
    _, preprocessing = slate.load_model(run)
    with torch.no_grad():
        want = torch.sigmoid(model(torch.from_numpy(preprocessing(raw.numpy()))))
        got = program(raw)
    assert got.shape == (3,)
    assert float((got - want).abs().max()) <= 1e-6


def test_a_public_range_clips_in_predict_as_in_training():
    """A LIBSVM run with a public value range (``--feature-range``, every ``--dp-epsilon`` run)
    clipped each site's rows into it; ``model.json`` carries the clip, so ``slate predict`` and
    the exported program feed the model the values training saw."""
    from slate.config import TrainConfig
    from slate.data.declared import clip_to_range
    from slate.inference.model_file import Preprocessing, describe_run

    info = describe_run(TrainConfig(dataset="libsvm", feature_range=(-1.0, 1.0)), (5,))
    assert info["preprocessing"] == [{"kind": "clip", "low": -1.0, "high": 1.0}]
    raw = np.array([[4242.5, -3.0, 0.5, 1.0, -1.0], [0.0, 0.25, -0.75, 2.0, 1e30]], np.float32)
    trained, note = clip_to_range(raw.copy(), (-1.0, 1.0), "site1/train.svm")
    assert note is not None and "4 feature values" in note
    pre = Preprocessing.from_info(info)
    np.testing.assert_array_equal(pre(raw), trained)
    with torch.no_grad():
        np.testing.assert_array_equal(pre.module()(torch.from_numpy(raw)).numpy(), trained)
    assert describe_run(TrainConfig(dataset="libsvm"), (5,))["preprocessing"] == []
