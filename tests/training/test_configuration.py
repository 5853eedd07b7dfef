"""The configuration resolved and checked once, in sections: one ``ResolvedConfig`` per run,
never changed after, which ``train()`` and ``Run`` take without checking anything again."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import slate.training.configuration as configuration
import slate.training.plan as run_plan
from slate.cli import main
from slate.config import TrainConfig
from slate.data.spec import DataSpec
from slate.errors import ConfigError
from slate.training.configuration import as_resolved, resolve_and_check
from slate.training.plan import Place, choose
from slate.training.run import Run


def test_the_sections_carry_the_resolved_flags_and_what_they_derive():
    resolved = resolve_and_check(TrainConfig(dataset="digits", wan="80,100"))
    assert resolved.given.nodes is None and resolved.flags.nodes == 8
    assert resolved.algorithm.config.lr == 0.05 and resolved.algorithm.positives == 4
    assert resolved.algorithm.config.sampled_positive_rate == 4 / 20
    assert resolved.model.device == torch.device("cpu") and resolved.model.name == "mlp"
    assert resolved.communication.wan is not None
    assert resolved.membership.on_party_loss == "continue"
    assert resolved.outputs.checkpoint_every == 100 and resolved.outputs.eval_every is None
    assert resolved.data == DataSpec.from_config(resolved.flags) and resolved.data.nodes == 8
    assert as_resolved(resolved) is resolved
    # What depends on the data and the process is the plan's, filled once; the sections stay.
    choices = choose(resolved, nodes=4)
    assert choices.data.nodes == 4 and resolved.data.nodes == 8
    run = Run(resolved, choices=choices, place=Place(threads=1))
    assert (run.plan.nodes, run.plan.threads, run.flags.nodes) == (4, 1, 4)
    assert run.plan.eval_every == run.flags.eval_every == 50  # T/20: digits' evaluations are cheap
    assert resolved.flags.nodes == 8 and resolved.outputs.eval_every is None


def test_a_bad_flag_is_refused_at_resolution():
    with pytest.raises(ConfigError, match="--iterations"):
        resolve_and_check(TrainConfig(dataset="digits", iterations=0))


def _count(monkeypatch, module, name) -> list[int]:
    calls = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_simulator_run_resolves_and_checks_its_flags_once(tmp_path, monkeypatch):
    resolved = _count(monkeypatch, configuration, "resolve_config")
    checked = _count(monkeypatch, configuration, "check_config")
    code = main(["train", "--dataset", "digits", "--iterations", "4", "--nodes", "2",
                 "--no-progress", "--no-plots", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    assert resolved == [1] and checked == [1]


def _table(path, rows: int = 400, positives: int = 40) -> None:
    rng = np.random.default_rng(0)
    y = np.zeros(rows, dtype=int)
    y[rng.choice(rows, positives, replace=False)] = 1
    lines = ["a,b,y"] + [f"{rng.normal() + t:.4f},{rng.normal():.4f},{t}" for t in y]
    path.write_text("\n".join(lines) + "\n")


def test_the_launcher_reads_a_table_once_to_choose_n_and_check_it(tmp_path, monkeypatch):
    """A table's launch chooses N from its positives, checks the flags and chooses the step size
    (--lr auto, a table's default: candidates of 20 iterations, as many as the run's) from one
    read of the table; the run itself is not started (launch_local is replaced)."""
    import slate.engines.distributed.control.launch as launch_module
    from slate.training.party_process import launch

    _table(tmp_path / "t.csv")
    started = []
    monkeypatch.setattr(launch_module, "launch_local", lambda *args: started.append(args) or 0)
    reads = _count(monkeypatch, run_plan, "load_dataset")  # (plan.whole_rows)
    checks = _count(monkeypatch, configuration, "load_dataset")
    config = TrainConfig(dataset="csv", train=str(tmp_path / "t.csv"), label_column="y",
                         positive_label="1", iterations=20, out=str(tmp_path / "run"))  # fmt: skip
    assert launch(config, [], 5.0) == 0
    assert reads[0] + checks[0] == 1
    forwarded, nodes = started[0][0], started[0][1]
    assert forwarded[-2:] == ["--nodes", str(nodes)] and nodes < 20  # chosen from the table


@pytest.fixture
def torch_threads():
    """The run sets torch's thread count for the process; the suite's own count comes back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_thread_default_is_resolved_recorded_and_changes_no_number(tmp_path, torch_threads):
    """``--threads`` unset resolves to one thread for a small model, recorded
    in summary.json's config; the run's model is the same with 1 and 2 threads, to a bound."""
    common = ["train", "--dataset", "digits", "--iterations", "60", "--nodes", "4",
              "--hidden", "64", "--no-progress", "--no-plots", "--out"]  # fmt: skip
    folders = {}
    for threads in (None, 1, 2):
        out = tmp_path / f"threads-{threads}"
        extra = [] if threads is None else ["--threads", str(threads)]
        assert main([*common, str(out), *extra]) == 0
        config = json.loads((out / "summary.json").read_text())["config"]
        assert config["threads"] == (1 if threads is None else threads)
        assert torch.get_num_threads() == config["threads"]
        folders[threads] = out
    # The unset default is one thread: the same process settings, so the same bytes.
    assert (folders[None] / "model.pt").read_bytes() == (folders[1] / "model.pt").read_bytes()
    # 1 and 2 threads: byte-identical on the machines tried, but not guaranteed, since a kernel
    # may split one sum among the threads (ATen's reductions of 32 768 values or more, MKL's
    # products), which changes its float32 rounding. 60 steps of that stay within 1e-5, the
    # bound the engines are held to (docs/testing.md, "Exact and bounded claims").
    one, two = (torch.load(folders[t] / "model.pt", weights_only=True) for t in (1, 2))
    assert one.keys() == two.keys()
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=0, atol=1e-5)
