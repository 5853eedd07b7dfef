"""What a site opened, recorded (tests only): ``SLATE_RECORD_OPENED=DIR`` makes every sealed
message a party opens land, as its plaintext bytes, in
``DIR/rank{r}/from{s}-{seq}-{kind}.bin`` (``r`` the receiver, ``s`` the sender, ``seq`` the
receiver's count of opened messages, ``kind`` the exchange: ``gossip``, ``average``,
``evaluation``, ``column-statistics``, ...). The masked-sum tests read these files to show that
no single message holds a site's own value; a real run never sets it.
:mod:`slate.engines.distributed.wire.sealed_wire` calls :class:`OpenedRecorder` on every
message it opens, when the faults plan gives it one."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["RECORD_ENV", "UNMASKED_ENV", "OpenedRecorder"]

#: ``SLATE_RECORD_OPENED=DIR``: every opened sealed message written under ``DIR``.
RECORD_ENV = "SLATE_RECORD_OPENED"
#: ``SLATE_UNMASKED_SUMS=1``: sums under a roster sent sealed but unmasked, each member's own
#: value to every member (what a sum was before masking), for tests and benchmarks that compare.
UNMASKED_ENV = "SLATE_UNMASKED_SUMS"


class OpenedRecorder:
    """Test-only: writes each message party ``rank`` opens to ``folder/rank{rank}/``."""

    def __init__(self, folder: str | Path, rank: int) -> None:
        self.folder = Path(folder) / f"rank{rank}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def opened(self, sender: int, kind: str, payload: bytes) -> None:
        """Keep ``payload``, opened from global rank ``sender`` in an exchange of ``kind``."""
        name = re.sub(r"[^A-Za-z0-9]+", "-", kind).strip("-") or "exchange"
        path = self.folder / f"from{sender}-{self.count}-{name}.bin"
        self.count += 1
        path.write_bytes(payload)
