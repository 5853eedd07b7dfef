"""Tests of the dataset registry and the checked downloader, without any network access."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import tarfile
import urllib.error
from pathlib import Path
from typing import Any

import pytest

from slate.data import download
from slate.data.download import OFFICIAL_FILES, RemoteFile, ensure_files
from slate.errors import DataError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MANIFEST = SHARED / "MANIFEST.tsv"
CONTENT = b"+1 1:1 2:0.5\n-1 3:2\n"
CONTENT_SHA = hashlib.sha256(CONTENT).hexdigest()


def _no_network(url: str, timeout: float) -> Any:
    raise AssertionError(f"unexpected network access to {url}")


def _serve(tmp_path: Path, name: str, data: bytes) -> str:
    """Put ``data`` in a 'server' folder and return its file:// URL."""
    server = tmp_path / "server"
    server.mkdir(exist_ok=True)
    (server / name).write_bytes(data)
    return (server / name).as_uri()


def _register(monkeypatch: pytest.MonkeyPatch, files: list[RemoteFile]) -> None:
    monkeypatch.setitem(OFFICIAL_FILES, "toy", files)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part"))


# ----------------------------------------------------------------------------- registry


def test_registry_shape() -> None:
    assert set(OFFICIAL_FILES) >= {"w7a", "w8a", "mnist", "fashion-mnist", "cifar10"}
    base = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
    assert [f.url for f in OFFICIAL_FILES["w7a"] + OFFICIAL_FILES["w8a"]] == [
        base + n for n in ("w7a", "w7a.t", "w8a", "w8a.t")
    ]
    assert [f.sha256 for f in OFFICIAL_FILES["w8a"]] == [None, None]
    assert all(f.fmt == "libsvm" for f in OFFICIAL_FILES["w8a"])
    (cifar,) = OFFICIAL_FILES["cifar10"]
    assert cifar.md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert set(cifar.members) == {
        *(f"data_batch_{i}.bin" for i in range(1, 6)),
        "test_batch.bin",
    }
    for files in OFFICIAL_FILES.values():
        for f in files:
            assert f.url.startswith(("https://", "http://"))
            assert f.url.rsplit("/", 1)[1] == f.filename
            assert f.sha256 is None or len(f.sha256) == 64


@pytest.mark.skipif(not MANIFEST.exists(), reason="shared MANIFEST.tsv not present")
def test_registry_hashes_match_manifest() -> None:
    with MANIFEST.open(newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    by_name = {(r["dataset"], Path(r["file"]).name): r["uncompressed_sha256"] for r in rows}
    checked = 0
    for dataset in ("w7a", "mnist", "fashion-mnist"):
        for f in OFFICIAL_FILES[dataset]:
            key = (dataset, f.filename if f.filename.endswith(".gz") else f.filename + ".gz")
            assert f.sha256 == by_name[key]
            checked += 1
    assert checked == 10


@pytest.mark.skipif(not (SHARED / "w7a").exists(), reason="shared w7a not present")
def test_shared_w7a_content_has_registered_hash() -> None:
    for f in OFFICIAL_FILES["w7a"]:
        content = gzip.decompress((SHARED / "w7a" / f"{f.filename}.gz").read_bytes())
        assert hashlib.sha256(content).hexdigest() == f.sha256


@pytest.mark.skipif(not SHARED.exists(), reason="shared data folder not present")
@pytest.mark.parametrize("dataset", ["w7a", "w8a", "mnist", "fashion-mnist"])
def test_shared_folder_is_accepted_as_is(dataset: str) -> None:
    # The shared copies are all '.gz'; w8a lacks the optional w8a.t.
    if not (SHARED / dataset).is_dir():
        pytest.skip(f"shared {dataset} not present")
    assert ensure_files(dataset, SHARED, download=False, opener=_no_network) == SHARED / dataset


# ----------------------------------------------------------------------------- presence


@pytest.mark.parametrize(
    ("registered", "on_disk"),
    [("w.txt", "w.txt"), ("w.txt", "w.txt.gz"), ("w.gz", "w.gz"), ("w.gz", "w")],
)
def test_plain_or_gz_name_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registered: str, on_disk: str
) -> None:
    _register(monkeypatch, [RemoteFile("https://example.invalid/" + registered, registered, None)])
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / on_disk).write_bytes(b"x")
    assert ensure_files("toy", tmp_path, download=False, opener=_no_network) == tmp_path / "toy"


