"""Forward passes of one shape aligned to the rows' indices (:mod:`slate.models.passes`).

The guarantees are checked as the module states them: every pass the model sees has exactly
``chunk`` rows and holds rows ``[k chunk, (k+1) chunk)``; a file fed in pieces of any size gives
the same bits as the whole; a row's logit does not change when the other rows of the file
change, are removed elsewhere in the order, or are appended. Against one plain forward pass of
every row the logits agree to float32 rounding only (another shape may take other kernels).
"""

from __future__ import annotations

import pytest
import torch

from slate.models import MLP, MnistCNN, seeded
from slate.models.passes import EVAL_CHUNK, ChunkedScorer, forward_in_chunks


@pytest.fixture(scope="module")
def mlp() -> MLP:
    with seeded(3):
        model = MLP(300, 64)
    return model.eval()


def _rows(n: int, seed: int = 0, features: int = 300) -> torch.Tensor:
    return torch.randn((n, features), generator=torch.Generator().manual_seed(seed))


class _Recorder:
    """The model, and the rows of every pass it was given."""

    def __init__(self, model) -> None:
        self.model = model
        self.passes: list[torch.Tensor] = []

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        self.passes.append(rows.clone())
        return self.model(rows)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 700])
def test_every_pass_has_one_shape_and_holds_aligned_rows(mlp, n):
    x = _rows(n)
    seen = _Recorder(mlp)
    with torch.no_grad():
        out = forward_in_chunks(seen, x, 256)
    assert out.shape == (n,)
    assert [p.shape for p in seen.passes] == [(256, 300)] * -(-n // 256)
    joined = torch.cat(seen.passes)
    assert torch.equal(joined[:n], x)  # pass k holds rows [256 k, 256 (k + 1))
    assert not joined[n:].any()  # the padding: zero rows, dropped from the output


@pytest.mark.parametrize("pieces", [[700], [1, 300, 399], [256, 0, 444], [37] * 18 + [34]])
def test_pieces_of_any_size_give_the_bits_of_the_whole(mlp, pieces):
    x = _rows(sum(pieces), seed=1)
    scorer = ChunkedScorer(mlp, 256)
    with torch.no_grad():
        whole = forward_in_chunks(mlp, x, 256)
        start = 0
        for size in pieces:
            scorer.add(x[start : start + size])
            start += size
        assert torch.equal(scorer.finish(), whole)


def test_a_rows_logit_does_not_depend_on_the_other_rows(mlp):
    """The same shape at the same position: other values, and fewer or more rows after it."""
    x = _rows(600, seed=2)
    other = _rows(600, seed=3)
    other[::7] = x[::7]  # rows 0, 7, 14, ... shared
    with torch.no_grad():
        base = forward_in_chunks(mlp, x)
        assert torch.equal(forward_in_chunks(mlp, other)[::7], base[::7])
        assert torch.equal(forward_in_chunks(mlp, x[:300]), base[:300])
        longer = torch.cat([x, _rows(50, seed=4)])
        assert torch.equal(forward_in_chunks(mlp, longer)[:600], base)


def test_agrees_with_one_plain_pass_to_float32_rounding(mlp):
    x = _rows(1000, seed=5)
    with torch.no_grad():
        plain = mlp(x)
        chunked = forward_in_chunks(mlp, x)
        in64 = mlp.double()(x.double())
    mlp.float()
    # Bounded: another batch shape may sum a row's products in another order (float32 rounding
    # of sums over 300 and 64 terms, relative ~1e-6 of the logits' magnitude).
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.double(), in64, rtol=1e-5, atol=1e-5)


def test_images_and_empty_inputs():
    with seeded(0):
        cnn = MnistCNN().eval()
    x = torch.rand((300, 1, 28, 28), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        out = forward_in_chunks(cnn, x, 128)
        torch.testing.assert_close(out, cnn(x), rtol=1e-5, atol=1e-5)
        assert forward_in_chunks(cnn, x[:0], 128).shape == (0,)
    assert ChunkedScorer(cnn).finish().shape == (0,)
    assert EVAL_CHUNK == 256
    with pytest.raises(ValueError, match="at least 1"):
        ChunkedScorer(cnn, 0)
