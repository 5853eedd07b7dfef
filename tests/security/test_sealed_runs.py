"""Sealed gossip in real multi-process runs under ``--roster`` (issue 30): sealing changes no
number, a flipped byte is refused naming its sender, and nothing crosses in clear."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    free_port,
    identity_flags,
    make_roster,
    start_party,
    write_sites,
)

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

FLAGS = ["--nodes", "3", *SITE_FLAGS, "--iterations", "60", "--topology", "ring"]


def run_sites(root, roster, *extra, env=None):
    port = free_port()
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        parties = [
            start_party(
                root, r, port, *FLAGS, *extra, *(identity_flags(roster, r) if roster else [])
            )
            for r in range(3)
        ]
    finally:
        os.environ.clear()
        os.environ.update(old)
    done = []
    for party in parties:
        try:
            out, err = party.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            party.kill()
            out, err = party.communicate()
        done.append((party.returncode, out + err))
    return done


def model(root):
    state = torch.load(root / "site0" / "run" / "model.pt", weights_only=False)
    tensors = state if isinstance(state, dict) else {"x": state}
    return {k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)}


def test_sealing_changes_no_number(tmp_path):
    plain, sealed = tmp_path / "plain", tmp_path / "sealed"
    for root in (plain, sealed):
        write_sites(root, parties=3, rows=300)
    roster = make_roster(sealed, 3)
    for code, text in run_sites(plain, None) + run_sites(sealed, roster):
        assert code == 0, text[-3000:]
    a, b = model(plain), model(sealed)
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.allclose(a[name].double(), b[name].double(), rtol=0, atol=1e-6), name


def test_a_flipped_byte_is_refused_naming_its_sender(tmp_path):
    write_sites(tmp_path, parties=3, rows=300)
    roster = make_roster(tmp_path, 3)
    done = run_sites(tmp_path, roster, env={"SLATE_FLIP_SEALED": "1@40"})
    texts = "\n".join(text for _, text in done)
    assert "refused a sealed message from party 1" in texts, texts[-3000:]
    assert any(code != 0 for code, _ in done)