def test_missing_file_suggests_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register(
        monkeypatch,
        [
            RemoteFile("https://example.invalid/a.txt", "a.txt", None),
            RemoteFile("https://example.invalid/b.gz", "b.gz", None),
            RemoteFile("https://example.invalid/c.txt", "c.txt", None, required=False),
        ],
    )
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "b").write_bytes(b"present without .gz")
    with pytest.raises(DataError) as info:
        ensure_files("toy", tmp_path, download=False, opener=_no_network)
    message = str(info.value)
    assert str(tmp_path / "toy" / "a.txt") in message
    assert "a.txt.gz" in message
    assert "b.gz" not in message and "c.txt" not in message  # present / optional
    assert "--download" in message and "--data-dir" in message
    assert not any(tmp_path.joinpath("toy").glob("*.part"))


def test_unknown_dataset(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"Unknown dataset 'nope'.*w7a"):
        ensure_files("nope", tmp_path, download=True, opener=_no_network)


# ----------------------------------------------------------------------------- download


@pytest.mark.parametrize("served_gz", [False, True])
def test_download_verifies_uncompressed_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served_gz: bool
) -> None:
    name = "toy.svm.gz" if served_gz else "toy.svm"
    # Recompressed with other settings than any "official" copy: the content hash still holds.
    data = gzip.compress(CONTENT, compresslevel=1) if served_gz else CONTENT
    url = _serve(tmp_path, name, data)
    _register(monkeypatch, [RemoteFile(url, name, CONTENT_SHA)])
    folder = ensure_files("toy", tmp_path / "data", download=True)  # real urlopen on file://
    assert (folder / name).read_bytes() == data
    assert _leftovers(folder) == []
    # A second call finds the file and does not download again.
    assert ensure_files("toy", tmp_path / "data", download=True, opener=_no_network) == folder


def test_hash_mismatch_deletes_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _serve(tmp_path, "toy.svm", CONTENT + b"+1 4:1\n")
    _register(monkeypatch, [RemoteFile(url, "toy.svm", CONTENT_SHA)])
    with pytest.raises(DataError) as info:
        ensure_files("toy", tmp_path / "data", download=True)
    message = str(info.value)
    assert url in message and CONTENT_SHA in message
    assert hashlib.sha256(CONTENT + b"+1 4:1\n").hexdigest() in message
    folder = tmp_path / "data" / "toy"
    assert list(folder.iterdir()) == []


def test_corrupt_gzip_download_is_rejected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _serve(tmp_path, "toy.gz", gzip.compress(CONTENT)[:-10])
    _register(monkeypatch, [RemoteFile(url, "toy.gz", CONTENT_SHA)])
    with pytest.raises(DataError, match="corrupt gzip"):
        ensure_files("toy", tmp_path / "data", download=True)
    assert list((tmp_path / "data" / "toy").iterdir()) == []


def test_network_failure_names_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def failing(url: str, timeout: float) -> Any:
        seen.update(url=url, timeout=timeout)
        raise urllib.error.URLError("Name or service not known")

    _register(monkeypatch, [RemoteFile("https://example.invalid/x.txt", "x.txt", CONTENT_SHA)])
    with pytest.raises(DataError) as info:
        ensure_files("toy", tmp_path, download=True, opener=failing)
    assert "https://example.invalid/x.txt" in str(info.value)
    assert "Name or service not known" in str(info.value)
    assert seen == {"url": "https://example.invalid/x.txt", "timeout": 60}
    assert list((tmp_path / "toy").iterdir()) == []


def test_missing_remote_file_is_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = (tmp_path / "server" / "absent.txt").as_uri()
    _register(monkeypatch, [RemoteFile(url, "absent.txt", CONTENT_SHA)])
    with pytest.raises(DataError, match="Could not download"):
        ensure_files("toy", tmp_path / "data", download=True)


