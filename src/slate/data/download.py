"""Registry of the official dataset files, and a checked, atomic downloader.

Every dataset lives in its own folder ``DATA_DIR/<dataset>/``. :func:`ensure_files` checks that
the expected files are there and, if asked to, downloads the missing ones from their official
URLs, verifies their checksums and only then moves them into place, so that a folder never holds
a partial or unverified file under its final name.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from slate.data.readers.libsvm import read_libsvm
from slate.errors import DataError

__all__ = ["DOWNLOAD_TIMEOUT_S", "OFFICIAL_FILES", "RemoteFile", "ensure_files"]

#: Seconds to wait for the server before a download is given up.
DOWNLOAD_TIMEOUT_S = 60.0

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20

Opener = Callable[..., IO[bytes]]
"""A function called as ``opener(url, timeout=...)`` that returns a readable binary response
usable as a context manager; :func:`urllib.request.urlopen` by default."""


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset: where to get it, where to put it and how to check it.

    Attributes:
        url: The official download URL.
        filename: The file's name inside the dataset folder. A file is also accepted when
            present under the same name with ``.gz`` added (or, for a ``.gz`` name, removed).
        sha256: The SHA-256 of the file's *uncompressed* content (a gzip download is
            decompressed before hashing), so that a copy compressed with other settings still
            verifies. ``None`` means that no hash is published: a download is then checked by
            the ``md5`` below if there is one, else by parsing it as ``fmt``, and its computed
            SHA-256 is printed on stderr so it can be recorded.
        md5: The MD5 of the file exactly as downloaded (compressed bytes), for the one source
            that publishes nothing else (CIFAR-10).
        fmt: ``"libsvm"`` if the file must parse with :func:`read_libsvm` when it has no
            published hash; ``"raw"`` otherwise.
        members: For a tar archive: the base names of the regular files to extract into the
            dataset folder. The archive itself is deleted afterwards, and the dataset counts
            as present when all these members are.
        required: ``False`` for a file the dataset can do without (the official test split of
            w7a/w8a: without it the loader makes a seeded split of the training file). Such a
            file is fetched with ``--download`` but its absence is not an error otherwise.
    """

    url: str
    filename: str
    sha256: str | None
    md5: str | None = None
    fmt: str = "raw"
    members: tuple[str, ...] = ()
    required: bool = True


_LIBSVM_BINARY = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary"
_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist"
_FASHION = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com"


def _libsvm(name: str, sha256: str | None, *, required: bool = True) -> RemoteFile:
    return RemoteFile(f"{_LIBSVM_BINARY}/{name}", name, sha256, fmt="libsvm", required=required)


def _idx_files(base_url: str, sha256s: Iterable[str]) -> list[RemoteFile]:
    names = (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    )
    return [RemoteFile(f"{base_url}/{n}", n, h) for n, h in zip(names, sha256s, strict=True)]


