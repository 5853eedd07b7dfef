"""Ctrl-C at one site of a roster run (here ``slate stop DIR`` with that site's run folder,
which sends it SIGINT as Ctrl-C does): every site names the site that stopped the run,
and the command each site prints, run exactly as printed, restarts it; the resumed run ends with
the uninterrupted run's model (run side by side with the stopped one).

Before, the sites stopped without saying who stopped them, and the printed
``slate train --resume run --engine distributed`` started the local launcher in the site's
folder (four parties, stray ``party0-3`` folders) and failed at every site with "no iteration
is held by every party". A site's folder now records its own flags (``site-flags.json``), so
``slate train --resume run`` restarts it as it was started.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slate.training.party_process import SITE_FLAGS_FILE
from tests.sites import (
    HAVE_W7A,
    SITE_FLAGS,
    finish,
    free_port,
    identity_flags,
    make_roster,
    serve,
    slate_here,
    start,
    start_party,
    wait_for,
    write_sites,
)

pytestmark = pytest.mark.skipif(not HAVE_W7A, reason="needs ../shared/data/w7a")

SITES = 3  # (the stopped site and two others, which name it: four would show nothing more)
STOPPED = 2  # the site where Ctrl-C lands
# Stopped just after the first checkpoint (25), which leaves 175 iterations (a few seconds here,
# about 20 ms each; a second or more on a fast machine) for the stop, which takes a few
# iterations, to land before the end; the later --checkpoint-every replaces SITE_FLAGS' 100.
RUN = ["--nodes", str(SITES), "--external-store", "--iterations", "200", *SITE_FLAGS,
       "--checkpoint-every", "25"]  # fmt: skip


def start_sites(root: Path, roster: Path, port: int, stopped: bool) -> list[subprocess.Popen]:
    """The sites of one run; in the run that is ``stopped``, the stopped site is a fresh
    interpreter (``slate stop`` checks its command line); the uninterrupted run's are forks."""
    return [start_party(root, r, port, *RUN, *identity_flags(roster, r),
                        fresh=stopped and r == STOPPED) for r in range(SITES)]  # fmt: skip


def printed_command(output: str) -> list[str]:
    """The command after "Continue with:", up to the note in brackets, as words."""
    found = re.search(r"Continue with: (slate [^(\n]*?)(?: \(|\.?$)", output, re.MULTILINE)
    assert found is not None, output[-3000:]
    return shlex.split(found.group(1))


def models(root: Path) -> list[dict[str, torch.Tensor]]:
    out = []
    for r in range(SITES):
        state = torch.load(root / f"site{r}" / "run" / "model.pt", weights_only=False)
        tensors = state if isinstance(state, dict) else {"x": state}
        out.append({k: v for k, v in tensors.items() if isinstance(v, torch.Tensor)})
    return out


@pytest.mark.processes
def test_ctrl_c_at_one_site_is_named_everywhere_and_the_printed_command_resumes(tmp_path):
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    for root in (reference, stopped):
        write_sites(root, parties=SITES, rows=200)
    roster = make_roster(stopped, SITES)
    for r in range(SITES):  # the same keys and roster for the uninterrupted run
        shutil.copy2(stopped / f"site{r}" / f"site{r}.key", reference / f"site{r}")

    # The uninterrupted run goes side by side with the stopped one, on its own rendezvous.
    reference_port = free_port()
    reference_server = serve(reference_port, "--roster", str(roster))
    reference_sites = start_sites(reference, roster, reference_port, stopped=False)
    port = free_port()
    while port == reference_port:  # (that server may not listen yet)
        port = free_port()
    server = serve(port, "--roster", str(roster))
    try:
        parties = start_sites(stopped, roster, port, stopped=True)
        folders = [stopped / f"site{r}" / "run" for r in range(SITES)]
        wait_for(
            lambda: all(list(f.glob("checkpoint-rank*.pt")) for f in folders),
            "every site's first checkpoint",
            process=parties[STOPPED],
        )
        stop = slate_here("stop", str(folders[STOPPED]), "--timeout", "0")  # (SIGINT to it)
        assert stop.returncode == 0 and "asked the site of" in stop.stdout, stop.stderr
        done = finish(parties)
        server.send_signal(signal.SIGINT)  # the old rendezvous still holds the stopped run
        server.communicate(timeout=60)
        for rank, (code, text) in enumerate(done):
            assert code == 130, f"site {rank}: {text[-3000:]}"
            assert "Traceback" not in text
            said = [line for line in text.splitlines() if "Interrupted at iteration" in line]
            assert len(said) == 1, text[-3000:]
            who = "this site, party 2 (site2)," if rank == STOPPED else "party 2 (site2) was"
            assert who in said[0], said[0]
            record = folders[rank] / SITE_FLAGS_FILE
            assert json.loads(record.read_text())["rank"] == rank
            assert stat.S_IMODE(record.stat().st_mode) == 0o600  # (names the key's path)
        commands = [printed_command(text) for _, text in done]
        assert commands[0] == ["slate", "train", "--resume", "run"], commands

        server = serve(port, "--roster", str(roster))  # a new rendezvous, as the note says
        again = [
            start([sys.executable, "-m", *command], cwd=stopped / f"site{r}")
            for r, command in enumerate(commands)
        ]  # fmt: skip
        for rank, (code, text) in enumerate(finish(again)):
            assert code == 0, f"site {rank}: {text[-3000:]}"
            assert "Traceback" not in text
            assert rank > 0 or "resumed from iteration" in text, text[-3000:]  # (party 0 says)
        server.communicate(timeout=60)
        assert server.returncode == 0
        for rank, (code, text) in enumerate(finish(reference_sites)):
            assert code == 0, f"reference site {rank}: {text[-3000:]}"
        reference_server.communicate(timeout=60)
    finally:
        for process in (server, reference_server, *reference_sites):  # (on a failure)
            if process.poll() is None:
                process.kill()
    for r in range(SITES):  # no launcher's party folders in a site's run folder
        assert not list((stopped / f"site{r}" / "run").glob("party*")), r
    for resumed, uninterrupted in zip(models(stopped), models(reference), strict=True):
        assert resumed.keys() == uninterrupted.keys() and resumed
        for name in resumed:
            assert torch.equal(resumed[name], uninterrupted[name]), name


def test_a_sites_folder_without_its_flags_record_is_refused_in_one_paragraph(tmp_path):
    """A record that slate did not write (here: truncated) is refused, naming the flags."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / SITE_FLAGS_FILE).write_text('{"format": "slate-site-flags-1", "rank"')
    done = slate_here("train", "--resume", str(folder), cwd=tmp_path)
    assert done.returncode == 2
    assert "site flags record" in done.stderr and "--rendezvous" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_slate_stop_names_a_folder_without_a_running_site(tmp_path):
    """No record, and a record whose process has ended: one paragraph each, exit 2, nothing
    signalled."""
    done = slate_here("stop", str(tmp_path))
    assert done.returncode == 2 and "no site's record" in done.stderr
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    record = {"format": "slate-site-flags-1", "rank": 1, "rendezvous": "127.0.0.1:1",
              "timeout": 30, "roster": None, "key": None, "pid": int(dead.stdout)}  # fmt: skip
    (tmp_path / SITE_FLAGS_FILE).write_text(json.dumps(record))
    done = slate_here("stop", str(tmp_path))
    assert done.returncode == 2 and "is not running" in done.stderr
    assert f"slate train --resume {tmp_path}" in " ".join(done.stderr.split())