def test_no_published_hash_parses_and_prints_sha(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _register(monkeypatch, [RemoteFile("https://x.invalid/w", "w", None, fmt="libsvm")])
    folder = ensure_files(
        "toy", tmp_path, download=True, opener=lambda u, timeout: io.BytesIO(CONTENT)
    )
    assert (folder / "w").read_bytes() == CONTENT
    assert CONTENT_SHA in capsys.readouterr().err


def test_no_published_hash_rejects_unparsable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(monkeypatch, [RemoteFile("https://x.invalid/w", "w", None, fmt="libsvm")])
    page = b"<html>\n<body>Not Found</body>\n</html>\n"
    with pytest.raises(DataError, match=r"https://x\.invalid/w is not a valid LIBSVM file"):
        ensure_files("toy", tmp_path, download=True, opener=lambda u, timeout: io.BytesIO(page))
    assert list((tmp_path / "toy").iterdir()) == []


# ----------------------------------------------------------------------------- tar archives

MEMBERS = ("a.bin", "b.bin", "meta.txt")


def _tar(entries: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """Build a .tar.gz; each entry is (name, data, type) with data None for links/folders."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, kind in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = "/etc/passwd"
            if data is None:
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _register_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, archive: bytes) -> str:
    url = _serve(tmp_path, "archive.tar.gz", archive)
    md5 = hashlib.md5(archive).hexdigest()
    _register(monkeypatch, [RemoteFile(url, "archive.tar.gz", None, md5=md5, members=MEMBERS)])
    return url


def _good_entries() -> list[tuple[str, bytes | None, bytes]]:
    return [
        ("batches", None, tarfile.DIRTYPE),
        ("batches/a.bin", b"AAAA", tarfile.REGTYPE),
        ("batches/b.bin", b"BB", tarfile.REGTYPE),
        ("batches/meta.txt", b"cat\ndog\n", tarfile.REGTYPE),
        ("batches/readme.html", b"<p>ignored</p>", tarfile.REGTYPE),
    ]


def test_tar_extracts_only_wanted_members(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register_tar(tmp_path, monkeypatch, _tar(_good_entries()))
    folder = ensure_files("toy", tmp_path / "data", download=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(MEMBERS)
    assert (folder / "a.bin").read_bytes() == b"AAAA"
    assert (folder / "meta.txt").read_bytes() == b"cat\ndog\n"
    assert ensure_files("toy", tmp_path / "data", download=False) == folder


def test_tar_md5_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = _tar(_good_entries())
    url = _serve(tmp_path, "archive.tar.gz", archive)
    _register(monkeypatch, [RemoteFile(url, "archive.tar.gz", None, md5="0" * 32, members=MEMBERS)])
    pattern = f"expected MD5 {'0' * 32}.*{hashlib.md5(archive).hexdigest()}"
    with pytest.raises(DataError, match=pattern):
        ensure_files("toy", tmp_path / "data", download=True)
    assert list((tmp_path / "data" / "toy").iterdir()) == []


@pytest.mark.parametrize(
    ("bad_entry", "reason"),
    [
        (("../a.bin", b"evil", tarfile.REGTYPE), "'..'"),
        (("batches/../../a.bin", b"evil", tarfile.REGTYPE), "'..'"),
        (("/tmp/a.bin", b"evil", tarfile.REGTYPE), "absolute path"),
        (("batches/b.bin", None, tarfile.SYMTYPE), "is a link"),
        (("batches/evil_link", None, tarfile.LNKTYPE), "is a link"),
        (("batches/fifo", None, tarfile.FIFOTYPE), "not a regular file"),
    ],
)
def test_tar_rejects_unsafe_members(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bad_entry: tuple[str, bytes | None, bytes],
    reason: str,
) -> None:
    entries = _good_entries()
    entries.insert(2, bad_entry)
    _register_tar(tmp_path, monkeypatch, _tar(entries))
    with pytest.raises(DataError) as info:
        ensure_files("toy", tmp_path / "data", download=True)
    assert "unsafe" in str(info.value) and reason in str(info.value)
    assert repr(bad_entry[0]) in str(info.value)
    assert list((tmp_path / "data" / "toy").iterdir()) == []  # nothing extracted, archive gone
    assert not (tmp_path / "data" / "a.bin").exists()
    assert not (tmp_path / "a.bin").exists()


def test_tar_missing_member(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [e for e in _good_entries() if not e[0].endswith("b.bin")]
    _register_tar(tmp_path, monkeypatch, _tar(entries))
    with pytest.raises(DataError, match=r"lacks b\.bin"):
        ensure_files("toy", tmp_path / "data", download=True)
    assert list((tmp_path / "data" / "toy").iterdir()) == []


def test_tar_corrupt_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _register_tar(tmp_path, monkeypatch, b"this is not a tar archive at all" * 20)
    with pytest.raises(DataError, match="Cannot extract"):
        ensure_files("toy", tmp_path / "data", download=True)
    assert list((tmp_path / "data" / "toy").iterdir()) == []


def test_default_timeout_is_60_seconds() -> None:
    assert download.DOWNLOAD_TIMEOUT_S == 60


def test_mnist_dotted_names_are_accepted(tmp_path: Path) -> None:
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in ("train-images", "train-labels", "t10k-images", "t10k-labels"):
        kind = "idx3" if "images" in name else "idx1"
        (folder / f"{name}.{kind}-ubyte").write_bytes(b"")
    assert ensure_files("mnist", tmp_path, download=False) == folder
    (folder / "t10k-labels.idx1-ubyte").unlink()
    with pytest.raises(DataError, match="t10k-labels"):
        ensure_files("mnist", tmp_path, download=False)
