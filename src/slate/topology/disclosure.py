r"""Which site's model the evaluation average gives away: the algebra of a sum and the gossip.

Every evaluation opens the average of all :math:`N` models, :math:`\bar x_T = \frac1N \sum_k
x_{k,T}` (masked under a roster: a site learns the total only). Every algorithm of slate
ends an iteration with one mixing round, :math:`x_{T} = \mathbf{M}_{T-1} z_{T-1}`, where
:math:`z_{k,T-1}` is site :math:`k`'s model after its local step (what it sends its neighbours:
:math:`x_{k} - \eta v_{k}` for SLATE, SLATE-M and D-PSGD, the stepped primal and dual variables
for CODA) and :math:`\mathbf{M}_{T-1}` the round's matrix. Every matrix slate applies is
doubly stochastic, :math:`\mathbf{1}^\top \mathbf{M} = \mathbf{1}^\top`, so

.. math::

    N \bar x_T = \mathbf{1}^\top \mathbf{M}_{T-1} z_{T-1} = \sum_k z_{k,T-1}.

Site :math:`i` holds its own :math:`z_{i,T-1}` and hears :math:`z_{j,T-1}` from each neighbour
:math:`j` of that round. Subtracting them leaves

.. math::

    N \bar x_T - z_{i,T-1} - \sum_{j \in \mathcal N_i} z_{j,T-1}
        = \sum_{k \in C_i} z_{k,T-1}, \qquad C_i = \{k : k \ne i,\ k \notin \mathcal N_i\},

the sum of the models of the sites it does not hear from. When :math:`C_i = \{k\}`, that is site
:math:`k`'s own model, exactly; site :math:`i` then knows every :math:`z_{\cdot,T-1}`, hence every
site's evaluated model :math:`x_T = \mathbf{M}_{T-1} z_{T-1}` too. When :math:`|C_i| \ge 2` it is
one sum, and no :math:`z_{k}` with :math:`k \in C_i` is determined: the known functionals
:math:`e_i, e_j (j \in \mathcal N_i), \mathbf{1}` span exactly the vectors that are constant on
:math:`C_i`, and :math:`e_k` is one of them iff :math:`C_i = \{k\}` (or :math:`k` is heard).

This is the whole of what the average adds, round by round, when the messages of the next
round carry fresh private terms: without gradient tracking, :math:`z_{j,T} = x_{j,T} - \eta
u_{j,T}` holds a new gradient :math:`u_{j,T}` that no site but :math:`j` knows, so hearing it
constrains nothing older.

With gradient tracking and a round every iteration the tracked directions are gossiped too,
:math:`q_{t+1} = v_t + u_{t+1} - u_t` in round :math:`t + 1`, and consecutive rounds are linked:
:math:`z_{t+1} = \mathbf{M}_t z_t - \eta\, \mathbf{M}_{t+1} q_{t+1}`. A neighbour's next message
is then one more equation on the unknown :math:`z_{k,t}` and :math:`q_{k,t+1}` of the sites
:math:`i` does not hear, and a site can recover models from gossip alone: on a ring of 5, site
0 hears :math:`z_1, q_1` and :math:`z_{1,t+1} = w(y_0 + y_1 + y_2)` with :math:`y = z_t - \eta
q_{t+1}`, so it learns :math:`y_2` (and :math:`y_3` from site 4), hence site 2's next message
:math:`z_{2,t+1} = w(y_1 + y_2 + y_3)`. :func:`tracking_exposures` sets up the linear system of
two consecutive rounds, with the evaluation sums that fall on them, and finds each unheard
:math:`z_{k,t}` or :math:`z_{k,t+1}` that lies in the span of what :math:`i` knows (a rank test).
It ignores what older rounds add, so it may miss a recovery, never claim a false one.

What counts as heard in a round (:func:`heard_in_round`):

* a gossip round with the matrix :math:`\mathbf{M}`: :math:`j` is heard by :math:`i` iff
  :math:`m_{ij} > 0` or :math:`m_{ji} > 0` (:math:`i \ne j`);
* a round that is exactly :math:`\mathbf{J}` (``full``, a federated average, a cycle's
  averaging round): the engines replace it with one average of all (a masked sum under a
  roster), so nobody is heard on its own, and every evaluated model equals that average;
* an iteration without a gossip round (local steps, :math:`(t + 1) \bmod H \ne 0`): nobody.

Only the rounds that end just before an evaluation matter (:func:`evaluation_exposures`): the
evaluation at iteration :math:`T \ge 1` averages the models that iteration :math:`T - 1`'s round
produced; the evaluation at iteration 0 averages the starting models.

These claims are exact for dense gossip. With ``--compress`` a site hears its neighbours'
public copies :math:`\hat x_j`, not :math:`z_j`; CHOCO's round keeps the sum, so the same
subtraction gives the unheard site's model plus the neighbours' residuals :math:`z_j - \hat x_j`
(the caller says so). With ``--robust clip`` a clipped message breaks :math:`\mathbf{1}^\top
\mathbf{M} = \mathbf{1}^\top` for that round, and nothing is claimed.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import gcd, lcm

import numpy as np

from slate.topology.schedule import Topology

__all__ = [
    "evaluated_iterations",
    "evaluation_exposures",
    "exposed_by_average",
    "exposure_text",
    "heard_in_round",
    "run_exposures",
    "tracking_exposures",
]


def heard_in_round(matrix: np.ndarray, averaged: bool = False) -> np.ndarray:
    r"""Who hears whom in one round: ``heard[i, j]`` iff site :math:`i` receives site :math:`j`'s
    own message (:math:`i \ne j`).

    Args:
        matrix: the round's (N, N) matrix :math:`\mathbf{M}`; :math:`j` is heard by :math:`i`
            iff :math:`m_{ij} > 0` or :math:`m_{ji} > 0`.
        averaged: the round is an exact average of all (:math:`\mathbf{M} = \mathbf{J}`, carried
            by one sum): nobody is heard on its own.

    Returns:
        An (N, N) boolean matrix, False on the diagonal.
    """
    M = np.asarray(matrix)
    n = M.shape[0]
    if averaged:
        return np.zeros((n, n), dtype=bool)
    heard = (M > 0) | (M.T > 0)
    np.fill_diagonal(heard, False)
    return heard


def exposed_by_average(heard: np.ndarray) -> list[tuple[int, ...]]:
    r"""For each site :math:`i`, the sites whose model the average of all, minus what :math:`i`
    holds and hears, gives it exactly: :math:`(k,)` when :math:`C_i = \{k\}` is the only site it
    does not hear from, else ``()``.

    :math:`N \bar x - z_i - \sum_{j \in \mathcal N_i} z_j = \sum_{k \in C_i} z_k`: one model when
    :math:`|C_i| = 1`; a sum of two or more, in which none is determined, otherwise; nothing new
    when :math:`C_i` is empty (every model is heard anyway).

    Args:
        heard: (N, N) boolean, ``heard[i, j]`` iff :math:`i` hears :math:`j`
            (:func:`heard_in_round`).
    """
    unheard = ~np.asarray(heard, dtype=bool)
    np.fill_diagonal(unheard, False)
    alone = unheard.sum(axis=1) == 1
    lone = unheard.argmax(axis=1)
    return [(int(lone[i]),) if alone[i] else () for i in range(unheard.shape[0])]


def evaluated_iterations(iterations: int, eval_every: int) -> list[int]:
    """The iterations a run evaluates at: every multiple of ``eval_every`` from 0, and the last
    (``iterations``)."""
    points = list(range(0, iterations + 1, max(1, eval_every)))
    if points[-1] != iterations:
        points.append(iterations)
    return points


def evaluation_exposures(
    topology: Topology, evaluated: Iterable[int], gossip_every: int = 1
) -> list[tuple[int, ...]]:
    r"""For each site :math:`i`, every site :math:`k` whose model :math:`i` recovers exactly at
    some evaluation of ``evaluated``, from the average, its own model and its neighbours' gossip.

    The evaluation at iteration :math:`T \ge 1` averages what iteration :math:`t = T - 1`'s
    round made: a gossip round iff :math:`(t + 1) \bmod H = 0` (``gossip_every`` :math:`H`),
    with the matrix of round :math:`r = \lfloor t / H \rfloor` (:meth:`Topology.matrix_at`), an
    exact average when :meth:`Topology.is_full_average_at` ``(r)``. For each such round,
    :func:`exposed_by_average` of :func:`heard_in_round`; the union over the evaluations. The
    evaluation at iteration 0 averages the starting models and is left out.

    Only the distinct positions of :math:`t` in the schedule's period :math:`P = H L` (:math:`L`
    the topology's cycle length) are visited, so a run of a million iterations costs at most
    :math:`P` rounds.

    Args:
        topology: the run's network.
        evaluated: the iterations evaluated (:func:`evaluated_iterations`).
        gossip_every: :math:`H`, iterations per gossip round.

    Returns:
        One sorted tuple of exposed sites per site (empty where none).
    """
    n, every = topology.n, max(1, int(gossip_every))
    period = every * max(1, topology.cycle_length)
    exposed: list[set[int]] = [set() for _ in range(n)]
    seen: set[int] = set()
    for T in evaluated:
        if T < 1 or (T - 1) % period in seen:
            continue
        t = T - 1
        seen.add(t % period)
        if (t + 1) % every != 0:
            heard = heard_in_round(np.eye(n), averaged=False)  # no round: nobody heard
        else:
            r = t // every
            heard = heard_in_round(topology.matrix_at(r), topology.is_full_average_at(r))
        for i, sites in enumerate(exposed_by_average(heard)):
            exposed[i].update(sites)
    return [tuple(sorted(s)) for s in exposed]


def _period_points(iterations: int, eval_every: int, period: int) -> list[int]:
    """The evaluated iterations of a run, cut to those that reach a new position in a
    schedule of ``period`` (the multiples of ``eval_every`` repeat theirs after
    ``period / gcd(eval_every, period)``), and the last."""
    step = max(1, eval_every)
    repeat = period // gcd(step, period)
    points = list(range(0, min(iterations, step * (repeat + 1)) + 1, step))
    return [*points, iterations]


def run_exposures(
    topology: Topology, iterations: int, eval_every: int, gossip_every: int = 1
) -> list[tuple[int, ...]]:
    """:func:`evaluation_exposures` of a run's evaluations (every ``eval_every``-th iteration
    and the last), without listing every one of them."""
    period = max(1, int(gossip_every)) * max(1, topology.cycle_length)
    points = _period_points(iterations, eval_every, period)
    return evaluation_exposures(topology, points, gossip_every)


def _basis(rows: list[np.ndarray]) -> np.ndarray:
    """An orthonormal basis of the span of ``rows`` (the rows of an SVD's right factor)."""
    _, singular, basis = np.linalg.svd(np.stack(rows), full_matrices=False)
    return basis[singular > 1e-10 * singular[0]]


def _spanned(basis: np.ndarray, targets: np.ndarray) -> np.ndarray:
    r"""Which rows :math:`t` of ``targets`` lie in the span of the orthonormal ``basis``
    :math:`B`: the squared residual :math:`\|t\|^2 - \|B t\|^2` vanishes (to rounding; every
    entry here is a weight of order one or zero). By ``einsum``: a multi-threaded BLAS product
    of these small matrices is 40 times slower on a busy machine."""
    length = np.einsum("ij,ij->i", targets, targets)
    along = np.einsum("ij,kj->ik", targets, basis)
    residual = length - np.einsum("ij,ij->i", along, along)
    return residual <= 1e-9 * np.maximum(1.0, length)


def _window(
    now: np.ndarray, now_averaged: bool, nxt: np.ndarray, nxt_averaged: bool, sum_now: bool,
    sum_next: bool,
) -> list[tuple[int, ...]]:  # fmt: skip
    r"""Exposures in two consecutive rounds :math:`t, t + 1` under gradient tracking.

    The unknowns are :math:`(z_t, q_{t+1}) \in \mathbb{R}^{2N}` (one coordinate of each site's
    message), or equally :math:`(z_t, \eta q_{t+1})`: knowing :math:`q_j` is knowing
    :math:`\eta q_j`, so the answer is the same for every :math:`\eta > 0`, and the rows are
    written in the second form, where every entry is a weight. Site :math:`i` knows its own
    :math:`z_{i,t}, q_{i,t+1}`; in round :math:`t` each heard :math:`z_{j,t}` (an averaging
    round: :math:`\sum_k z_{k,t}`); in round :math:`t + 1` each heard :math:`q_{j,t+1}` and
    :math:`z_{j,t+1} = \mathbf{M}_t[j] z_t - \eta \mathbf{M}_{t+1}[j] q_{t+1}` (an averaging
    round: their sums); the evaluation sums :math:`\sum_k z_{k,t}` (``sum_now``, the evaluation
    at :math:`t + 1`) and :math:`\sum_k z_{k,t+1}` (``sum_next``, at :math:`t + 2`). Site
    :math:`k` is exposed when a message it sent that :math:`i` did not receive,
    :math:`z_{k,t}` or :math:`z_{k,t+1}`, lies in their span, unless :math:`z_{k,t+1} \equiv
    z_{i,t+1}` (rows equal: after an exact average every site sends the same)."""
    n = now.shape[0]
    eye, ones, zeros = np.eye(n), np.ones(n), np.zeros(n)
    heard_now, heard_next = heard_in_round(now, now_averaged), heard_in_round(nxt, nxt_averaged)
    message = np.hstack([now, -nxt])  # row j: z_{j,t+1}, in the unknowns (z_t, eta q_{t+1})
    total_next = np.hstack([ones, -ones])  # 1^T M_t = 1^T
    _, kind = np.unique(message, axis=0, return_inverse=True)  # equal rows, equal kind
    kind = kind.reshape(-1)
    exposed: list[tuple[int, ...]] = []
    for i in range(n):
        # (after an exact average a site's next message may equal i's own: that tells nothing)
        same = kind == kind[i]
        rows = [np.hstack([eye[i], zeros]), np.hstack([zeros, eye[i]])]
        rows += [np.hstack([eye[j], zeros]) for j in np.flatnonzero(heard_now[i])]
        for j in np.flatnonzero(heard_next[i]):
            rows += [np.hstack([zeros, eye[j]]), message[j]]
        if now_averaged or sum_now:
            rows.append(np.hstack([ones, zeros]))
        if nxt_averaged:
            rows += [np.hstack([zeros, ones]), total_next]
        if sum_next:
            rows.append(total_next)
        basis = _basis(rows)
        units = np.einsum("ij,ij->j", basis[:, :n], basis[:, :n])  # |B e_k|^2, k's z_t
        now_sent = ~heard_now[i] & (units >= 1 - 1e-9)
        next_sent = ~heard_next[i] & ~same & _spanned(basis, message)
        exposed.append(tuple(int(k) for k in np.flatnonzero(now_sent | next_sent) if k != i))
    return exposed


def tracking_exposures(
    topology: Topology, iterations: int, eval_every: int
) -> list[tuple[int, ...]]:
    r"""For each site, the sites whose model it recovers exactly under gradient tracking with a
    gossip round every iteration: the union over every pair of consecutive rounds
    :math:`t, t + 1 < T_{\max}` of :func:`_window` (with the evaluation sums that fall on
    iterations :math:`t + 1` and :math:`t + 2`), and over the last round of the single-round
    rule with the last evaluation (:func:`evaluation_exposures`).

    A pair's answer depends only on :math:`t \bmod L` and whether :math:`t + 1` and :math:`t + 2`
    are evaluated, which repeats after :math:`\operatorname{lcm}(L, e)` iterations; only those are
    visited, and the pair that ends at the last iteration.

    Args:
        topology: the run's network.
        iterations: the run's iterations :math:`T_{\max}` (rounds :math:`0 .. T_{\max} - 1`).
        eval_every: the evaluation interval :math:`e` (and the last iteration).

    The step size does not matter (:func:`_window`).
    """
    every = max(1, int(eval_every))

    def evaluated(t: int) -> bool:
        return t % every == 0 or t == iterations

    cycle = max(1, topology.cycle_length)
    span = lcm(cycle, every)
    firsts = [*range(min(iterations - 1, span + 2)), iterations - 3, iterations - 2]
    exposed = [set(ks) for ks in evaluation_exposures(topology, [iterations])]
    seen: set[tuple[int, bool, bool]] = set()
    for t in firsts:
        if t < 0 or t + 1 >= iterations:
            continue
        key = (t % cycle, evaluated(t + 1), evaluated(t + 2))
        if key in seen:
            continue
        seen.add(key)
        found = _window(
            np.asarray(topology.matrix_at(t)), topology.is_full_average_at(t),
            np.asarray(topology.matrix_at(t + 1)), topology.is_full_average_at(t + 1),
            key[1], key[2],
        )  # fmt: skip
        for i, ks in enumerate(found):
            exposed[i].update(ks)
    return [tuple(sorted(s)) for s in exposed]


def exposure_text(exposed: list[tuple[int, ...]]) -> str | None:
    """One clause per exposing site (``site 0 recovers site 2's model``), joined by ``"; "``,
    or None when nobody recovers anybody's model."""
    clauses = []
    for i, sites in enumerate(exposed):
        if len(sites) == 1:
            clauses.append(f"site {i} recovers site {sites[0]}'s model")
        elif sites:
            names = ", ".join(str(k) for k in sites[:-1]) + f" and {sites[-1]}"
            clauses.append(f"site {i} recovers the models of sites {names}")
    return "; ".join(clauses) if clauses else None
