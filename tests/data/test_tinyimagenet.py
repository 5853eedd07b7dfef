"""Tests for the Tiny ImageNet reader on a small tree of real JPEG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from slate.data.readers.tinyimagenet import read_tiny_imagenet
from slate.errors import ConfigError, DataError

WNIDS = ["n02124075", "n01443537", "n09999999"]  # deliberately not sorted
SIDE = 8


def solid(color: tuple[int, int, int], size: int = SIDE) -> Image.Image:
    return Image.new("RGB", (size, size), color)


def expected_chw(color: tuple[int, int, int], size: int = SIDE) -> np.ndarray:
    return np.broadcast_to(np.array(color, np.uint8)[:, None, None], (3, size, size))


def build_tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Write a tiny Tiny-ImageNet tree; return the colour of every image by file name.

    Solid-colour images with quality 100 decode back to (almost) exactly their colour.
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    colors: dict[str, tuple[int, int, int]] = {}
    for c, wnid in enumerate(WNIDS):
        folder = root / "train" / wnid / "images"
        folder.mkdir(parents=True)
        (root / "train" / wnid / f"{wnid}_boxes.txt").write_text("ignored\n")
        for i in (1, 0):  # written out of order; the reader sorts by name
            color = (40 * c + 20 * i, 200 - 50 * c, 30 + 10 * i)
            name = f"{wnid}_{i}.JPEG"
            solid(color).save(folder / name, quality=100)
            colors[name] = color
    # a grayscale training image in class 1
    gray = Image.new("L", (SIDE, SIDE), 128)
    gray.save(root / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_2.JPEG", quality=100)
    colors[f"{WNIDS[1]}_2.JPEG"] = (128, 128, 128)
    val = root / "val" / "images"
    val.mkdir(parents=True)
    lines = []
    for k, wnid in [(2, WNIDS[2]), (0, WNIDS[0]), (1, WNIDS[0]), (3, WNIDS[1])]:
        color = (10 + 60 * k, 250 - 60 * k, 90)
        name = f"val_{k}.JPEG"
        solid(color).save(val / name, quality=100)
        colors[name] = color
        lines.append(f"{name}\t{wnid}\t0\t1\t5\t6")
    (root / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return colors


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, int, int]]]:
    root = tmp_path / "tiny-imagenet-200"
    return root, build_tree(root)


def assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert np.abs(actual.astype(int) - expected.astype(int)).max() <= 3


def test_round_trip(tree: tuple[Path, dict[str, tuple[int, int, int]]]) -> None:
    root, colors = tree
    train_x, train_y, val_x, val_y, wnids = read_tiny_imagenet(root, image_size=SIDE)
    assert wnids == WNIDS
    assert train_x.shape == (7, 3, SIDE, SIDE)
    assert val_x.shape == (4, 3, SIDE, SIDE)
    assert train_x.dtype == val_x.dtype == np.uint8
    assert train_y.dtype == val_y.dtype == np.int64
    # class order from wnids.txt, then sorted file names
    assert train_y.tolist() == [0, 0, 1, 1, 1, 2, 2]
    order = [f"{WNIDS[0]}_0", f"{WNIDS[0]}_1", f"{WNIDS[1]}_0", f"{WNIDS[1]}_1", f"{WNIDS[1]}_2"]
    order += [f"{WNIDS[2]}_0", f"{WNIDS[2]}_1"]
    for image, stem in zip(train_x, order, strict=True):
        assert_close(image, expected_chw(colors[stem + ".JPEG"]))
    # grayscale image became three equal channels
    gray = train_x[4]
    assert (gray[0] == gray[1]).all()
    assert (gray[1] == gray[2]).all()
    # validation sorted by file name, labels from the annotation file
    assert val_y.tolist() == [0, 0, 2, 1]
    for image, k in zip(val_x, range(4), strict=True):
        assert_close(image, expected_chw(colors[f"val_{k}.JPEG"]))


def test_parent_folder_and_deterministic(
    tree: tuple[Path, dict[str, tuple[int, int, int]]],
) -> None:
    root, _ = tree
    first = read_tiny_imagenet(root.parent, image_size=SIDE)
    second = read_tiny_imagenet(root, image_size=SIDE)
    for a, b in zip(first[:4], second[:4], strict=True):
        np.testing.assert_array_equal(a, b)


def test_resize(tree: tuple[Path, dict[str, tuple[int, int, int]]]) -> None:
    root, colors = tree
    # one image of another size
    odd = root / "train" / WNIDS[0] / "images" / f"{WNIDS[0]}_0.JPEG"
    solid(colors[odd.name], size=13).save(odd, quality=100)
    train_x, _, val_x, _, _ = read_tiny_imagenet(root, image_size=4)
    assert train_x.shape == (7, 3, 4, 4)
    assert val_x.shape == (4, 3, 4, 4)
    assert_close(train_x[0], expected_chw(colors[odd.name], size=4))


def expect_error(root: Path, *fragments: str) -> str:
    with pytest.raises(DataError) as info:
        read_tiny_imagenet(root, image_size=SIDE)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_wnids(tmp_path: Path) -> None:
    expect_error(tmp_path, str(tmp_path), "wnids.txt", "--data-dir")


def test_empty_and_duplicate_wnids(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    (root / "wnids.txt").write_text("\n\n")
    expect_error(root, str(root / "wnids.txt"), "empty")
    (root / "wnids.txt").write_text(f"{WNIDS[0]}\n{WNIDS[1]}\n{WNIDS[0]}\n")
    expect_error(root, str(root / "wnids.txt"), "lines 1 and 3")


def test_missing_train_class(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    (root / "wnids.txt").write_text("\n".join([*WNIDS, "n00000001"]))
    expect_error(root, str(root / "train" / "n00000001" / "images"), "n00000001")


def test_empty_train_class(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    for path in (root / "train" / WNIDS[2] / "images").iterdir():
        path.unlink()
    expect_error(root, str(root / "train" / WNIDS[2] / "images"), "no .JPEG")


def test_undecodable_train_image(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    bad = root / "train" / WNIDS[1] / "images" / f"{WNIDS[1]}_1.JPEG"
    bad.write_bytes(b"this is not a jpeg")
    expect_error(root, str(bad), "cannot be decoded")


def test_truncated_val_image(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    bad = root / "val" / "images" / "val_2.JPEG"
    bad.write_bytes(bad.read_bytes()[:40])
    expect_error(root, str(bad), "cannot be decoded")


def test_unknown_wnid_in_annotations(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    lines = ann.read_text().splitlines()
    lines[2] = "val_1.JPEG\tn12345678\t0\t0\t1\t1"
    ann.write_text("\n".join(lines))
    expect_error(root, str(ann), "line 3", "n12345678")


def test_malformed_annotation_line(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + "just-one-field\n")
    expect_error(root, str(ann), "line 5", "malformed")


def test_duplicate_annotation(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    ann.write_text(ann.read_text() + f"val_0.JPEG\t{WNIDS[1]}\t0\t0\t1\t1\n")
    expect_error(root, str(ann), "val_0.JPEG", "twice")


def test_annotation_names_missing_image(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    (root / "val" / "images" / "val_3.JPEG").unlink()
    expect_error(root, str(root / "val" / "images" / "val_3.JPEG"), "line 4")


def test_missing_annotation_file(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    ann.unlink()
    expect_error(root, str(ann), "does not exist")


def test_annotation_file_not_text(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    ann.write_bytes(b"\xff\xfe\x00bad")
    expect_error(root, str(ann), "UTF-8")


def test_path_in_annotation_rejected(tree: tuple[Path, dict]) -> None:
    root, _ = tree
    ann = root / "val" / "val_annotations.txt"
    ann.write_text(f"../../wnids.txt\t{WNIDS[0]}\t0\t0\t1\t1\n")
    expect_error(root, str(ann), "plain file name")


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_bad_image_size(tree: tuple[Path, dict], size: object) -> None:
    root, _ = tree
    with pytest.raises(ConfigError, match="positive integer"):
        read_tiny_imagenet(root, image_size=size)  # type: ignore[arg-type]
