r"""The start-up warning of a run whose evaluation average gives a site's model away.

At every evaluation each site opens the average of all :math:`N` models (masked under a roster:
the total only). Subtracting its own model and those its neighbours sent it in the round before
the evaluation leaves the sum of the models of the sites it does not hear from
(:mod:`slate.topology.disclosure`); when that is one site, it is that site's model, exactly. The
run says so once, at start, naming who recovers whose model (:func:`disclosure_warning`).

It says so where the claim holds:

* without ``--dp-epsilon``: with it the recovered model is a post-processing of noised, clipped
  gradients, covered by the run's :math:`\varepsilon` like the gossip itself;
* with plain mixing: ``--robust clip`` may clip a message (the column sums then differ from
  the messages'), so no claim is made. With ``--compress`` a site hears its neighbours' public
  copies :math:`\hat x_j`, not their messages: the same subtraction leaves the unheard site's
  model plus the neighbours' compression residuals :math:`z_j - \hat x_j` (an identity: CHOCO's
  round keeps the sum), and the warning says so, with what was measured (int8: 1.4e-5 of the
  model's norm; ``sign``: more than the model's distance to the average);
* with ``--gradient-tracking`` (a round every iteration, SLATE, SLATE-M or D-PSGD) the tracked
  directions are gossiped too and consecutive rounds are linked: a neighbour's next message is
  one more equation, and a site may compute models it never received from gossip alone (a ring
  of 5 and of 8, not 9): :func:`slate.topology.disclosure.tracking_exposures`, its own paragraph;
* over the graph of the rounds before the run's evaluations (every ``--eval-every``-th
  iteration and the last), with the starting parties: a graph that changes after a loss is not
  looked at again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slate.topology.disclosure import exposure_text, run_exposures, tracking_exposures

if TYPE_CHECKING:
    from slate.training.run import Run

__all__ = ["TRACKED_STEP", "TRACKING_LIMIT", "disclosure_warning", "exposures_of", "tracked"]

#: The algorithms whose step is ``mix_step(x, v, lr)`` with ``v`` the tracked direction, so that
#: under gradient tracking :math:`z_{t+1} = \mathbf{M}_t z_t - \eta \mathbf{M}_{t+1} q_{t+1}`
#: (CODA steps its dual variable with another rate and clamps it: the single-round rule only).
TRACKED_STEP = ("slate", "slate-m", "dpsgd")
#: The most sites whose linked rounds are analysed at start (1.2 s for 256 on a busy 2-core
#: machine, 10 s for 512); beyond, the single-round rule alone, which may name fewer sites.
TRACKING_LIMIT = 256


def exposures_of(run: Run) -> list[tuple[int, ...]] | None:
    """For each site, the sites whose model it recovers exactly from the evaluation average,
    its own model and its neighbours' (:func:`slate.topology.disclosure.run_exposures`); None
    where the run makes no claim (``--dp-epsilon``, ``--robust``, one party). With ``--compress``
    the single-round rule, up to the neighbours' compression residuals."""
    settings = run.settings
    comm = settings.communication
    if settings.privacy is not None or run.plan.nodes < 2:
        return None
    if comm.robust != "none":
        return None
    section, topology = settings.algorithm, run.base_topology
    if tracked(run):
        return tracking_exposures(topology, section.iterations, run.plan.eval_every)
    return run_exposures(topology, section.iterations, run.plan.eval_every, comm.gossip_every)


def tracked(run: Run) -> bool:
    """Whether the run gossips tracked directions every iteration with an algorithm of
    :data:`TRACKED_STEP`, dense, on at most :data:`TRACKING_LIMIT` sites (the linked rounds of
    :func:`slate.topology.disclosure.tracking_exposures`)."""
    section = run.settings.algorithm
    comm = run.settings.communication
    return (
        bool(section.config.gradient_tracking)
        and comm.gossip_every == 1
        and comm.compress == "none"
        and run.plan.nodes <= TRACKING_LIMIT
        and section.name in TRACKED_STEP
    )


def disclosure_warning(run: Run) -> str | None:
    """One paragraph for the console at start, or None when no site recovers another's model.

    The evaluation at iteration :math:`T` averages :math:`x_T = \\mathbf{M} z` (:math:`z` the
    models the sites sent in the round before, :math:`\\mathbf{M}` doubly stochastic), so
    :math:`N \\bar x_T - z_i - \\sum_{j \\in \\mathcal N_i} z_j = \\sum_{k \\in C_i} z_k` over
    the sites :math:`C_i` that site :math:`i` does not hear from."""
    exposed = exposures_of(run)
    named = exposure_text(exposed) if exposed is not None else None
    if named is None:
        return None
    topology, compress = run.settings.communication.topology, run.settings.communication.compress
    if compress != "none":
        return (
            f"warning: on topology {topology} with --compress {compress} and without "
            f"--dp-epsilon, the evaluation average gives single sites' models away, up to "
            f"compression: {named}. At each evaluation a site subtracts its own model and its "
            "copies of its neighbours' from N times the average; what is left is the model of "
            "the one site it does not hear from, plus what its neighbours' messages have not "
            "carried yet (their compression residuals: with int8 a measured 1.4e-5 of the "
            "model's norm, with sign more than the model's distance to the average). Train "
            "with --dp-epsilon, or on a graph where no site misses exactly one other (with 3 "
            "sites or more: a ring of 5 or more, full): docs/security.md."
        )
    if tracked(run):
        return (
            f"warning: on topology {topology} with --gradient-tracking and without "
            f"--dp-epsilon, a site computes models that other sites sent their own neighbours, "
            f"exactly: {named}. The tracked directions are gossiped too, so each neighbour's "
            "next message is one more equation on the models of the sites a site does not hear "
            "from, beside the evaluation average (N times the average, minus its own model and "
            "its neighbours', is the sum of the others'). Train with --dp-epsilon, or without "
            "--gradient-tracking: docs/security.md."
        )
    return (
        f"warning: on topology {topology} without --dp-epsilon, the evaluation average gives "
        f"single sites' models away: {named}. At each evaluation a site subtracts its own model "
        "and those its neighbours sent it from N times the average; what is left is the sum of "
        "the models of the sites it does not hear from, which on this graph is one site's, "
        "exactly (masked sums hide a site's share of a sum, not this). Train with --dp-epsilon, "
        "or on a graph where no site misses exactly one other (with 3 sites or more: a ring of 5 "
        "or more, full): docs/security.md."
    )
