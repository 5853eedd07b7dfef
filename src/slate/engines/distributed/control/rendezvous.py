"""Where a party of the distributed engine meets the others: :class:`Rendezvous`, built by the
launcher (:mod:`slate.engines.distributed.control.launch`) and opened by the engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slate.engines.distributed.control.store_records import Records
from slate.security.identity import SiteIdentity

__all__ = ["Rendezvous"]


@dataclass
class Rendezvous:
    """Where this party meets the others: a store client, and how to open another one.

    ``outside`` is True when the store lives outside every party (the local launcher, or
    ``slate rendezvous``): only then can any party be lost without stopping the others. With
    ``identity`` every record in the store is signed and checked
    (:mod:`slate.engines.distributed.control.store_records`).
    """

    store: Any
    connect: Callable[[], Any]
    rank: int
    world: int
    outside: bool
    identity: SiteIdentity | None = None  # this site's key and the roster: records are signed
    store_nonce: str | None = None  # the store's nonce, when this party hosts the store

    def records(self) -> Records:
        return Records(self.store, self.world, self.identity)
