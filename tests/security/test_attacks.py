"""The attacks on a run by a stranger at the rendezvous or a participant (docs/security.md),
tried as an attacker would, on real processes: per-site w7a files,
a ``slate rendezvous``, one ``--rank`` process per site.

* a participant sends a pickle instead of its schema: nothing runs, the sender is named;
* a stranger reaches the rendezvous first and registers as rank 2: with a roster it is refused,
  the real site 2 joins, and the model is bit-identical to the run without the stranger;
* a stranger writes a join request for rank 7 and oversized values: ignored without a roster;
* a stranger writes the end of the run: the rendezvous of a roster run goes on;
* every party, through a loss and a rejoin, with and without a roster, unpickles nothing
  (``sys.addaudithook`` records every ``pickle.find_class``): checked in the loss-and-rejoin
  runs of tests/engines/test_party_loss.py; here, that the hook fires.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from slate.engines.distributed.control import session
from slate.engines.distributed.control.launch import serve_rendezvous
from slate.engines.distributed.control.liveness import FINAL_MEMBERS_KEY, LEFT_KEY
from slate.engines.distributed.control.store_records import Records
from slate.security import site_identity
from tests.sites import (
    AUDITED,
    HAVE_W7A,
    SITE_FLAGS,
    free_port,
    identity_flags,
    make_roster,
    run_command,
    script,
    serve,
    start_party,
    write_sites,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo on Linux"),
    pytest.mark.skipif(not HAVE_W7A, reason="w7a not in shared"),
]

ATTACKER = """
import os, pickle, sys
import slate.engines.distributed.wire.json_exchange as engine

class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + {marker!r},))

PAYLOADS = {{
    "pickle": lambda value: pickle.dumps(Payload()),
    "shape": lambda value: b'[{{"rank": "two"}}]',
    "size": lambda value: b"[" + b"0," * (33 << 20) + b"0]",  # 66 MB, over the 64 MiB limit
}}
engine.encode = PAYLOADS[{payload!r}]  # what it sends instead of every fact
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""

STRANGER = """
import sys
import slate.engines.distributed.control.launch as launch

launch._check_rendezvous_roster = lambda *args: None  # an attacker's copy skips the check
from slate.cli import main
sys.exit(main(sys.argv[1:]))
"""


def client(port: int):
    return dist.TCPStore("127.0.0.1", port, is_master=False,
                         timeout=datetime.timedelta(seconds=30))  # fmt: skip


def finish(parties, server=None, timeout: float = 300) -> list[tuple[str, str]]:
    outputs = [p.communicate(timeout=timeout) for p in parties]
    if server is not None:
        server.communicate(timeout=60)
    return outputs


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.processes
@pytest.mark.parametrize(
    ("payload", "problem"),
    [("pickle", "not JSON"), ("shape", "lacks the fields"), ("size", "(limit 67108864)")],
)
def test_a_malformed_schema_runs_nothing_and_names_its_sender(tmp_path, payload, problem):
    """A pickle, JSON of another shape, or a message over the size limit instead of a schema.
    Before, all_gather_object unpickled the pickle: its command ran inside parties 0 and 1."""
    write_sites(tmp_path, parties=3, rows=200)
    marker = tmp_path / "the-payload-ran"
    attacker = tmp_path / "attacker.py"
    attacker.write_text(ATTACKER.format(marker=str(marker), payload=payload))
    port = free_port()
    flags = ["--nodes", "3", *SITE_FLAGS, "--iterations", "50"]
    parties = [
        start_party(tmp_path, r, port, *flags,
                    program=script(attacker) if r == 2 else None)
        for r in range(3)
    ]  # fmt: skip
    outputs = finish(parties)
    assert not marker.exists()
    for rank in (0, 1):
        err = outputs[rank][1]
        assert parties[rank].returncode == 2, err
        assert "Party 2 sent a malformed schema" in err and problem in err, err
        assert "Traceback" not in err


