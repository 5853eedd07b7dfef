r"""Membership inference against ``--dp-epsilon``: the other sites attack each site's rows.

The targets are every site's training rows on w7a, trained on the simulator (in-process, Python
API). A site's candidates are its rows whose feature vector occurs once in w7a, of both classes
(every unique positive, and a share of ``per_class`` negatives); each shadow run puts a random
half of each class's candidates IN each site's rows (so the class sizes, hence the public rates
and z, are the same in every run), the rest of the partition fixed. The attackers know every
flag (``--seed`` included) and the other rows, as docs/privacy.md's threat model says; each
candidate is attacked through its own site's messages. Pooling the sites' candidates gives N
times the candidates of one site for the same runs, hence narrower intervals.

* **Attacks**, on (a) the model the candidate's site sends its neighbours (its own parameters
  after the last step) and (b) the final average model, for positives and negatives separately:

  - *loss threshold*: the score is the candidate's logit-scaled confidence in its label,
    :math:`\phi = \pm\,\mathrm{logit}(x)` (+ for a positive), one global threshold;
  - *LiRA offline* (Carlini et al., S&P 2022): :math:`(\phi - \mu_{out}) / \sigma_{out}`, with
    :math:`\mu_{out}` the candidate's mean :math:`\phi` over the shadow runs where it was OUT
    (the target run left out) and :math:`\sigma_{out}` one pooled deviation per class (the
    fixed-variance variant, for few shadows). Each shadow run is the target in turn.

  Attack AUC and TPR at 1% FPR over every (run, candidate) pair, with 95% intervals from a
  bootstrap over candidates (a candidate's runs are resampled together).
* **Canary audit** (one release set, white box): a crafted positive canary whose features lie in
  the null space of the first layer (its logit never saturates, its gradient is large) added to
  or left out of site 1's rows. The production sampler and privatised compute
  (:class:`~slate.data.sampler.PoissonGroupSampler`, :class:`~slate.algorithms.privacy.
  PrivateCompute`, the run's own z, C, G and rates) release ``k`` noisy estimates at the initial
  parameters; the statistic is :math:`\sum_t \langle \tilde u_t, v\rangle` with ``v`` the
  canary's gradient. A threshold is chosen on half of the trials; on the other half,
  Clopper-Pearson upper bounds (95%) on FPR and FNR give
  :math:`\varepsilon_{lb} = \max(\log\frac{1-\delta-\mathrm{FNR}}{\mathrm{FPR}},
  \log\frac{1-\delta-\mathrm{FPR}}{\mathrm{FNR}})`, which must not exceed the accountant's ε of
  those ``k`` releases (``dp-accounting`` PLD).
* **Planted bugs**, monkeypatched in this process only: (1) the sample and noise streams keyed by
  ``--seed`` (caught when two runs with the same flags and rows send identical messages); (2)
  clipping skipped (caught when the canary's ε lower bound exceeds the accountant's). The
  harness exits 1 when one is missed, or when an unpatched audit's bound exceeds the accountant.
* **Utility and cost**: AP on w7a.t of each setting's average model, SLATE against DP-D-PSGD at
  ε = 8, and a ``--dp-epsilon`` run's time per iteration against a plain run's, measured here.

``python -m benchmarks.privacy [--quick] [--shadows S] [--iterations T4,T20] [--parties 4,20]
[--epsilons 1,3,8] [--write]`` prints markdown tables; ``--write`` puts them into
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = HERE.parent.parent / "shared" / "data"
SITE = 1
DELTA = 1e-5
CHUNK = 100  # steps drawn at once (the Poisson sampler's arrays are steps x rows)


@dataclass
class Settings:
    """What one invocation measures (``--quick`` shrinks every count)."""

    parties: tuple[int, ...] = (4, 20)
    iterations: tuple[int, ...] = (2000, 500)  # per entry of parties
    epsilons: tuple[float | None, ...] = (None, 1.0, 3.0, 8.0)  # None: no DP
    shadows: int = 16
    per_class: int = 400  # candidates per class at most
    lr: float = 0.05
    batch_size: int = 16
    positives: int = 1
    groups: int = 8
    clip: float = 1.0
    seed: int = 0
    bootstrap: int = 200
    audit_replicas: int = 8  # IN and OUT copies of the site per audit step
    audit_rounds: int = 48
    audit_steps: int = 10  # releases summed per audit trial
    audit_releases: int | None = None  # the T that z is calibrated for (None: the setting's)
    utility_runs: int = 1
    quick: bool = False
    data_dir: Path = DEFAULT_DATA_DIR
    notes: list[str] = field(default_factory=list)


def quick_settings(data_dir: Path) -> Settings:
    """A smoke run of a few seconds: N = 4, ε = 8 and no DP, 4 shadows of 30 steps."""
    return Settings(parties=(4,), iterations=(30,), epsilons=(None, 8.0), shadows=4, per_class=24,
                    bootstrap=50, audit_rounds=20, audit_releases=2000, quick=True,
                    data_dir=data_dir)  # fmt: skip


# --- statistics (checked against sklearn and scipy in tests/test_privacy_benchmark.py) ---------


def roc(scores: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ROC curve's (FPR, TPR) points, one per distinct score from the highest down (ties
    in one step), starting at (0, 0): "member" when the score is at least the threshold."""
    order = np.argsort(-scores, kind="stable")
    s, m = scores[order], members[order].astype(bool)
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the end of each tie block
    tp, fp = np.cumsum(m)[last], np.cumsum(~m)[last]
    return np.r_[0.0, fp / max(1, (~m).sum())], np.r_[0.0, tp / max(1, m.sum())]


