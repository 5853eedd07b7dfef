"""Reader for Tiny ImageNet (200 classes, 64 x 64 JPEGs).

The standard layout (``tiny-imagenet-200.zip``) is::

    wnids.txt                       one WordNet id per line; its order defines label indices
    train/<wnid>/images/*.JPEG      500 training images per class
    val/images/*.JPEG               10000 validation images
    val/val_annotations.txt         tab-separated: filename, wnid, x0, y0, x1, y1

The test split has no labels and is not read. Images are decoded with Pillow, converted to RGB
(the real set contains grayscale JPEGs) and resized bilinearly when not already the requested
size. Every problem with the data is raised as :class:`~slate.errors.DataError`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from slate.errors import ConfigError, DataError

__all__ = ["read_tiny_imagenet"]

_SUBFOLDER = "tiny-imagenet-200"
_IMAGE_SUFFIXES = frozenset({".jpeg", ".jpg"})
_HINT = (
    "Download Tiny ImageNet (tiny-imagenet-200.zip) yourself and unpack it there, or point "
    "--data-dir at the folder that holds it; slate does not download it."
)


def _resolve_folder(folder: Path) -> Path:
    """Return the folder that directly holds ``wnids.txt``.

    Args:
        folder: The folder given by the user, or its parent holding ``tiny-imagenet-200/``.

    Returns:
        The dataset root.
    """
    if not (folder / "wnids.txt").exists() and (folder / _SUBFOLDER).is_dir():
        return folder / _SUBFOLDER
    return folder


def _read_text(path: Path, what: str) -> list[str]:
    """Read a UTF-8 text file as lines.

    Args:
        path: The file.
        what: A description for error messages.

    Returns:
        The file's lines without line endings.

    Raises:
        DataError: If the file is missing, unreadable or not UTF-8 text.
    """
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise DataError(
            f"Tiny ImageNet {what} {path} does not exist in {path.parent}. {_HINT}"
        ) from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"Tiny ImageNet {what} {path} is not UTF-8 text: {exc}.") from exc
    except OSError as exc:
        raise DataError(f"Tiny ImageNet {what} {path} cannot be read: {exc}.") from exc


def _read_wnids(root: Path) -> list[str]:
    """Read the class list.

    Args:
        root: The dataset root.

    Returns:
        The WordNet ids in file order.

    Raises:
        DataError: If ``wnids.txt`` is missing, empty or lists an id twice.
    """
    path = root / "wnids.txt"
    if not path.is_file():
        raise DataError(
            f"Tiny ImageNet folder {root} has no wnids.txt (the list of class ids), so it is "
            f"not a Tiny ImageNet dataset folder. {_HINT}"
        )
    wnids: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(_read_text(path, "class list"), start=1):
        wnid = line.strip()
        if not wnid:
            continue
        if wnid in seen:
            raise DataError(
                f"Tiny ImageNet class list {path} lists {wnid!r} twice, on lines "
                f"{seen[wnid]} and {lineno}."
            )
        seen[wnid] = lineno
        wnids.append(wnid)
    if not wnids:
        raise DataError(f"Tiny ImageNet class list {path} is empty; expected one wnid per line.")
    return wnids


def _image_files(folder: Path) -> list[Path]:
    """List the JPEG files of a folder, sorted by name.

    Args:
        folder: The folder.

    Returns:
        The files whose suffix is ``.JPEG``/``.jpg`` in any case, sorted by name.
    """
    return sorted(
        (p for p in folder.iterdir() if p.suffix.lower() in _IMAGE_SUFFIXES and p.is_file()),
        key=lambda p: p.name,
    )


def _load_image(path: Path, size: int) -> np.ndarray:
    """Decode one image into a ``(3, size, size)`` ``uint8`` array.

    Args:
        path: The image file.
        size: The side length to resize to (bilinear) if the image is not already that size.

    Returns:
        The RGB image, channel-major.

    Raises:
        DataError: If the file cannot be opened or decoded.
    """
    try:
        with Image.open(path) as img:
            img.load()
            rgb = img.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            array = np.asarray(rgb, dtype=np.uint8)
    except FileNotFoundError as exc:
        raise DataError(f"Tiny ImageNet image {path} does not exist.") from exc
    except Exception as exc:  # Pillow raises many types for bad files; all mean "corrupt".
        raise DataError(
            f"Tiny ImageNet image {path} cannot be decoded ({type(exc).__name__}: {exc}). "
            "The file is corrupt; delete the dataset folder and download it again."
        ) from exc
    return array.transpose(2, 0, 1)


def _read_train(root: Path, wnids: list[str], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Read the training split.

    Args:
        root: The dataset root.
        wnids: The class ids; a class's label is its index here.
        size: The image side length.

    Returns:
        ``(images, labels)`` in class order, then file-name order within a class.

    Raises:
        DataError: If a class folder is missing or empty, or an image does not decode.
    """
    images: list[np.ndarray] = []
    labels: list[int] = []
    for label, wnid in enumerate(wnids):
        folder = root / "train" / wnid / "images"
        if not folder.is_dir():
            raise DataError(
                f"Tiny ImageNet training folder {folder} for class {wnid!r} (listed in "
                f"{root / 'wnids.txt'}) does not exist. {_HINT}"
            )
        files = _image_files(folder)
        if not files:
            raise DataError(
                f"Tiny ImageNet training folder {folder} for class {wnid!r} holds no .JPEG images."
            )
        for path in files:
            images.append(_load_image(path, size))
            labels.append(label)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def _read_val(root: Path, wnids: list[str], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Read the validation split from ``val/val_annotations.txt``.

    Args:
        root: The dataset root.
        wnids: The class ids; a class's label is its index here.
        size: The image side length.

    Returns:
        ``(images, labels)`` sorted by file name.

    Raises:
        DataError: If the annotation file is missing or has a malformed line, an unknown wnid or
            a repeated file name, or an image is missing or does not decode.
    """
    index = {wnid: i for i, wnid in enumerate(wnids)}
    ann_path = root / "val" / "val_annotations.txt"
    image_dir = root / "val" / "images"
    entries: dict[str, int] = {}
    lines_of: dict[str, int] = {}
    for lineno, line in enumerate(_read_text(ann_path, "validation annotation file"), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(
                f"Tiny ImageNet annotation file {ann_path}, line {lineno}, is malformed: "
                f"expected tab-separated fields 'filename, wnid, x0, y0, x1, y1', found "
                f"{line!r}."
            )
        name, wnid = fields[0].strip(), fields[1].strip()
        if wnid not in index:
            raise DataError(
                f"Tiny ImageNet annotation file {ann_path}, line {lineno}, names wnid {wnid!r}, "
                f"which is not in {root / 'wnids.txt'}."
            )
        if name in entries:
            raise DataError(
                f"Tiny ImageNet annotation file {ann_path} lists {name!r} twice, on lines "
                f"{lines_of[name]} and {lineno}."
            )
        if Path(name).name != name:
            raise DataError(
                f"Tiny ImageNet annotation file {ann_path}, line {lineno}, names {name!r}, "
                "which is not a plain file name."
            )
        entries[name] = index[wnid]
        lines_of[name] = lineno
    if not entries:
        raise DataError(f"Tiny ImageNet annotation file {ann_path} lists no images.")
    images: list[np.ndarray] = []
    labels: list[int] = []
    for name in sorted(entries):
        path = image_dir / name
        if not path.is_file():
            raise DataError(
                f"Tiny ImageNet annotation file {ann_path}, line {lines_of[name]}, names image "
                f"{name!r}, but {path} does not exist."
            )
        images.append(_load_image(path, size))
        labels.append(entries[name])
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def read_tiny_imagenet(
    folder: str | os.PathLike[str], image_size: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Read the labelled splits of Tiny ImageNet.

    Args:
        folder: The dataset root (holding ``wnids.txt``, ``train/`` and ``val/``) or its parent
            holding ``tiny-imagenet-200/``.
        image_size: The side length S of the returned images; images of another size are
            resized bilinearly.

    Returns:
        ``(train_images, train_labels, val_images, val_labels, wnids)``: ``uint8`` images of
        shape ``(n, 3, S, S)`` (RGB), ``int64`` labels that index ``wnids`` (the order of
        ``wnids.txt``). Training images are ordered by class, then file name; validation images
        by file name.

    Raises:
        ConfigError: If ``image_size`` is not a positive integer.
        DataError: If ``wnids.txt``, a class folder, the annotation file or an annotated image
            is missing, an annotation line is malformed or names an unknown wnid, or an image
            does not decode.
    """
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0:
        raise ConfigError(
            f"Tiny ImageNet image size must be a positive integer, got {image_size!r}."
        )
    root = _resolve_folder(Path(folder))
    wnids = _read_wnids(root)
    train_images, train_labels = _read_train(root, wnids, image_size)
    val_images, val_labels = _read_val(root, wnids, image_size)
    return train_images, train_labels, val_images, val_labels, wnids
