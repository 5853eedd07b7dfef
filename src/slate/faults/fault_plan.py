"""Every test-only fault of this process, read once from the environment: :class:`FaultPlan`.

The hooks, each documented with the code that acts on it:

* ``SLATE_KILL_AT``: a party dies or freezes at a moment (:mod:`slate.faults.kills`);
* ``SLATE_ATTACK``: a party corrupts what it sends its neighbours, or lies in a sum
  (:mod:`slate.faults.attacks`, :mod:`slate.faults.lies`);
* ``SLATE_FLIP_SEALED``, ``SLATE_REPLAY_SEALED``, ``SLATE_RELAY_SEALED``: a party tampers with a
  sealed message, and ``SLATE_DIE_IN_SUM``: a party dies half-way through a masked sum
  (:mod:`slate.faults.tamper`);
* ``SLATE_RECORD_OPENED``: every sealed message a party opens written to a folder, and
  ``SLATE_UNMASKED_SUMS``: sums under a roster sent unmasked, for comparison
  (:mod:`slate.faults.opened`);
* ``SLATE_DP_TEST_SEED=INT``: under ``--dp-epsilon``, the sample and the noise drawn from
  streams keyed by this seed (:meth:`slate.security.secret_random.SecretStream.for_test`) in
  place of ``os.urandom``'s secret keys, so that a test can reproduce them; refused with
  ``--roster`` (:attr:`FaultPlan.dp_test_seed`).

A real run sets none of them. :meth:`FaultPlan.from_environment` is called once per process by
the ``slate train`` command (and by a test that wants a hook in its own process); everything
else receives the plan, or its part (:meth:`FaultPlan.kills`, :meth:`FaultPlan.lies`,
:meth:`FaultPlan.attacker`, :meth:`FaultPlan.tamper`, :meth:`FaultPlan.recorder`,
:attr:`FaultPlan.masks`), as an argument and never reads the
environment. ``FaultPlan()`` is the plan of no fault.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from slate.errors import ConfigError
from slate.faults.attacks import ATTACK_ENV, Attack, Attacker, parse_attacks
from slate.faults.kills import FAULT_ENV, Kill, Kills, parse_kills
from slate.faults.lies import Lies
from slate.faults.opened import RECORD_ENV, UNMASKED_ENV, OpenedRecorder
from slate.faults.tamper import HOOKS, Tamper

__all__ = ["DP_SEED_ENV", "FaultPlan"]

#: ``SLATE_DP_TEST_SEED=INT``: reproducible privacy randomness, for tests only.
DP_SEED_ENV = "SLATE_DP_TEST_SEED"


@dataclass(frozen=True)
class FaultPlan:
    """The faults to inject, of every rank: ``kills`` (``SLATE_KILL_AT``), ``attacks``
    (``SLATE_ATTACK``: gossip attacks and lies), ``tampers`` (hook name -> ``(rank, N)`` of
    each sealed-message hook set), ``record_opened`` (``SLATE_RECORD_OPENED``'s folder, "" for
    none), ``unmasked`` (``SLATE_UNMASKED_SUMS=1``) and ``dp_test_seed``
    (``SLATE_DP_TEST_SEED``: the privacy streams' test seed, None for secret ones)."""

    kills: tuple[Kill, ...] = ()
    attacks: tuple[Attack, ...] = ()
    tampers: tuple[tuple[str, int, int], ...] = ()
    record_opened: str = ""
    unmasked: bool = False
    dp_test_seed: int | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> FaultPlan:
        """The plan of the ``SLATE_*`` hooks in ``environ`` (default: this process's
        environment). A malformed ``SLATE_ATTACK`` raises :class:`~slate.errors.ConfigError`
        naming the bad part; a malformed ``SLATE_KILL_AT`` item or sealed-message hook is
        ignored."""
        env = os.environ if environ is None else environ
        tampers = []
        for hook in HOOKS:
            who, _, at = env.get(hook, "").partition("@")
            if who.strip().isdigit() and at.strip().isdigit():
                tampers.append((hook, int(who), int(at)))
        return cls(
            kills=tuple(parse_kills(env.get(FAULT_ENV))),
            attacks=tuple(parse_attacks(env.get(ATTACK_ENV))),
            tampers=tuple(tampers),
            record_opened=env.get(RECORD_ENV, "").strip(),
            unmasked=env.get(UNMASKED_ENV, "").strip() == "1",
            dp_test_seed=_integer(env.get(DP_SEED_ENV)),
        )

    def kills_of(self, own_party: int | None) -> Kills:
        """The moments at which this process's party fails (none in a process that runs every
        party: the simulator's losses are ``--drop-party``'s)."""
        return Kills(self.kills, own_party)

    def lies(self, own_party: int | None) -> Lies:
        """This distributed party's lies; none in a process that runs every party."""
        if own_party is None:
            return Lies()
        return Lies([a for a in self.attacks if a.rank == own_party])

    def attacker(
        self, local_parties: list[int], output_layer: tuple[int, int] | None
    ) -> Attacker | None:
        """What the local parties send in place of their rows when a gossip attack names one
        of them (``output_layer``: the model's last ``nn.Linear`` in the flat vector, which
        ``drift`` negates); None when every local party sends honestly."""
        attacker = Attacker(local_parties, self.attacks, output_layer)
        return attacker if attacker.attacks else None

    def tamper(self, rank: int) -> Tamper | None:
        """Party ``rank``'s sealed-message hooks (one object for the whole process), or None
        when no hook names it: the normal case, which costs one ``is None`` per message."""
        due = {hook: at for hook, who, at in self.tampers if who == rank}
        return Tamper(due) if due else None

    def recorder(self, rank: int) -> OpenedRecorder | None:
        """Party ``rank``'s record of the sealed messages it opens, or None (a real run)."""
        return OpenedRecorder(self.record_opened, rank) if self.record_opened else None

    def privacy_seed(self, under_roster: bool) -> int | None:
        """``SLATE_DP_TEST_SEED``'s seed for ``--dp-epsilon``'s streams (None: secret ones);
        a run ``under_roster`` refuses it, in one paragraph."""
        if self.dp_test_seed is not None and under_roster:
            raise ConfigError(
                f"{DP_SEED_ENV} is set: it makes --dp-epsilon's sample and noise reproducible "
                "for tests, and a run under --roster refuses it (the sites' randomness must "
                f"stay secret). Unset {DP_SEED_ENV}."
            )
        return self.dp_test_seed

    @property
    def masks(self) -> bool:
        """Whether sums under a roster are masked (always, unless a test says otherwise)."""
        return not self.unmasked


def _integer(text: str | None) -> int | None:
    """An integer hook's value, None where it is unset or malformed."""
    text = (text or "").strip()
    return int(text) if text.lstrip("-").isdigit() else None