def auc(scores: np.ndarray, members: np.ndarray) -> float:
    """Area under the ROC curve (trapezoids: a tie counts one half)."""
    fpr, tpr = roc(scores, members)
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def tpr_at(scores: np.ndarray, members: np.ndarray, fpr_max: float = 0.01) -> float:
    """The largest TPR of a threshold whose FPR is at most ``fpr_max``."""
    fpr, tpr = roc(scores, members)
    return float(tpr[fpr <= fpr_max + 1e-12].max())


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided ``1 - alpha`` Clopper-Pearson interval of a binomial rate, ``k`` of ``n``:
    the ``alpha/2`` and ``1 - alpha/2`` quantiles of Beta(k, n - k + 1) and Beta(k + 1, n - k)."""
    from scipy.stats import beta

    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def epsilon_lower_bound(
    false_pos: int, n_out: int, false_neg: int, n_in: int, delta: float, alpha: float = 0.05
) -> float:
    """ε that an (ε, δ)-DP mechanism must at least have for a test to err this little, with
    confidence ``1 - alpha`` (Clopper-Pearson upper bounds on FPR and FNR); 0 when none."""
    fpr = clopper_pearson(false_pos, n_out, alpha)[1]
    fnr = clopper_pearson(false_neg, n_in, alpha)[1]
    bounds = [0.0]
    for a, b in ((fnr, fpr), (fpr, fnr)):
        if b > 0 and 1 - delta - a > 0:
            bounds.append(math.log((1 - delta - a) / b))
    return max(bounds)


def lira_offline(phi: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """LiRA offline scores ``(runs, candidates)``: for run r as target, the candidate's
    :math:`\\phi` against the mean over the other runs where it was OUT, in units of one
    pooled OUT deviation (the fixed-variance variant). A candidate OUT in no other run scores 0.
    """
    runs, _ = phi.shape
    out = ~inside
    spreads = [phi[out[:, c], c].std(ddof=1) for c in range(phi.shape[1]) if out[:, c].sum() > 1]
    sigma = float(np.sqrt(np.mean(np.square(spreads)))) if spreads else 1.0
    scores = np.zeros_like(phi)
    for r in range(runs):
        others = out.copy()
        others[r] = False
        count = others.sum(axis=0)
        mean = np.where(count > 0, (phi * others).sum(axis=0) / np.maximum(count, 1), phi[r])
        scores[r] = (phi[r] - mean) / max(sigma, 1e-12)
    return scores


@dataclass(frozen=True)
class Measured:
    """An attack's AUC and TPR at 1% FPR with their bootstrap 95% intervals."""

    auc: float
    auc_ci: tuple[float, float]
    tpr: float
    tpr_ci: tuple[float, float]

    def cells(self) -> str:
        return (f"{self.auc:.3f} [{self.auc_ci[0]:.3f}, {self.auc_ci[1]:.3f}] | "
                f"{self.tpr:.1%} [{self.tpr_ci[0]:.1%}, {self.tpr_ci[1]:.1%}]")  # fmt: skip


def measure(scores: np.ndarray, inside: np.ndarray, rounds: int, rng: np.random.Generator):
    """AUC and TPR at 1% FPR of ``scores`` ``(runs, candidates)``, with a bootstrap over the
    candidates (percentile 2.5 and 97.5)."""
    flat = lambda cols: (scores[:, cols].ravel(), inside[:, cols].ravel())  # noqa: E731
    columns = np.arange(scores.shape[1])
    aucs, tprs = [], []
    for _ in range(rounds):
        s, m = flat(rng.choice(columns, size=len(columns)))
        if m.all() or not m.any():
            continue
        aucs.append(auc(s, m))
        tprs.append(tpr_at(s, m))
    s, m = flat(columns)

    def interval(values: list[float]) -> tuple[float, float]:
        return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))

    return Measured(auc(s, m), interval(aucs), tpr_at(s, m), interval(tprs))