def run_with_roster(root: Path, roster: Path, stranger: bool) -> list[tuple[str, str]]:
    """Three sites with the roster; with ``stranger``, a process without a key takes rank 2 at
    the rendezvous (its registration and gloo address written) before the real site 2 starts."""
    write_sites(root, parties=3, rows=300)
    port = free_port()
    server = serve(port, "--roster", str(roster))
    # 20 iterations: the stranger's records are ignored at the start; the models still compared
    # bit for bit with the run without it
    flags = ["--nodes", "3", "--external-store", *SITE_FLAGS, "--iterations", "20"]
    parties = [start_party(root, r, port, *flags, *identity_flags(roster, r)) for r in (0, 1)]
    intruder = None
    if stranger:
        (root / "stranger").mkdir()
        (root / "stranger" / "train.svm").write_text(made_up_rows(600, seed=7))
        (root / "stranger" / "test.svm").write_text(made_up_rows(200, seed=8))
        (root / "stranger.py").write_text(STRANGER)
        program = script(root / "stranger.py")
        intruder = start_party(root, 2, port, *flags, program=program, site="stranger")
        store = client(port)
        wait_for(lambda: store.check(["slate/process/2", "slate/pg0/0//cpu//0/2"]),
                 "the stranger's registration and address")  # fmt: skip
    parties.append(start_party(root, 2, port, *flags, *identity_flags(roster, 2)))
    outputs = finish(parties, server)
    if intruder is not None:
        intruder.kill()
        outputs.append(intruder.communicate(timeout=60))
    for rank, (process, (_, err)) in enumerate(zip(parties, outputs, strict=False)):
        assert process.returncode == 0, f"party {rank}: {err}"
        assert "Traceback" not in err
    return outputs


def made_up_rows(rows: int, seed: int) -> str:
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(rows, generator=gen) < 0.2).long() * 2 - 1
    columns = torch.randint(1, 300, (rows, 5), generator=gen)
    return "".join(
        f"{label:+d} " + " ".join(f"{c}:1" for c in sorted(set(cols.tolist()))) + "\n"
        for label, cols in zip(labels.tolist(), columns, strict=True)
    )


@pytest.mark.processes
def test_with_a_roster_a_stranger_cannot_take_a_rank(tmp_path):
    """Before: the stranger trained to the end on its made-up rows and got the model, the real
    site 2 was refused as 'a second copy', and the honest sites' AP fell."""
    roster = make_roster(tmp_path / "keys", 3)
    for r in range(3):
        key = tmp_path / "keys" / f"site{r}" / f"site{r}.key"
        for root in ("attacked", "clean"):
            (tmp_path / root / f"site{r}").mkdir(parents=True, exist_ok=True)
            (tmp_path / root / f"site{r}" / f"site{r}.key").write_bytes(key.read_bytes())
            (tmp_path / root / f"site{r}" / f"site{r}.key").chmod(0o600)
    attacked = run_with_roster(tmp_path / "attacked", roster, stranger=True)
    run_with_roster(tmp_path / "clean", roster, stranger=False)
    assert "already running" not in attacked[2][1]  # the real site 2 was not refused
    assert any("ignored a record" in err for _, err in attacked[:3])
    for r in range(3):
        ours = torch.load(tmp_path / "attacked" / f"site{r}" / "run" / "model.pt",
                          weights_only=True)  # fmt: skip
        clean = torch.load(tmp_path / "clean" / f"site{r}" / "run" / "model.pt",
                           weights_only=True)  # fmt: skip
        assert all(torch.equal(ours[k], clean[k]) for k in clean)
    assert not (tmp_path / "attacked" / "stranger" / "run" / "model.pt").exists()