#: The official files of every dataset the downloader knows, by dataset (= folder) name.
#: w8a and w8a.t have ``sha256=None``: no hash of the official files is published, and the copy
#: in the shared data folder carries an extra trailing empty line, so its hash may differ from
#: the official file's. A download of them is verified by parsing it, and its SHA-256 printed.
OFFICIAL_FILES: dict[str, list[RemoteFile]] = {
    "w7a": [
        _libsvm("w7a", "bd02f445a1a2f4aaefd27d7dcc31f1f6a8521f904157f2ee7c96d1294cd26e36"),
        _libsvm(
            "w7a.t",
            "a52edcfe9871e3b0db5d864959bf32230491ddfeca3334cfec93c1d932ea32b9",
            required=False,
        ),
    ],
    "w8a": [_libsvm("w8a", None), _libsvm("w8a.t", None, required=False)],
    "mnist": _idx_files(
        _MNIST,
        (
            "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        ),
    ),
    "fashion-mnist": _idx_files(
        _FASHION,
        (
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
        ),
    ),
    "cifar10": [
        RemoteFile(
            "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
            "cifar-10-binary.tar.gz",
            None,
            md5="c32a1d4ab5d03f1284b67883e8d87530",
            members=(
                *(f"data_batch_{i}.bin" for i in range(1, 6)),
                "test_batch.bin",
            ),
        )
    ],
}


def ensure_files(
    dataset: str, data_dir: Path, download: bool, *, opener: Opener | None = None
) -> Path:
    """Make sure that every official file of ``dataset`` is in ``data_dir/<dataset>/``.

    A file counts as present under its registered name or with ``.gz`` added or removed.
    Present files are not re-verified. A missing optional file (``required=False``, the w7a/w8a
    test files) is not an error when ``download`` is false. Missing files are downloaded only
    if ``download`` is true: each goes to a temporary file in the dataset folder, is verified (see
    :class:`RemoteFile`) and is then moved into place with :func:`os.replace`; a file that
    fails verification is deleted.

    Args:
        dataset: A key of :data:`OFFICIAL_FILES`, e.g. ``"w8a"``.
        data_dir: The folder that holds one sub-folder per dataset.
        download: Whether missing files may be fetched from the network.
        opener: Called as ``opener(url, timeout=DOWNLOAD_TIMEOUT_S)`` to open a URL;
            :func:`urllib.request.urlopen` if ``None`` (tests pass a fake).

    Returns:
        The dataset folder ``data_dir/<dataset>``.

    Raises:
        DataError: If the dataset is unknown, files are missing and ``download`` is false, a
            download fails, or a downloaded file fails verification.
    """
    if dataset not in OFFICIAL_FILES:
        known = ", ".join(sorted(OFFICIAL_FILES))
        raise DataError(
            f"Unknown dataset {dataset!r}; the datasets that can be fetched are: {known}."
        )
    folder = Path(data_dir) / dataset
    missing = [rf for rf in OFFICIAL_FILES[dataset] if not _is_present(folder, rf)]
    if not download:
        missing = [rf for rf in missing if rf.required]
    if not missing:
        return folder
    if not download:
        wanted = "; ".join(_describe_missing(folder, rf) for rf in missing)
        raise DataError(
            f"Dataset {dataset!r} is incomplete: missing {wanted}. Run again with --download to "
            f"fetch the official files into {folder}, or pass --data-dir pointing to a folder "
            f"that already contains {dataset}/."
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"Cannot create the dataset folder {folder}: {exc.strerror or exc}. Pass a writable "
            "--data-dir."
        ) from None
    for rf in missing:
        _fetch(rf, folder, opener or urllib.request.urlopen)
    return folder


def _candidates(folder: Path, filename: str) -> list[Path]:
    """The paths under which a registered file is accepted."""
    plain = filename[: -len(".gz")] if filename.endswith(".gz") else filename
    names = [plain, plain + ".gz"]
    if "-idx" in plain:  # MNIST's files also circulate as train-images.idx3-ubyte
        dotted = plain.replace("-idx", ".idx")
        names += [dotted, dotted + ".gz"]
    return [folder / name for name in names]


ARCHIVE_SUBFOLDERS = ("cifar-10-batches-bin",)  # where the official archives unpack to


def _is_present(folder: Path, rf: RemoteFile) -> bool:
    if rf.members:
        return any(
            all((base / m).is_file() for m in rf.members)
            for base in (folder, *(folder / sub for sub in ARCHIVE_SUBFOLDERS))
        )
    return any(p.is_file() for p in _candidates(folder, rf.filename))


def _describe_missing(folder: Path, rf: RemoteFile) -> str:
    if rf.members:
        absent = [str(folder / m) for m in rf.members if not (folder / m).is_file()]
        return ", ".join(absent) + f" (extracted from {rf.url})"
    first, *others = _candidates(folder, rf.filename)
    return f"{first} (or {' / '.join(p.name for p in others)})"


def _fetch(rf: RemoteFile, folder: Path, opener: Opener) -> None:
    """Download one file to a temporary name, verify it and move or extract it into place."""
    try:
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{rf.filename}.", suffix=".part")
    except OSError as exc:
        raise DataError(
            f"Cannot create a temporary file in {folder}: {exc.strerror or exc}. Pass a "
            "writable --data-dir."
        ) from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            _download(rf.url, out, opener)
        _verify(rf, tmp)
        if rf.members:
            _extract_members(tmp, folder, rf)
            tmp.unlink()
        else:
            os.replace(tmp, folder / rf.filename)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _download(url: str, out: IO[bytes], opener: Opener) -> None:
    try:
        with opener(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            shutil.copyfileobj(response, out, _CHUNK)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason: Any = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise DataError(
            f"Could not download {url}: {reason}. Check the network connection, or download "
            "the file by hand into the dataset folder and run again without --download."
        ) from None


def _file_digest(path: Path, algorithm: str, *, decompress: bool) -> str:
    """Hash a file's bytes, or its gzip-decompressed content when it is gzip and asked to."""
    h = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as raw:
        is_gzip = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if decompress and is_gzip else raw
        while chunk := stream.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _verify(rf: RemoteFile, tmp: Path) -> None:
    """Check a downloaded file against its registry entry; raise DataError on mismatch."""
    checks = [("MD5", "md5", rf.md5, False), ("SHA-256", "sha256", rf.sha256, True)]
    for label, algorithm, expected, decompress in checks:
        if expected is None:
            continue
        try:
            actual = _file_digest(tmp, algorithm, decompress=decompress)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(
                f"The file downloaded from {rf.url} is a corrupt gzip stream ({exc}); it was "
                "deleted. Try --download again."
            ) from None
        if actual != expected.lower():
            what = "uncompressed content" if decompress else "file"
            raise DataError(
                f"Checksum mismatch for {rf.url}: expected {label} {expected} of the {what}, "
                f"got {actual}. The download was deleted; try again, and if it keeps failing "
                "the server's file has changed."
            )
    if rf.sha256 is None and rf.md5 is None:
        if rf.fmt == "libsvm":
            try:
                read_libsvm(tmp)
            except DataError as exc:
                raise DataError(
                    f"The file downloaded from {rf.url} is not a valid LIBSVM file and was "
                    f"deleted: {exc}"
                ) from None
        try:
            digest = _file_digest(tmp, "sha256", decompress=True)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(
                f"The file downloaded from {rf.url} is a corrupt gzip stream ({exc}); it was "
                "deleted. Try --download again."
            ) from None
        print(
            f"{rf.url}: no published checksum; the file parses, sha256 of its content is {digest}",
            file=sys.stderr,
        )


def _check_member(info: tarfile.TarInfo, url: str) -> None:
    """Reject archive members that could write outside the target folder."""
    name = info.name
    path = PurePosixPath(name.replace("\\", "/"))
    problem = None
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        problem = "has an absolute path"
    elif ".." in path.parts:
        problem = "contains '..'"
    elif info.issym() or info.islnk():
        problem = "is a link"
    elif not (info.isfile() or info.isdir()):
        problem = "is not a regular file or folder"
    if problem is not None:
        raise DataError(
            f"The archive downloaded from {url} is unsafe: member {name!r} {problem}. Nothing "
            "was extracted and the archive was deleted."
        )


def _extract_members(archive: Path, folder: Path, rf: RemoteFile) -> None:
    """Extract the wanted regular files of a tar archive, flattened, into ``folder``."""
    wanted = set(rf.members)
    temps: dict[str, Path] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            found: dict[str, tarfile.TarInfo] = {}
            for info in tar.getmembers():
                _check_member(info, rf.url)
                base = PurePosixPath(info.name).name
                if info.isfile() and base in wanted:
                    if base in found:
                        raise DataError(
                            f"The archive downloaded from {rf.url} holds {base!r} twice "
                            f"({found[base].name!r} and {info.name!r}); nothing was extracted."
                        )
                    found[base] = info
            absent = sorted(wanted - set(found))
            if absent:
                raise DataError(
                    f"The archive downloaded from {rf.url} lacks {', '.join(absent)}; nothing "
                    "was extracted and the archive was deleted."
                )
            for base, info in found.items():
                source = tar.extractfile(info)
                if source is None:  # pragma: no cover - regular files always have data
                    raise DataError(f"Cannot read {info.name!r} from the archive of {rf.url}.")
                fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=".part")
                temps[base] = Path(tmp_name)
                with source, os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
        for base, tmp in temps.items():
            os.replace(tmp, folder / base)
        temps.clear()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(
            f"Cannot extract the archive downloaded from {rf.url}: {exc}. It was deleted; try "
            "--download again."
        ) from None
    finally:
        for tmp in temps.values():
            with contextlib.suppress(OSError):
                tmp.unlink()