# --- data and runs ---------------------------------------------------------------------------


@dataclass
class W7a:
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def load_w7a(data_dir: Path) -> W7a:
    from slate.data.readers.libsvm import read_libsvm

    folder = Path(data_dir) / "w7a"
    x, y = read_libsvm(folder / "w7a.gz", n_features=300)
    xt, yt = read_libsvm(folder / "w7a.t.gz", n_features=300)
    return W7a(np.ascontiguousarray(x, np.float32), y.astype(np.int64),
               np.ascontiguousarray(xt, np.float32), yt.astype(np.int64))  # fmt: skip


def deal(labels: np.ndarray, parties: int, seed: int) -> list[np.ndarray]:
    """Each class's rows shuffled (seeded) and dealt round-robin to ``parties`` parties."""
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(parties)]
    for c in (0, 1):
        rows = rng.permutation(np.flatnonzero(labels == c))
        for k in range(parties):
            parts[k] += rows[k::parties].tolist()
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


_ONCE: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id -> (the array, kept alive; its mask)


def occurs_once(x: np.ndarray) -> np.ndarray:
    """Whether each row's feature vector occurs once in ``x`` (computed once per array)."""
    if id(x) not in _ONCE:
        _, inverse, counts = np.unique(x, axis=0, return_inverse=True, return_counts=True)
        _ONCE[id(x)] = (x, counts[inverse.ravel()] == 1)
    return _ONCE[id(x)][1]


def unique_candidates(
    x: np.ndarray,
    y: np.ndarray,
    part: np.ndarray,
    per_class: int,
    rng: np.random.Generator,
    negatives: int | None = None,
) -> dict[int, np.ndarray]:
    """Per class, up to ``per_class`` rows of ``part`` (``negatives`` for the negatives, when
    given) whose feature vector occurs once in ``x`` (a random choice when there are more)."""
    once = occurs_once(x)
    chosen = {}
    for c in (1, 0):
        rows = part[once[part] & (y[part] == c)]
        most = per_class if c == 1 or negatives is None else negatives
        chosen[c] = np.sort(rng.choice(rows, size=min(most, len(rows)), replace=False))
    return chosen


def train_config(s: Settings, parties: int, epsilon: float | None, iterations: int,
                 algorithm: str = "slate"):  # fmt: skip
    from slate.config import TrainConfig

    return TrainConfig(dataset="w7a", algorithm=algorithm, nodes=parties, iterations=iterations,
                       lr=s.lr, batch_size=s.batch_size, positives=s.positives,
                       dp_epsilon=epsilon, dp_clip=s.clip, dp_groups=s.groups, seed=s.seed,
                       eval_every=10**9, checkpoint_every=10**9, party_ap=False, compile="off",
                       threads=1)  # fmt: skip


def make_run(config: Any, data: W7a, parts: Sequence[np.ndarray]):
    """A :class:`slate.training.run.Run` of ``config`` on ``parts`` of ``data`` (rows in no
    part are held by no party)."""
    from slate.data.datasets import Dataset
    from slate.training.configuration import resolve_and_check
    from slate.training.run import Run

    used = np.concatenate(parts)
    keep = np.zeros(len(data.y), dtype=bool)
    keep[used] = True
    rows = np.flatnonzero(keep)
    new = np.full(len(data.y), -1)
    new[rows] = np.arange(len(rows))
    dataset = Dataset("w7a", data.x[rows], data.y[rows], data.x_test, data.y_test, "w7a.t",
                      parts=[new[p] for p in parts])  # fmt: skip
    return Run(resolve_and_check(config), data=dataset)


@dataclass
class Trained:
    sites: torch.Tensor  # every party's parameters after the last step, (N, d)
    average: torch.Tensor  # the parties' mean
    seconds_per_iteration: float
    epsilon: dict[str, float] | None
    iterations: int  # the steps taken: fewer than planned where the budget cut the plan


def train(config: Any, data: W7a, parts: Sequence[np.ndarray]) -> Trained:
    """``config``'s run on ``parts``; a private run whose plan was cut to what its budget
    affords stops where the ledger stops it (``Trained.iterations``)."""
    from slate.training.accountant import PrivacyBudgetExhausted

    run = make_run(config, data, parts)
    start = time.perf_counter()
    left = config.iterations
    try:
        while left > 0:
            left -= run.advance(min(CHUNK, left))
    except PrivacyBudgetExhausted:
        pass
    seconds = (time.perf_counter() - start) / max(1, run.iteration)
    privacy = None
    if run.ledger is not None:
        summary = run.ledger.summary()
        privacy = {k: summary[k] for k in ("epsilon_positives", "epsilon_negatives", "z")}
    x = run.x.detach().cpu().double()
    return Trained(x.clone(), x.mean(dim=0), seconds, privacy, run.iteration)


