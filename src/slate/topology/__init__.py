r"""Network topologies: the doubly stochastic mixing matrix :math:`\underline{\mathbf{W}}`.

Section 3.1 of the SLATE paper describes the network of :math:`N` parties by a matrix
:math:`\underline{\mathbf{W}} = \{w_{ij}\} \in \mathbb{R}^{N \times N}` with

1. :math:`w_{ij} > 0` iff nodes :math:`i` and :math:`j` are linked (or :math:`i = j`),
2. :math:`\underline{\mathbf{W}} = \underline{\mathbf{W}}^\top`,
3. :math:`\underline{\mathbf{W}} \mathbf{1} = \mathbf{1}` and
   :math:`\mathbf{1}^\top \underline{\mathbf{W}} = \mathbf{1}^\top`,

and measures how well it mixes by :math:`\lambda = \|\underline{\mathbf{W}} - \mathbf{J}\|_2`
with :math:`\mathbf{J} = \frac1N \mathbf{1}\mathbf{1}^\top`; for a symmetric doubly stochastic
matrix this is the second largest absolute eigenvalue. Gossip converges to the average iff
:math:`\lambda < 1`, i.e. the graph is connected (and not periodic).

Builders return plain ``float64`` arrays; :func:`build_topology` wraps them, validated, in a
:class:`Topology`, which also handles the time-varying federated schedule
(:math:`\mathbf{W} = \mathbf{I}` on ordinary rounds and :math:`\mathbf{J}` every ``period``-th).

The package is split along these seams:

- :mod:`slate.topology.graph`: graph primitives (size check, :math:`\mathbf{J}`,
  Metropolis-Hastings weights, connected components, :func:`is_connected`);
- :mod:`slate.topology.matrix_checks`: :func:`validate`, :func:`mixing_rate`, :func:`spectral_gap`;
- :mod:`slate.topology.builders`: the named graphs;
- :mod:`slate.topology.matrix_file`: :func:`from_file` (``file:W.csv``, ``.txt``, ``.npy``);
- :mod:`slate.topology.schedule`: the time-varying :class:`Topology` (static, periodic, or a
  cycle of round matrices);
- :mod:`slate.topology.cycles`: cycles that average exactly, the one-peer exponential graph
  (Ying et al., NeurIPS 2021) and the Base-(k+1) graphs ``base-K`` (Takezawa et al., NeurIPS
  2023);
- :mod:`slate.topology.registry`: :func:`build_topology` by name;
- :mod:`slate.topology.printing`: :func:`describe`, :func:`format_matrix`;
- :mod:`slate.topology.disclosure`: which site's model the evaluation average gives away to
  whom, from the graph of the rounds before the evaluations (:func:`run_exposures`);
- :mod:`slate.topology.survivors`: :func:`surviving_graph` and :func:`surviving_topology`, the
  mixing matrix over the parties left after some are lost, and its disconnection rule.
"""

from __future__ import annotations

from slate.topology.builders import (
    erdos_renyi,
    exponential,
    federated,
    full,
    ring,
    star,
    torus,
)
from slate.topology.cycles import (
    base_graph,
    base_rounds,
    hyper_hypercube_rounds,
    one_peer_exponential,
    one_peer_exponential_rounds,
    simple_base_rounds,
)
from slate.topology.graph import diameter, is_connected
from slate.topology.matrix_checks import mixing_rate, spectral_gap, validate
from slate.topology.matrix_file import from_file
from slate.topology.printing import W7A_MODEL_BYTES, describe, describe_cycle, format_matrix
from slate.topology.registry import FILE_PREFIX, TOPOLOGY_NAMES, build_topology
from slate.topology.schedule import Topology
from slate.topology.survivors import (
    Bridge,
    SurvivorGraph,
    surviving_graph,
    surviving_topology,
)

__all__ = [
    "FILE_PREFIX",
    "TOPOLOGY_NAMES",
    "W7A_MODEL_BYTES",
    "Bridge",
    "SurvivorGraph",
    "Topology",
    "base_graph",
    "base_rounds",
    "build_topology",
    "describe",
    "describe_cycle",
    "diameter",
    "erdos_renyi",
    "exponential",
    "federated",
    "format_matrix",
    "from_file",
    "full",
    "hyper_hypercube_rounds",
    "is_connected",
    "mixing_rate",
    "one_peer_exponential",
    "one_peer_exponential_rounds",
    "ring",
    "simple_base_rounds",
    "spectral_gap",
    "star",
    "surviving_graph",
    "surviving_topology",
    "torus",
    "validate",
]