@pytest.mark.processes
def test_without_a_roster_a_fake_join_and_oversized_values_are_ignored(tmp_path):
    """Before: the parties admitted rank 7 of a 3-party run, counted it lost, rolled back and
    admitted it again, 17 times in 5.5 minutes."""
    write_sites(tmp_path, parties=3, rows=300)
    port = free_port()
    server = serve(port)
    # two checkpoint boundaries (30, 60) after the stranger's records are written (they are
    # written once the process group is open, before the sites' data set-up and first step)
    flags = ["--nodes", "3", "--external-store", *SITE_FLAGS, "--iterations", "90",
             "--checkpoint-every", "30"]  # fmt: skip
    parties = [start_party(tmp_path, r, port, *flags) for r in range(3)]
    store = client(port)
    wait_for(lambda: store.check(["slate/generation"]), "the run to start")
    store.set("slate/process/7", "stranger:1")
    request = {"process": "stranger:1", "reason": "let me in", "nonce": "00"}
    store.set("slate/join_request/7", json.dumps(request))
    store.set("slate/g0/failed", "0" * (1 << 20))  # 1 MiB where a rank belongs
    store.set(FINAL_MEMBERS_KEY, "9" * (1 << 20))
    outputs = finish(parties)
    for rank, (process, (_, err)) in enumerate(zip(parties, outputs, strict=True)):
        assert process.returncode == 0, f"party {rank}: {err}"
        assert "Traceback" not in err
        summary = json.loads((tmp_path / f"site{rank}" / "run" / "summary.json").read_text())
        assert summary["party_events"] == [] and summary["iterations"] == 90
    said, _ = server.communicate(timeout=60)
    assert server.returncode == 0  # it stayed until every party had left
    assert "over the limit" in said and "every party has left" in said


def test_with_a_roster_a_forged_end_does_not_end_the_rendezvous(tmp_path):
    """Before: a stranger who set slate/final_members made 'slate rendezvous' exit at once."""
    roster = make_roster(tmp_path, 1)
    identity = site_identity(roster, tmp_path / "site0" / "site0.key")
    port = free_port()
    lines: list[str] = []
    result: list[int] = []
    server = threading.Thread(
        target=lambda: result.append(serve_rendezvous(
            port, "127.0.0.1", lines.append, idle_timeout=0, roster=identity.roster)),
    )  # fmt: skip
    server.start()
    store = client(port)
    while session.read_store_nonce(store) is None:  # (the rendezvous writes it first)
        time.sleep(0.01)
    records = Records(store, 1, identity)
    session.derive(records, 0, 30, session.read_store_nonce(store))  # the run's session
    store.set(FINAL_MEMBERS_KEY, "[0]")  # a stranger's end of the run
    store.add(LEFT_KEY, 5)
    wait_for(lambda: any("ignored a record" in line for line in lines), "the note")
    assert server.is_alive()
    records.put(FINAL_MEMBERS_KEY, "[0]")  # the real end, signed by the site
    records.put(f"{LEFT_KEY}/0", "0")
    server.join(timeout=30)
    assert result == [0] and "every party has left" in lines[-1]


# Through a loss and a rejoin, with and without a roster, no site unpickles anything: every site
# of tests/engines/test_party_loss.py's kill_and_bring_back runs under the audit hook of
# tests.sites.AUDITED (without a roster: test_a_killed_site_restarted_with_resume_rejoins_...;
# with one: test_a_site_lost_before_its_first_checkpoint_rejoins_from_its_setup_record).


@pytest.mark.processes
def test_the_audit_hook_records_an_unpickling_where_there_is_one(tmp_path):
    """The hook those runs use is no hook that cannot fire."""
    check = tmp_path / "check.py"
    check.write_text(AUDITED.split("from slate")[0]
                     + "import collections, pickle\n"
                     + "pickle.loads(pickle.dumps(collections.OrderedDict()))\n")  # fmt: skip
    log = tmp_path / "check.log"
    env = {**os.environ, "SLATE_TEST_UNPICKLED": str(log)}
    done = run_command(script(check), env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "OrderedDict" in log.read_text()