class Scorer:
    """Logits of rows under a parameter vector, in the run's model (``mlp``, w7a's hidden; rows
    of ``width`` features, w7a's 300 by default)."""

    def __init__(self, config: Any, width: int = 300) -> None:
        from slate.models import build_model
        from slate.training.configuration import resolve_and_check

        flags = resolve_and_check(config).flags
        self.module = build_model(flags.model, (width,), hidden=flags.hidden, seed=flags.seed)
        self.module = self.module.double().eval()
        self.size = sum(p.numel() for p in self.module.parameters())

    def __call__(self, params: torch.Tensor, x: np.ndarray) -> np.ndarray:
        torch.nn.utils.vector_to_parameters(params[: self.size].double(), self.module.parameters())
        with torch.no_grad():
            return self.module(torch.from_numpy(x).double()).reshape(-1).numpy()


# --- the membership-inference study ----------------------------------------------------------


@dataclass
class Cell:
    """One (ε, N) setting's measurements."""

    parties: int
    epsilon: float | None
    iterations: int
    attacks: dict[tuple[str, str, str], Measured]  # (model, attack, class)
    ap: list[float]
    seconds_per_iteration: float
    accountant: dict[str, float] | None
    candidates: dict[int, int]


def study(s: Settings, data: W7a, parties: int, iterations: int, epsilon: float | None,
          log: Any) -> Cell:  # fmt: skip
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng([s.seed, parties, int(1000 * (epsilon or 0))])
    parts = deal(data.y, parties, s.seed)
    negatives = max(1, -(-s.per_class // parties))  # about per_class negatives over all sites
    chosen = [unique_candidates(data.x, data.y, part, s.per_class, np.random.default_rng(k),
                                negatives) for k, part in enumerate(parts)]  # fmt: skip
    pools = [np.concatenate([c[1], c[0]]) for c in chosen]
    pool, owner = np.concatenate(pools), np.repeat(np.arange(parties), [len(p) for p in pools])
    positive = data.y[pool] == 1
    bases = [np.setdiff1d(part, p) for part, p in zip(parts, pools, strict=True)]
    config = train_config(s, parties, epsilon, iterations)
    scorer = Scorer(config)
    signs = np.where(positive, 1.0, -1.0)
    inside = np.zeros((s.shadows, len(pool)), dtype=bool)
    phi = {"sent": np.zeros((s.shadows, len(pool))), "average": np.zeros((s.shadows, len(pool)))}
    aps, seconds, accountant = [], [], None
    for r in range(s.shadows):
        for k in range(parties):  # exactly half of each class of each site: fixed class sizes
            for cls in (positive, ~positive):
                cols = np.flatnonzero(cls & (owner == k))
                inside[r, rng.choice(cols, size=len(cols) // 2, replace=False)] = True
        shadow = [np.sort(np.concatenate([base, pool[inside[r] & (owner == k)]]))
                  for k, base in enumerate(bases)]  # fmt: skip
        done = train(config, data, shadow)
        for k in range(parties):
            mine = owner == k
            phi["sent"][r, mine] = signs[mine] * scorer(done.sites[k], data.x[pool[mine]])
        phi["average"][r] = signs * scorer(done.average, data.x[pool])
        aps.append(float(average_precision_score(data.y_test, scorer(done.average,
                                                                     data.x_test))))  # fmt: skip
        seconds.append(done.seconds_per_iteration)
        accountant = done.epsilon or accountant
        log(f"  N {parties}, {label(epsilon)}: shadow {r + 1}/{s.shadows}, AP {aps[-1]:.4f}, "
            f"{1000 * seconds[-1]:.1f} ms/it")  # fmt: skip
    attacks = {}
    for name in ("sent", "average"):
        scores = {"loss": phi[name], "lira": lira_offline(phi[name], inside)}
        for attack, values in scores.items():
            for cls, cols in (("positives", positive), ("negatives", ~positive)):
                attacks[(name, attack, cls)] = measure(values[:, cols], inside[:, cols],
                                                       s.bootstrap, rng)  # fmt: skip
    counts = {c: sum(len(one[c]) for one in chosen) for c in (1, 0)}
    return Cell(parties, epsilon, iterations, attacks, aps, float(np.median(seconds)), accountant,
                counts)  # fmt: skip


def label(epsilon: float | None) -> str:
    return "no DP" if epsilon is None else f"ε = {epsilon:g}"


# --- the canary audit ----------------------------------------------------------------------


def null_space_canary(module: torch.nn.Module, scale: float, seed: int) -> np.ndarray:
    """A feature vector of norm ``scale`` in the null space of the first linear layer: its
    hidden pre-activations are the biases, so its logit never saturates and its gradient grows
    with ``scale``."""
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    w = first.weight.detach().double().numpy()
    r = np.random.default_rng(seed).normal(size=w.shape[1])
    r -= w.T @ np.linalg.solve(w @ w.T, w @ r)
    return (scale * r / np.linalg.norm(r)).astype(np.float32)


@dataclass
class Audit:
    parties: int
    epsilon: float
    releases: int
    epsilon_lower: float
    epsilon_accountant: float  # of the audited releases
    tpr: float
    fpr: float
    trials: int
    canary_norm: float  # the canary's group gradient before clipping (median)


def canary_audit(s: Settings, data: W7a, parties: int, iterations: int, epsilon: float,
                 log: Any, scale: float = 1000.0) -> Audit:  # fmt: skip
    """The white-box audit of docs/privacy.md's mechanism (module docstring)."""
    from slate.algorithms.privacy import PrivateCompute, PrivateGroups
    from slate.data.sampler import PoissonGroupSampler
    from slate.objectives.ap import masked_ap_surrogate
    from slate.security.secret_random import SecretStream
    from slate.training.accountant import epsilon_pld

    site = deal(data.y, parties, s.seed)[SITE]
    config = train_config(s, parties, epsilon, s.audit_releases or iterations)
    scorer = Scorer(config)
    canary = null_space_canary(scorer.module, scale, s.seed)
    audit_data = W7a(np.vstack([data.x[site], canary[None]]),
                     np.append(data.y[site], 1), data.x_test[:200], data.y_test[:200])  # fmt: skip
    n, reps = len(site), s.audit_replicas
    parts = [np.arange(n + 1)] * reps + [np.arange(n)] * reps  # IN copies, then OUT copies
    run = make_run(replace(config, nodes=2 * reps), audit_data, parts)
    party = run.ledger.plan.parties[0]  # an IN copy: the site with its canary
    rates = [(party.q_pos, party.q_neg)] * (2 * reps)  # the same public rates for every copy
    sampler = PoissonGroupSampler(run.data.parts, run.data.y_train, rates, run.sampler.groups,
                                  run.sampler.group_size, [SecretStream() for _ in parts],
                                  run.sampler.pad)  # fmt: skip
    shape = run.compute.groups
    mechanism = PrivateCompute(
        run.compute.inner,
        PrivateGroups(shape.groups, shape.group_size, shape.clip,
                      (shape.noise_std[0],) * len(parts), (shape.divisor[0],) * len(parts)),
        [SecretStream() for _ in parts],
    )  # fmt: skip
    x = run.x.detach()
    # the attacker's direction: the canary's gradient in a group with 15 of the site's negatives
    negatives = site[data.y[site] == 0][:15]
    rows = torch.from_numpy(np.vstack([canary[None], data.x[negatives]])).double()
    labels = torch.tensor([1] + [0] * len(negatives))
    scorer.module.zero_grad()
    torch.nn.utils.vector_to_parameters(x[0, : scorer.size].double(), scorer.module.parameters())
    loss = masked_ap_surrogate(torch.sigmoid(scorer.module(rows).reshape(-1)), labels,
                               float(run.flags.margin))  # fmt: skip
    loss.backward()
    v = torch.cat([p.grad.reshape(-1) for p in scorer.module.parameters()])
    v = torch.nn.functional.pad(v / v.norm(), (0, x.shape[1] - scorer.size)).to(x.dtype)
    canary_ids = torch.tensor([int(p[-1]) for p in run.data.parts[:reps]])
    stats, norms = [], []
    for _ in range(s.audit_rounds):
        total = torch.zeros(len(parts), dtype=torch.float64)
        indices = sampler.draw(s.audit_steps)
        for t in range(s.audit_steps):
            batch = run.batch(indices[t])
            _, estimate = mechanism(x, batch)
            total += (estimate.double() @ v.double()).cpu()
            held = indices[t, :reps].view(reps, shape.groups, -1) == canary_ids[:, None, None]
            if held.any():
                _, grads = mechanism.group_gradients(x, batch)
                norms += grads[:, :reps].norm(dim=-1).T[held.any(-1)].tolist()
        stats.append(total.numpy())
    table = np.array(stats)  # (rounds, 2 reps)
    half = s.audit_rounds // 2
    pick_in, pick_out = table[:half, :reps].ravel(), table[:half, reps:].ravel()
    test_in, test_out = table[half:, :reps].ravel(), table[half:, reps:].ravel()
    best, threshold = -1.0, np.inf
    for t in np.unique(np.r_[pick_in, pick_out]):
        value = epsilon_lower_bound(int((pick_out >= t).sum()), len(pick_out),
                                    int((pick_in < t).sum()), len(pick_in), DELTA)  # fmt: skip
        if value > best:
            best, threshold = value, t
    fp, fn = int((test_out >= threshold).sum()), int((test_in < threshold).sum())
    lower = epsilon_lower_bound(fp, len(test_out), fn, len(test_in), DELTA)
    spent = epsilon_pld(((party.q_pos, party.z, s.audit_steps),), DELTA)
    log(f"  audit N {parties}, ε {epsilon:g}: ε_lb {lower:.3f} against {spent:.3f} "
        f"(canary group gradient {np.median(norms) if norms else float('nan'):.1f})")  # fmt: skip
    return Audit(parties, epsilon, s.audit_steps, lower, spent, 1 - fn / len(test_in),
                 fp / len(test_out), len(test_in) + len(test_out),
                 float(np.median(norms)) if norms else float("nan"))  # fmt: skip


# --- planted bugs --------------------------------------------------------------------------


@contextlib.contextmanager
def noise_from_seed(seed: int) -> Iterator[None]:
    """Planted bug 1: every secret stream keyed by the public ``--seed``."""
    from slate.security.secret_random import SecretStream
    from slate.training import private_run

    original = private_run.secret_streams

    def seeded(faults: Any, engine: Any, purpose: str) -> list[SecretStream]:
        return [SecretStream.for_test(seed, p, purpose) for p in engine.local_parties]

    private_run.secret_streams = seeded
    try:
        yield
    finally:
        private_run.secret_streams = original


@contextlib.contextmanager
def clipping_skipped() -> Iterator[None]:
    """Planted bug 2: the group gradients summed unclipped (every factor 1, on every path that
    computes the groups' gradients)."""
    from slate.algorithms import clipping

    original = clipping.clip_factors
    clipping.clip_factors = lambda norms, clip: torch.ones_like(norms)
    try:
        yield
    finally:
        clipping.clip_factors = original


def same_messages(s: Settings, data: W7a, parties: int, steps: int = 5) -> bool:
    """Whether two runs with the same flags (``--seed`` included) and rows send the same
    messages: the neighbour could then rerun the site and subtract its noise."""
    config = train_config(s, parties, 8.0, s.iterations[0])
    parts = deal(data.y, parties, s.seed)
    runs = [make_run(config, data, parts) for _ in range(2)]
    for run in runs:
        run.advance(steps)
    return bool(torch.equal(runs[0].x[SITE], runs[1].x[SITE]))


# --- the report ----------------------------------------------------------------------------


def utility(s: Settings, data: W7a, parties: int, iterations: int, log: Any) -> dict[str, float]:
    """Test AP of SLATE without DP and at ε = 8, and of DP-D-PSGD at ε = 8, on the whole
    partition at ``iterations`` steps (mean of ``utility_runs`` runs)."""
    from sklearn.metrics import average_precision_score

    parts = deal(data.y, parties, s.seed)
    out = {}
    for key, algorithm, epsilon in (("slate", "slate", None), ("slate-dp8", "slate", 8.0),
                                    ("dpsgd-dp8", "dpsgd", 8.0)):  # fmt: skip
        config = train_config(s, parties, epsilon, iterations, algorithm)
        scorer = Scorer(config)
        aps = []
        for _ in range(s.utility_runs):
            done = train(config, data, parts)
            aps.append(average_precision_score(data.y_test, scorer(done.average, data.x_test)))
        out[key] = float(np.mean(aps))
        out[key + "-ms"] = 1000 * done.seconds_per_iteration
        log(f"  utility N {parties}: {key} AP {out[key]:.4f}")
    return out


def report(s: Settings, cells: list[Cell], audits: list[tuple[Audit, str]],
           bugs: dict[str, bool], utilities: dict[int, dict[str, float]], command: str,
           machine: str) -> list[str]:  # fmt: skip
    lines = ["\n## Membership inference against `--dp-epsilon` (w7a, every site's rows)\n",
             f"`{command}`, on {machine}. Every setting: SLATE, `--lr {s.lr:g} --positives "
             f"{s.positives} --batch-size {s.batch_size} --dp-groups {s.groups} --dp-clip "
             f"{s.clip:g}` on a ring, {s.shadows} shadow runs; iterations "
             + ", ".join(f"{t} at N = {n}" for n, t in zip(s.parties, s.iterations, strict=True))
             + ". Attack AUC and TPR at 1% FPR, each with its bootstrap 95% interval over "
             "candidates (every site's unique positives, and about 400 unique negatives over "
             "the sites, each attacked through its own site's messages); *sent*: the model the "
             "candidate's site sends its neighbours (its own parameters after the last step), "
             "*average*: the final average model.\n"]  # fmt: skip
    lines += ["| N | setting | accountant ε (+ / −) | candidates (+ / −) | model | attack | "
              "positives AUC | positives TPR@1%FPR | negatives AUC | negatives TPR@1%FPR |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cells:
        spent = "∞"
        if c.accountant:
            spent = (f"{c.accountant['epsilon_positives']:.2f} / "
                     f"{c.accountant['epsilon_negatives']:.2f}")  # fmt: skip
        for model in ("sent", "average"):
            for attack in ("loss", "lira"):
                name = "loss threshold" if attack == "loss" else "LiRA offline"
                lines.append(f"| {c.parties} | {label(c.epsilon)} | {spent} | "
                             f"{c.candidates[1]} / {c.candidates[0]} | {model} | {name} | "
                             f"{c.attacks[(model, attack, 'positives')].cells()} | "
                             f"{c.attacks[(model, attack, 'negatives')].cells()} |")  # fmt: skip
    lines += ["\n### Utility and cost\n",
              "| N | setting | iterations | test AP of the average (mean ± sd over shadows) | "
              "ms / iteration | against no DP |", "|---|---|---|---|---|---|"]  # fmt: skip
    plain = {c.parties: c.seconds_per_iteration for c in cells if c.epsilon is None}
    for c in cells:
        ratio = (f"{c.seconds_per_iteration / plain[c.parties]:.1f}x" if c.parties in plain
                 else "")  # fmt: skip
        lines.append(f"| {c.parties} | {label(c.epsilon)} | {c.iterations} | "
                     f"{np.mean(c.ap):.4f} ± {np.std(c.ap):.4f} | "
                     f"{1000 * c.seconds_per_iteration:.2f} | {ratio} |")  # fmt: skip
    if utilities:
        lines += ["\nSLATE against DP-D-PSGD on the whole partition (no candidate left out), "
                  f"{s.utility_runs} run(s) each, the same flags and iterations:\n",
                  "| N | SLATE, no DP | SLATE, ε = 8 | DP-D-PSGD, ε = 8 | SLATE − DP-D-PSGD | "
                  "ms / it: SLATE no DP, SLATE ε = 8, DP-D-PSGD ε = 8 |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for n, u in utilities.items():
            lines.append(f"| {n} | {u['slate']:.4f} | {u['slate-dp8']:.4f} | "
                         f"{u['dpsgd-dp8']:.4f} | {u['slate-dp8'] - u['dpsgd-dp8']:+.4f} | "
                         f"{u['slate-ms']:.2f}, {u['slate-dp8-ms']:.2f}, "
                         f"{u['dpsgd-dp8-ms']:.2f} |")  # fmt: skip
    lines += ["\n### Canary audit and planted bugs\n",
              f"A positive canary in the first layer's null space (norm 1000), IN or OUT of site "
              f"1's rows; each trial sums {s.audit_steps} releases of the production sampler and "
              "mechanism at the initial parameters; the threshold is chosen on half the trials, "
              "the Clopper-Pearson 95% bound computed on the other half.\n",
              "| N | ε budget | audit | trials | TPR / FPR | ε lower bound | accountant ε "
              "of the audited releases | canary's group gradient norm (C = "
              f"{s.clip:g}) | verdict |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for a, kind in audits:
        verdict = ("ok (bound ≤ accountant)" if a.epsilon_lower <= a.epsilon_accountant
                   else "bound > accountant")  # fmt: skip
        if kind != "production":
            verdict = "caught" if a.epsilon_lower > a.epsilon_accountant else "MISSED"
        lines.append(f"| {a.parties} | {a.epsilon:g} | {kind} | {a.trials} | {a.tpr:.1%} / "
                     f"{a.fpr:.1%} | {a.epsilon_lower:.2f} | {a.epsilon_accountant:.2f} | "
                     f"{a.canary_norm:.1f} | {verdict} |")  # fmt: skip
    lines += ["", "| planted bug | how the harness sees it | result |", "|---|---|---|"]
    lines.append(
        "| noise and sample keyed by `--seed` | two runs with the same flags and rows "
        f"send identical messages | {'caught' if bugs['seed'] else 'MISSED'} |"
    )
    lines.append("| clipping skipped | the canary's ε lower bound exceeds the accountant's | "
                 f"{'caught' if bugs['clip'] else 'MISSED'} |")  # fmt: skip
    lines.append(
        "| (control) the production code | two runs with the same flags and rows send "
        f"different messages | {'yes' if bugs['control'] else 'NO'} |"
    )
    lines += targets(cells)
    return lines


def targets(cells: list[Cell]) -> list[str]:
    """The acceptance targets, as measured."""
    lines = ["\n### Against the targets\n"]
    for c in cells:
        worst_auc = max(m.auc_ci[1] for k, m in c.attacks.items())
        worst_tpr = max(m.tpr_ci[1] for k, m in c.attacks.items())
        if c.epsilon == 8.0:
            ok = worst_auc <= 0.55 and worst_tpr <= 0.02
            lines.append(
                f"* N = {c.parties}, ε = 8: highest upper 95% end over attacks, models "
                f"and classes: AUC {worst_auc:.3f} (target ≤ 0.55), TPR@1%FPR "
                f"{worst_tpr:.1%} (target ≤ 2%): {'met' if ok else 'NOT met'}."
            )
        if c.epsilon is None:
            best = max((c.attacks[(m, a, "positives")] for m in ("sent", "average")
                        for a in ("loss", "lira")), key=lambda m: m.auc)  # fmt: skip
            best_tpr = max(c.attacks[(m, a, "positives")].tpr for m in ("sent", "average")
                           for a in ("loss", "lira"))  # fmt: skip
            ok = best.auc >= 0.60 or best_tpr >= 0.05
            lines.append(
                f"* N = {c.parties}, no DP: best attack on positives AUC {best.auc:.3f}"
                f", best TPR@1%FPR {best_tpr:.1%} (leakage shown when AUC ≥ 0.60 or "
                f"TPR ≥ 5%): {'shown' if ok else 'NOT shown'}."
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.privacy",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--shadows", type=int)
    parser.add_argument("--iterations", help="per entry of --parties, comma-separated")
    parser.add_argument("--parties", help="comma-separated N (default 4,20)")
    parser.add_argument("--epsilons", help="comma-separated; 'none' for no DP (default "
                        "none,1,3,8)")  # fmt: skip
    parser.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    s = quick_settings(args.data_dir) if args.quick else Settings(data_dir=args.data_dir)
    if args.parties:
        s.parties = tuple(int(v) for v in args.parties.split(","))
    if args.iterations:
        values = [int(v) for v in args.iterations.split(",")]
        s.iterations = tuple(values * len(s.parties))[: len(s.parties)] if len(values) == 1 \
            else tuple(values)  # fmt: skip
    if len(s.iterations) != len(s.parties):
        s.iterations = (s.iterations + (s.iterations[-1],) * len(s.parties))[: len(s.parties)]
    if args.epsilons:
        s.epsilons = tuple(None if v.strip().lower() in ("none", "inf") else float(v)
                           for v in args.epsilons.split(","))  # fmt: skip
    if args.shadows:
        s.shadows = args.shadows
    torch.set_num_threads(1)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    data = load_w7a(s.data_dir)
    started = time.perf_counter()

    bugs = {"control": not same_messages(s, data, s.parties[0])}
    with noise_from_seed(s.seed):
        bugs["seed"] = same_messages(s, data, s.parties[0])
    audits: list[tuple[Audit, str]] = []
    first_dp = next((e for e in s.epsilons if e is not None), 8.0)
    with clipping_skipped():
        planted = canary_audit(s, data, s.parties[0], s.iterations[0], first_dp, log)
    bugs["clip"] = planted.epsilon_lower > planted.epsilon_accountant
    log(f"planted bugs: {bugs}")
    cells = []
    for parties, iterations in zip(s.parties, s.iterations, strict=True):
        for epsilon in s.epsilons:
            cells.append(study(s, data, parties, iterations, epsilon, log))
            if epsilon is not None:
                audits.append((canary_audit(s, data, parties, iterations, epsilon, log),
                               "production"))  # fmt: skip
    audits.append((planted, "clipping skipped"))
    utilities = {
        n: utility(s, data, n, t, log) for n, t in zip(s.parties, s.iterations, strict=True)
    }
    from benchmarks.__main__ import machine

    command = "python -m benchmarks.privacy " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = report(s, cells, audits, bugs, utilities, command.strip(), machine())
    lines.append(f"\nThe whole invocation took {time.perf_counter() - started:.0f} s.")
    print("\n".join(lines))
    if args.write:
        from benchmarks.__main__ import _update_section

        _update_section(lines)
    violated = [a for a, kind in audits if kind == "production"
                and a.epsilon_lower > a.epsilon_accountant]  # fmt: skip
    if not (bugs["seed"] and bugs["clip"] and bugs["control"]) or violated:
        print(
            "privacy harness: a planted bug was missed, or an audit bound exceeds the "
            "accountant's epsilon",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
