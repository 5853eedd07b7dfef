"""The guards by ``--robust`` name (:data:`GUARDS`), and the run's guard built from one.

A run builds its guard once (:func:`message_guard`) and gives it to its communicator
(:mod:`slate.security.robust`: what a guard does). ``none`` is the plain
:class:`~slate.security.robust.MessageGuard`, ``clip`` the
:class:`~slate.security.robust.ClippingGuard`; :func:`register_guard` adds one for this process
(docs/extending.md).
"""

from __future__ import annotations

from slate.errors import ConfigError
from slate.security.robust import ClippingGuard, MessageGuard, Sender

__all__ = ["GUARDS", "check_robust", "message_guard", "register_guard", "unregister_guard"]

#: The guards by ``--robust`` name: ``none`` (plain mixing, watched) and ``clip``.
GUARDS: dict[str, type[MessageGuard]] = {"none": MessageGuard, "clip": ClippingGuard}
_BUILT_IN = frozenset(GUARDS)


def check_robust(robust: str) -> None:
    """A :class:`~slate.errors.ConfigError` unless ``robust`` names a guard of :data:`GUARDS`."""
    if robust not in GUARDS:
        raise ConfigError(f"--robust must be one of {', '.join(GUARDS)}, got {robust!r}.")


def message_guard(robust: str, n: int, local_parties: list[int],
                  sender: Sender | None = None) -> MessageGuard:  # fmt: skip
    """The run's guard, built once from ``--robust`` (a name of :data:`GUARDS`: ``clip``'s
    :class:`ClippingGuard`, ``none``'s plain :class:`MessageGuard`, or a registered one);
    ``sender``: what the local parties send (the faults plan's attacker in a test; default
    their own rows)."""
    check_robust(robust)
    return GUARDS[robust](n, local_parties, sender)


def register_guard(name: str, cls: type[MessageGuard]) -> type[MessageGuard]:
    """Add ``cls`` to :data:`GUARDS` as ``--robust NAME``, for this process; returns ``cls``.
    A name taken already is a ``ValueError``, a class that is no :class:`MessageGuard` a
    ``TypeError``."""
    if not (isinstance(cls, type) and issubclass(cls, MessageGuard)):
        raise TypeError(f"register_guard takes a subclass of MessageGuard, got {cls!r}")
    if not name or name in GUARDS:
        raise ValueError(f"--robust {name!r} is taken or empty; choose another name")
    GUARDS[name] = cls
    return cls


def unregister_guard(name: str) -> None:
    """Remove the guard :func:`register_guard` added as ``name``; ``none`` and ``clip`` stay
    (a ``ValueError``), an unknown name is a ``KeyError``."""
    if name in _BUILT_IN:
        raise ValueError(f"--robust {name} is built in and cannot be unregistered")
    if name not in GUARDS:
        raise KeyError(f"no guard named {name!r} is registered")
    del GUARDS[name]
