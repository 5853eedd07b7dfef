"""The evaluation average's algebra in a real 4-site roster run on a ring, from what the sites
opened (``SLATE_RECORD_OPENED``): every site warns once at start, and N times the average site 0
saved, minus its own message and its two neighbours' of the last round, is site 2's message, which
site 0 never received. Masks hide each site's share of the sum; they cannot hide this."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    start_party,
    write_sites,
)

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

FLAGS = ["--nodes", "4", *SITE_FLAGS, "--iterations", "10", "--eval-every", "10",
         "--topology", "ring"]  # fmt: skip
WARNING = "the evaluation average gives single sites' models away"


def _last_message(root: Path, receiver: int, sender: int, size: int) -> np.ndarray:
    """The model in the last gossip message ``receiver`` opened from ``sender`` (iteration 9's:
    ``size`` float32 values, then the message's last element, its flags)."""
    opened = [p for p in (root / "opened" / f"rank{receiver}").glob(f"from{sender}-*-gossip.bin")
              if p.stat().st_size >= 4 * size]  # fmt: skip
    last = max(opened, key=lambda p: int(p.name.split("-")[1]))
    return np.frombuffer(last.read_bytes()[: 4 * size], dtype="<f4").astype(np.float64)


@pytest.mark.processes
def test_on_a_ring_of_4_every_site_warns_and_site_0_recovers_site_2s_model(tmp_path):
    root = tmp_path
    write_sites(root, parties=4, rows=300)
    roster = make_roster(root, 4)
    env = {"SLATE_RECORD_OPENED": str(root / "opened")}
    port = free_port()
    parties = [
        start_party(root, r, port, *FLAGS, *identity_flags(roster, r), env=env) for r in range(4)
    ]
    ends = finish(parties, timeout=240)
    for rank, (code, out) in enumerate(ends):
        assert code == 0, out
        assert sum(WARNING in line for line in out.splitlines()) == 1, (rank, out)
        assert "site 0 recovers site 2's model" in out
    saved = torch.load(root / "site0" / "run" / "model.pt", weights_only=True)
    average = np.concatenate([v.reshape(-1).double().numpy() for v in saved.values()])
    size = average.size  # (the MLP's parameters: the saved average is the last evaluation's)
    z1, z3 = _last_message(root, 0, 1, size), _last_message(root, 0, 3, size)
    z0 = _last_message(root, 1, 0, size)  # site 0's own message, as site 1 opened it
    z2 = _last_message(root, 1, 2, size)  # the truth: site 2's, which only 1 and 3 opened
    recovered = 4 * average - z0 - z1 - z3
    error = np.linalg.norm(recovered - z2) / np.linalg.norm(z2)
    assert error < 1e-6, error  # (measured 1.5e-7: the masked average's fixed point, float32)
    assert np.linalg.norm(z2 - z1) / np.linalg.norm(z2) > 1e-4  # the models differ (5.8e-3)
