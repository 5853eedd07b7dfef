r"""The start-up warning of a run whose evaluation average gives a site's model away.

At every evaluation each site opens the average of all :math:`N` models (masked under a roster:
the total only). Subtracting its own model and those its neighbours sent it in the round before
the evaluation leaves the sum of the models of the sites it does not hear from
(:mod:`slate.topology.disclosure`); when that is one site, it is that site's model, exactly. The
run says so once, at start, naming who recovers whose model (:func:`disclosure_warning`).

It says so only where the claim holds exactly:

* without ``--dp-epsilon``: with it the recovered model is a post-processing of noised, clipped
  gradients, covered by the run's :math:`\varepsilon` like the gossip itself;
* with dense gossip and plain mixing: with ``--compress`` a site hears public copies, not the
  messages, and ``--robust clip`` may clip a message (the column sums then differ from the
  messages'), so the same algebra gives an approximation only (``docs/security.md``);
* over the graph of the rounds before the run's evaluations (every ``--eval-every``-th
  iteration and the last), with the starting parties: a graph that changes after a loss is not
  looked at again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slate.topology.disclosure import exposure_text, run_exposures

if TYPE_CHECKING:
    from slate.training.run import Run

__all__ = ["disclosure_warning", "exposures_of"]


def exposures_of(run: Run) -> list[tuple[int, ...]] | None:
    """For each site, the sites whose model it recovers exactly from the evaluation average,
    its own model and its neighbours' (:func:`slate.topology.disclosure.run_exposures`); None
    where the run makes no exact claim (``--dp-epsilon``, ``--compress``, ``--robust``, one
    party)."""
    settings = run.settings
    comm = settings.communication
    if settings.privacy is not None or run.plan.nodes < 2:
        return None
    if comm.compress != "none" or comm.robust != "none":
        return None
    return run_exposures(
        run.base_topology, settings.algorithm.iterations, run.plan.eval_every, comm.gossip_every
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
    topology = run.settings.communication.topology
    return (
        f"warning: on topology {topology} without --dp-epsilon, the evaluation average gives "
        f"single sites' models away: {named}. At each evaluation a site subtracts its own model "
        "and those its neighbours sent it from N times the average; what is left is the sum of "
        "the models of the sites it does not hear from, which on this graph is one site's, "
        "exactly (masked sums hide a site's share of a sum, not this). Train with --dp-epsilon, "
        "or on a graph where no site misses exactly one other (with 3 sites or more: a ring of 5 "
        "or more, full): docs/security.md."
    )
