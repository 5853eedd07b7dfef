"""Tests of slate.topology: builders, validation, the federated schedule, files, printing."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slate.errors import TopologyError
from slate.topology import (
    TOPOLOGY_NAMES,
    Topology,
    build_topology,
    describe,
    erdos_renyi,
    exponential,
    federated,
    format_matrix,
    from_file,
    full,
    mixing_rate,
    ring,
    spectral_gap,
    star,
    torus,
    validate,
)

SIZES = (1, 2, 3, 4, 5, 9, 16, 20, 33)
BUILDERS: dict[str, Callable[[int], np.ndarray]] = {
    "ring": ring,
    "full": full,
    "star": star,
    "torus": torus,
    "exponential": exponential,
    "erdos-renyi": erdos_renyi,
}


def lambda_by_eigvalsh(W: np.ndarray) -> float:
    """Second largest |eigenvalue| of a symmetric W, removing the eigenvalue 1 once."""
    eig = np.linalg.eigvalsh(W)
    k = int(np.argmin(np.abs(eig - 1.0)))
    assert abs(eig[k] - 1.0) < 1e-9
    rest = np.delete(eig, k)
    return float(np.max(np.abs(rest))) if rest.size else 0.0


def lambda_by_norm(W: np.ndarray) -> float:
    n = W.shape[0]
    return float(np.linalg.norm(W - np.ones((n, n)) / n, 2))


def degrees(W: np.ndarray) -> list[int]:
    off = W > 0
    np.fill_diagonal(off, False)
    return [int(d) for d in off.sum(axis=1)]


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", list(BUILDERS))
def test_builder_is_a_valid_mixing_matrix(name: str, n: int) -> None:
    W = BUILDERS[name](n)
    assert W.dtype == np.float64
    assert W.shape == (n, n)
    assert np.allclose(W, W.T, atol=1e-12)
    assert (W >= 0).all()
    assert np.allclose(W.sum(axis=0), 1.0, atol=1e-12)
    assert np.allclose(W.sum(axis=1), 1.0, atol=1e-12)
    lam = mixing_rate(W)
    assert lam < 1 - 1e-9  # connected
    assert lam == pytest.approx(lambda_by_eigvalsh(W), abs=1e-9)
    assert lam == pytest.approx(lambda_by_norm(W), abs=1e-12)
    assert spectral_gap(W) == pytest.approx(1.0 - lam)
    np.testing.assert_array_equal(validate(W), W)
    topo = build_topology(name, n)
    np.testing.assert_array_equal(topo.W, W)
    assert topo.lam == pytest.approx(lam)
    assert topo.effective_lambda == topo.lam


def test_paper_ring_closed_form() -> None:
    W = ring(20)
    assert mixing_rate(W) == pytest.approx((1 + 2 * math.cos(2 * math.pi / 20)) / 3, abs=1e-12)
    assert W[0, 0] == W[0, 1] == W[0, 19] == pytest.approx(1 / 3)
    assert W[0, 2] == 0


def test_small_rings() -> None:
    np.testing.assert_array_equal(ring(1), [[1.0]])
    np.testing.assert_array_equal(ring(2), [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(ring(3), np.full((3, 3), 1 / 3))


def test_full_is_exact_average() -> None:
    np.testing.assert_array_equal(full(4), np.full((4, 4), 0.25))
    assert mixing_rate(full(7)) == pytest.approx(0.0, abs=1e-12)


def test_star_weights() -> None:
    W = star(5)
    assert degrees(W) == [4, 1, 1, 1, 1]
    assert W[0, 1] == pytest.approx(1 / 5)
    assert W[1, 1] == pytest.approx(4 / 5)
    assert mixing_rate(W) == pytest.approx(1 - 1 / 5)


def test_degrees_for_16_nodes() -> None:
    assert degrees(exponential(16)) == [7] * 16  # +-1, +-2, +-4, 8
    assert degrees(torus(16)) == [4] * 16  # 4 x 4 grid
    W = torus(16)
    assert W[0, 1] == W[0, 3] == W[0, 4] == W[0, 12] == pytest.approx(1 / 5)
    assert W[0, 0] == pytest.approx(1 / 5)


def test_torus_shapes() -> None:
    assert degrees(torus(4)) == [2] * 4  # 2 x 2: coinciding neighbours de-duplicated
    assert degrees(torus(5)) == [2] * 5  # prime: a 1 x 5 ring
    assert degrees(torus(2)) == [1, 1]
    assert degrees(torus(20)) == [4] * 20  # 4 x 5


def test_exponential_neighbours() -> None:
    W = exponential(10)
    assert {r for r in range(10) if W[0, r] > 0 and r != 0} == {1, 2, 4, 6, 8, 9}


def test_erdos_renyi_reproducible() -> None:
    a = erdos_renyi(20, seed=3)
    b = erdos_renyi(20, seed=3)
    c = erdos_renyi(20, seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    np.testing.assert_array_equal(build_topology("erdos-renyi", 20, seed=3).W, a)


def test_erdos_renyi_probability() -> None:
    np.testing.assert_allclose(erdos_renyi(6, p=1.0), np.full((6, 6), 1 / 6))
    with pytest.raises(TopologyError, match="probability"):
        erdos_renyi(5, p=0.0)
    with pytest.raises(TopologyError, match="probability"):
        build_topology("erdos-renyi", 5, er_probability=1.5)
    with pytest.raises(TopologyError, match="connected"):
        erdos_renyi(30, p=1e-4)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(TopologyError, match="number of nodes"):
        ring(bad)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="number of nodes"):
        build_topology("full", bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Topology, federated schedule
# ---------------------------------------------------------------------------------------------


def test_federated_schedule() -> None:
    topo = build_topology("federated", 4, fed_period=3)
    assert topo.period == 3
    np.testing.assert_array_equal(topo.W, np.eye(4))
    J = np.full((4, 4), 0.25)
    for t in range(9):
        averaging = (t + 1) % 3 == 0
        assert topo.is_full_average_at(t) == averaging
        np.testing.assert_array_equal(topo.matrix_at(t), J if averaging else np.eye(4))
    assert topo.neighbours(0) == []
    assert topo.lam == pytest.approx(1.0)
    assert topo.effective_lambda == pytest.approx(0.0, abs=1e-12)
    assert federated(4).period == 10
    every = federated(3, period=1)
    assert all(every.is_full_average_at(t) for t in range(5))


def test_federated_bad_period() -> None:
    with pytest.raises(TopologyError, match="period"):
        build_topology("federated", 4, fed_period=0)


def test_non_federated_schedule_and_neighbours() -> None:
    topo = build_topology("ring", 5)
    assert topo.period is None
    assert not any(topo.is_full_average_at(t) for t in range(20))
    assert topo.matrix_at(7) is topo.W
    assert topo.neighbours(0) == [(1, pytest.approx(1 / 3)), (4, pytest.approx(1 / 3))]
    assert topo.spectral_gap == pytest.approx(1 - topo.lam)
    assert build_topology("full", 5).is_full_average_at(0)
    assert build_topology("ring", 1).is_full_average_at(0)
    with pytest.raises(IndexError):
        topo.neighbours(5)
    with pytest.raises(ValueError):
        topo.matrix_at(-1)


def test_topology_is_read_only_and_validated() -> None:
    topo = build_topology("torus", 9)
    with pytest.raises(ValueError):
        topo.W[0, 0] = 1.0
    with pytest.raises(TopologyError, match="connected"):
        Topology(name="identity", W=np.eye(3))
    assert Topology(name="identity-fed", W=np.eye(3), period=2).effective_lambda == 0.0


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(TopologyError) as info:
        build_topology("hypercube", 8)
    for name in TOPOLOGY_NAMES:
        assert name in str(info.value)
    assert "file:" in str(info.value)


def test_names_case_insensitive() -> None:
    assert build_topology(" Ring ", 4).name == "ring"


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("W", "needle"),
    [
        (np.full((2, 3), 1 / 3), "square"),
        (np.ones(3), "square"),
        (np.array([[1.2, -0.2], [-0.2, 1.2]]), "negative"),
        (np.array([[0.5, 0.5], [0.2, 0.8]]), "symmetric"),
        (np.array([[0.5, 0.4], [0.4, 0.5]]), "row 0 sums to 0.9"),
        (np.array([[1.0, 0.0], [0.0, 1.0]]), "not connected"),
        (np.array([[0.0, 1.0], [1.0, 0.0]]), "periodic"),
        (np.array([[np.nan, 1.0], [1.0, 0.0]]), "finite"),
        (np.array([["a", "b"], ["c", "d"]]), "real numbers"),
    ],
)
def test_validate_failures(W: np.ndarray, needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        validate(W)


def test_validate_worst_row_and_tolerance() -> None:
    W = ring(6)
    W[3, 3] -= 0.1
    W[2, 2] -= 0.01
    with pytest.raises(TopologyError, match=r"row 3 sums to 0\.9"):
        validate(W, atol=1e-3)
    assert validate([[1]]).shape == (1, 1)
    ok = ring(4) + 1e-8
    np.fill_diagonal(ok, ok.diagonal() - 4e-8)
    validate(ok)


def test_validate_names_the_matrix() -> None:
    with pytest.raises(TopologyError, match="mymatrix"):
        validate(np.eye(2) * 2, name="mymatrix")


# ---------------------------------------------------------------------------------------------
# files
# ---------------------------------------------------------------------------------------------


def test_npy_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "W.npy"
    np.save(path, torus(9))
    np.testing.assert_array_equal(from_file(path), torus(9))
    topo = build_topology(f"file:{path}", 9)
    assert topo.name == f"file:{path}"
    np.testing.assert_array_equal(topo.W, torus(9))


@pytest.mark.parametrize("sep", [",", " ", "\t", ", "])
def test_csv_roundtrip(tmp_path: Path, sep: str) -> None:
    W = exponential(7)
    path = tmp_path / "W.csv"
    lines = ["# a comment", ""] + [sep.join(repr(float(v)) for v in row) for row in W]
    path.write_text("\n".join(lines) + "\n")
    np.testing.assert_array_equal(from_file(path), W)
    txt = tmp_path / "W.TXT"
    np.savetxt(txt, W)
    np.testing.assert_allclose(build_topology(f"file:{txt}", 7).W, W, atol=1e-15)


@pytest.mark.parametrize(
    ("matrix", "needle"),
    [
        (np.full((2, 3), 1 / 3), "square"),
        (np.array([[1.2, -0.2], [-0.2, 1.2]]), "negative"),
        (np.array([[0.5, 0.5], [0.2, 0.8]]), "symmetric"),
        (np.array([[0.5, 0.4], [0.4, 0.5]]), "sums to"),
        (np.kron(np.eye(2), np.full((2, 2), 0.5)), "not connected"),
    ],
)
@pytest.mark.parametrize("suffix", [".npy", ".csv"])
def test_invalid_matrix_files(tmp_path: Path, matrix: np.ndarray, needle: str, suffix: str) -> None:
    path = tmp_path / f"bad{suffix}"
    if suffix == ".npy":
        np.save(path, matrix)
    else:
        np.savetxt(path, matrix, delimiter=",")
    with pytest.raises(TopologyError, match=needle) as info:
        from_file(path)
    assert str(path) in str(info.value)


def test_pickled_npy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"w": 1.0}, None], dtype=object), allow_pickle=True)
    with pytest.raises(TopologyError, match="never unpickled"):
        from_file(path)
    raw = tmp_path / "raw.npy"
    raw.write_bytes(pickle.dumps(np.eye(2)))
    with pytest.raises(TopologyError, match=r"not a NumPy \.npy file"):
        from_file(raw)


def test_truncated_npy(tmp_path: Path) -> None:
    path = tmp_path / "cut.npy"
    np.save(path, ring(5))
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(TopologyError, match="truncated"):
        from_file(path)


def test_file_read_errors(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match=r"missing\.csv"):
        from_file(tmp_path / "missing.csv")
    empty = tmp_path / "empty.csv"
    empty.write_text("# nothing\n\n")
    with pytest.raises(TopologyError, match="empty"):
        from_file(empty)
    words = tmp_path / "words.csv"
    words.write_text("0.5,0.5\n0.5,half\n")
    with pytest.raises(TopologyError, match=r"line 2, field 2 \('half'\)"):
        from_file(words)
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("0.5,0.5\n1\n")
    with pytest.raises(TopologyError, match=r"line 2 has 1 number\(s\) but line 1 has 2"):
        from_file(ragged)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TopologyError, match="UTF-8"):
        from_file(binary)
    other = tmp_path / "W.json"
    other.write_text("[[1]]")
    with pytest.raises(TopologyError, match="suffix"):
        from_file(other)
    np.save(tmp_path / "empty.npy", np.zeros((0, 0)))
    with pytest.raises(TopologyError, match="empty"):
        from_file(tmp_path / "empty.npy")


def test_file_shape_must_match_nodes(tmp_path: Path) -> None:
    path = tmp_path / "W.csv"
    np.savetxt(path, ring(5), delimiter=",")
    with pytest.raises(TopologyError) as info:
        build_topology(f"file:{path}", 6)
    message = str(info.value)
    assert str(path) in message and "(5, 5)" in message and "--nodes" in message
    with pytest.raises(TopologyError, match="names no file"):
        build_topology("file:", 6)


_NUMERIC_TEXT = st.text(alphabet="0123456789.,-+e \n\t#", max_size=120)
_NPY_LIKE = st.binary(max_size=200).map(lambda b: b"\x93NUMPY\x01\x00" + b)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    payload=st.one_of(st.binary(max_size=300), _NPY_LIKE, _NUMERIC_TEXT.map(str.encode)),
    suffix=st.sampled_from([".csv", ".txt", ".npy"]),
)
def test_random_files_never_crash(tmp_path: Path, payload: bytes, suffix: str) -> None:
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(payload)
    try:
        W = from_file(path)
    except TopologyError:
        return
    validate(W)


# ---------------------------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------------------------


def test_describe() -> None:
    text = describe(build_topology("ring", 20))
    assert "ring" in text and "20" in text
    assert f"{(1 + 2 * math.cos(2 * math.pi / 20)) / 3:.6f}" in text
    assert "degree" in text and "spectral gap" in text
    fed = describe(build_topology("federated", 4, fed_period=5))
    assert "period" in fed and "5" in fed
    assert "-0.0" not in fed


def test_format_matrix() -> None:
    assert format_matrix(ring(3)).splitlines() == ["0.3333 0.3333 0.3333"] * 3
    big = format_matrix(ring(40)).splitlines()
    assert "40 x 40" in big[0]
    assert len(big) == 33
    assert len(big[1].split()) == 32
