"""End-to-end runs of ``slate.training.loop.train`` on the image datasets.

MNIST runs on the real files in the shared data folder (skipped when they are absent); CIFAR-10
and Tiny-ImageNet run on tiny synthetic folders written here in their exact on-disk formats.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from slate.config import TrainConfig
from slate.data.sources import load_dataset
from slate.errors import ConfigError
from slate.models import Cifar10CNN, ResNet18
from slate.training.loop import train
from slate.training.outputs import HISTORY_COLUMNS

SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
OUTPUTS = ("summary.json", "history.csv", "pr_curve.png", "ap_curve.png", "model.pt")


def quiet(*_args: object) -> None:
    pass


def check_outputs(out: Path, n_history: int) -> dict:
    for name in OUTPUTS:
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    with open(out / "history.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == n_history
    assert tuple(rows[0]) == HISTORY_COLUMNS
    assert float(rows[-1]["test_ap"]) == pytest.approx(summary["test_ap"])
    for row in rows:
        assert 0.0 <= float(row["test_ap"]) <= 1.0
    return summary


# --------------------------------------------------------------------------------------------
# MNIST, real data
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(
    not all((SHARED_DATA / "mnist" / name).is_file() for name in MNIST_FILES),
    reason="MNIST is not in the shared data folder",
)
def test_mnist_short_run_learns(tmp_path: Path) -> None:
    out = tmp_path / "run"
    config = TrainConfig(
        dataset="mnist",
        data_dir=str(SHARED_DATA),
        nodes=4,
        iterations=30,
        eval_every=15,
        out=str(out),
    )
    result = train(config, progress=False, write=True, log=quiet)
    summary = check_outputs(out, n_history=3)
    # Measured with seed 0: AP 0.486 at initialisation, 0.878 after 15 and 0.918 after 30
    # iterations (seeds 1 and 2 give 0.932 and 0.936). A random ranking gives AP ~ 0.5 (the
    # test set is 49% positive); a pipeline that does not learn stays near it.
    assert summary["test_ap"] > 0.88
    assert [row["iteration"] for row in result.history] == [0, 15, 30]
    assert result.history[0]["test_ap"] < 0.7
    assert result.history[1]["test_ap"] > result.history[0]["test_ap"] + 0.2
    assert summary["n_test"] == 10000
    # 20% of each positive class kept: 30596 negatives and int(0.2 * count) of classes 5-9.
    assert summary["n_train"] == 30596 + sum(int(0.2 * c) for c in (5421, 5918, 6265, 5851, 5949))
    assert summary["config"]["model"] == "mnist-cnn"
    assert summary["n_parameters"] == 20 * 25 + 20 + 50 * 20 * 25 + 50 + 800 * 500 + 500 + 501
    assert summary["iterations"] == 30
    state = torch.load(out / "model.pt", weights_only=True)
    assert state["head.2.weight"].shape == (1, 500)


# --------------------------------------------------------------------------------------------
# CIFAR-10, synthetic binary files
# --------------------------------------------------------------------------------------------

CIFAR_TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
CIFAR_PER_CLASS = 4  # records per class in each file: 20 per class in the training set


def cifar_records(rng: np.random.Generator, per_class: int) -> bytes:
    """Records of 1 label byte + 3072 pixel bytes; classes 5-9 (positive) are brighter."""
    labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
    rng.shuffle(labels)
    records = np.empty((len(labels), 3073), dtype=np.uint8)
    records[:, 0] = labels
    for k, label in enumerate(labels):
        low, high = (150, 256) if label >= 5 else (0, 100)
        records[k, 1:] = rng.integers(low, high, size=3072, dtype=np.uint8)
    return records.tobytes()


def write_cifar(folder: Path, seed: int = 0) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for name in [*CIFAR_TRAIN_FILES, "test_batch.bin"]:
        (folder / name).write_bytes(cifar_records(rng, CIFAR_PER_CLASS))
    # Part of the official archive (one class name per line); not read by the loader.
    names = ("airplane", "automobile", "bird", "cat", "deer")
    names += ("dog", "frog", "horse", "ship", "truck")
    (folder / "batches.meta.txt").write_text("\n".join(names) + "\n")


def test_cifar10_synthetic_run(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar10")
    out = tmp_path / "run"
    config = TrainConfig(
        dataset="cifar10",
        data_dir=str(tmp_path),
        nodes=2,
        iterations=4,
        batch_size=6,
        positives=2,
        eval_every=2,
        out=str(out),
    )
    result = train(config, progress=False, write=True, log=quiet)
    summary = check_outputs(out, n_history=3)
    assert summary["config"]["model"] == "cifar10-cnn"  # the dataset's default model
    assert summary["n_parameters"] == sum(p.numel() for p in Cifar10CNN().parameters())
    # 5 x 20 negatives, and int(0.2 * 20) = 4 of each positive class; the test set unchanged.
    assert summary["n_train"] == 100 + 5 * 4
    assert summary["n_test"] == 10 * CIFAR_PER_CLASS
    assert summary["iterations"] == 4
    assert bool(torch.isfinite(result.parameters).all())
    state = torch.load(out / "model.pt", weights_only=True)
    reference = Cifar10CNN().state_dict()
    assert state.keys() == reference.keys()
    assert all(state[k].shape == reference[k].shape for k in state)


def test_cifar10_images_are_normalised_per_channel(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar10")
    data = load_dataset(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)))
    assert data.x_train.dtype == np.float32
    assert data.input_shape == (3, 32, 32)
    raw = np.frombuffer((tmp_path / "cifar10" / "test_batch.bin").read_bytes(), np.uint8)
    raw = raw.reshape(-1, 3073)
    mean = np.array([0.5071, 0.4867, 0.4408], dtype=np.float32)[:, None, None]
    std = np.array([0.2675, 0.2565, 0.2761], dtype=np.float32)[:, None, None]
    expected = (raw[:, 1:].reshape(-1, 3, 32, 32) / np.float32(255) - mean) / std
    np.testing.assert_allclose(data.x_test, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(data.y_test, (raw[:, 0] >= 5).astype(np.int64))


def test_cifar10_nested_archive_layout_is_accepted(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar10" / "cifar-10-batches-bin")
    data = load_dataset(TrainConfig(dataset="cifar10", data_dir=str(tmp_path)))
    assert len(data.y_test) == 10 * CIFAR_PER_CLASS


# --------------------------------------------------------------------------------------------
# Tiny-ImageNet, synthetic JPEG tree
# --------------------------------------------------------------------------------------------

TINY_CLASSES = 200
TINY_POSITIVE_IMAGES = 5  # int(0.2 * 5) = 1 kept per positive class
TINY_NEGATIVE_IMAGES = 1
TINY_VAL_PER_SIDE = 4  # validation images among negative classes and among positive ones


def solid_jpeg(path: Path, colour: tuple[int, int, int]) -> None:
    Image.new("RGB", (64, 64), colour).save(path, format="JPEG", quality=90)


def write_tiny_imagenet(root: Path) -> None:
    wnids = [f"n{k:08d}" for k in range(TINY_CLASSES)]
    root.mkdir(parents=True)
    (root / "wnids.txt").write_text("\n".join(wnids) + "\n")
    rng = np.random.default_rng(0)
    for label, wnid in enumerate(wnids):
        folder = root / "train" / wnid / "images"
        folder.mkdir(parents=True)
        positive = label >= TINY_CLASSES // 2
        count = TINY_POSITIVE_IMAGES if positive else TINY_NEGATIVE_IMAGES
        for j in range(count):
            base = 200 if positive else 40
            colour = tuple(int(v) for v in base + rng.integers(-30, 30, size=3))
            solid_jpeg(folder / f"{wnid}_{j}.JPEG", colour)
    val = root / "val" / "images"
    val.mkdir(parents=True)
    lines = []
    for k in range(2 * TINY_VAL_PER_SIDE):
        positive = k >= TINY_VAL_PER_SIDE
        label = TINY_CLASSES // 2 + k if positive else k
        name = f"val_{k}.JPEG"
        solid_jpeg(val / name, (210, 200, 190) if positive else (30, 40, 50))
        lines.append(f"{name}\t{wnids[label]}\t0\t0\t63\t63")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")


def test_tiny_imagenet_synthetic_run(tmp_path: Path) -> None:
    # The standard zip extracts to tiny-imagenet-200/; the loader looks in DATA_DIR/tiny-imagenet.
    write_tiny_imagenet(tmp_path / "tiny-imagenet" / "tiny-imagenet-200")
    out = tmp_path / "run"
    config = TrainConfig(
        dataset="tiny-imagenet",
        data_dir=str(tmp_path),
        nodes=2,
        iterations=2,
        batch_size=4,
        positives=1,
        eval_every=2,
        out=str(out),
    )
    result = train(config, progress=False, write=True, log=quiet)
    summary = check_outputs(out, n_history=2)
    assert summary["config"]["model"] == "resnet18"
    assert summary["n_parameters"] == sum(p.numel() for p in ResNet18(3).parameters())
    assert summary["n_train"] == 100 * TINY_NEGATIVE_IMAGES + 100 * 1
    assert summary["n_test"] == 2 * TINY_VAL_PER_SIDE
    assert bool(torch.isfinite(result.parameters).all())
    state = torch.load(out / "model.pt", weights_only=True)
    # The saved model carries the averaged BatchNorm statistics, updated by 2 steps.
    assert int(state["stem.1.num_batches_tracked"]) == 2
    assert not torch.equal(state["stem.1.running_mean"], torch.zeros_like(state["stem.1.bias"]))


# --------------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_config_error(tmp_path: Path, device: str) -> None:
    config = TrainConfig(dataset="digits", device=device, out=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="--device cpu"):
        train(config, progress=False, write=True, log=quiet)
    assert not (tmp_path / "run").exists()


def test_unknown_device_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        train(TrainConfig(dataset="digits", device="tpu"), progress=False, write=False, log=quiet)
