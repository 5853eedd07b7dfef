"""The faults plan (:mod:`slate.faults`): every ``SLATE_*`` test hook read once, each part as
the code that injects it receives it, and no other module reading a hook."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from slate.errors import ConfigError
from slate.faults import FaultPlan
from slate.faults.attacks import Attack, Attacker
from slate.faults.kills import Kill
from slate.faults.tamper import FLIP_ENV, RELAY_ENV, REPLAY_ENV, Tamper
from slate.security.robust import HonestSender, Sender

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "slate"

EVERY_HOOK = {
    "SLATE_KILL_AT": "1@40, 2@0:setup,1@7:evaluation:freeze2.5,x@3,1@9:lunch,0@5:step:boom,"
    "2@60:checkpoint:freeze",
    "SLATE_ATTACK": "1@0:signflip,2@30:final-poison,1@4:rows:1.5",
    "SLATE_FLIP_SEALED": "1@200",
    "SLATE_REPLAY_SEALED": " 2@ 7",
    "SLATE_RELAY_SEALED": "one@3",
    "PATH": "/usr/bin",
}


def test_the_plan_reads_every_hook_once_into_its_parts():
    plan = FaultPlan.from_environment(EVERY_HOOK)
    # SLATE_KILL_AT: the well-formed items in order (a bad rank, moment or fault is ignored)
    assert plan.kills == (Kill(1, 40, "step", "kill"), Kill(2, 0, "setup", "kill"),
                          Kill(1, 7, "evaluation", "freeze2.5"),
                          Kill(2, 60, "checkpoint", "freeze"))  # fmt: skip
    assert plan.kills_of(1).due_at == {"step": (40, "kill"), "evaluation": (7, "freeze2.5")}
    assert plan.kills_of(2).due_at == {"setup": (0, "kill"), "checkpoint": (60, "freeze")}
    assert plan.kills_of(None).due_at == {}  # a process that runs every party: no kill
    # SLATE_ATTACK: gossip attacks for the guard's sender, lies for the distributed party
    assert plan.attacks == (Attack(1, 0, "signflip"), Attack(2, 30, "final-poison"),
                            Attack(1, 4, "rows", 1.5))  # fmt: skip
    assert set(plan.lies(1).attacks) == {"rows"} and set(plan.lies(2).attacks) == {"final-poison"}
    assert plan.lies(None).attacks == {}  # the simulator has no insider
    attacker = plan.attacker([0, 1, 2, 3], None)
    assert attacker is not None and attacker.attacks == [Attack(1, 0, "signflip")]
    assert plan.attacker([2], None) is None  # only lies: rank 2 sends honestly
    # the sealed-message hooks: per rank (an unreadable rank is ignored)
    assert plan.tampers == ((FLIP_ENV, 1, 200), (REPLAY_ENV, 2, 7))
    assert plan.tamper(1).due == {FLIP_ENV: 200}
    assert plan.tamper(2).due == {REPLAY_ENV: 7}
    assert plan.tamper(0) is None


def test_the_plan_of_no_fault_injects_nothing():
    for plan in (FaultPlan(), FaultPlan.from_environment({})):
        assert plan.kills_of(0).due_at == {}
        assert plan.lies(0).attacks == {}
        assert plan.attacker([0, 1], (0, 3)) is None
        assert plan.tamper(0) is None


def test_a_bad_attack_is_named_when_the_plan_is_read():
    with pytest.raises(ConfigError, match=r"SLATE_ATTACK: bad part '1@2:boom'"):
        FaultPlan.from_environment({"SLATE_ATTACK": "0@1:nan,1@2:boom"})


def sealed(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def test_each_tamper_acts_once_on_the_first_message_it_can_use():
    flip = Tamper({FLIP_ENV: 1})
    first, second, third = sealed(4, 5), sealed(6, 7), sealed(8, 9)
    assert flip.sending(first, 2) is first  # message 0: not yet
    assert flip.sending(second, 2).tolist() == [7, 7]  # message 1: byte 0 flipped
    assert flip.sending(third, 2) is third and flip.due == {}  # once only
    # A replay sends the previous message sealed for that peer, the first time one of the same
    # size exists.
    replay = Tamper({REPLAY_ENV: 0})
    assert replay.sending(sealed(1, 2), 3).tolist() == [1, 2]  # nothing earlier for peer 3
    assert replay.sending(sealed(3, 4, 5), 3).tolist() == [3, 4, 5]  # earlier one: other size
    assert replay.sending(sealed(6, 7, 8), 3).tolist() == [3, 4, 5]  # replayed
    assert replay.due == {}
    # A relay sends, as its own, the last message of the same size another member sealed for it.
    relay = Tamper({RELAY_ENV: 0})
    relay.received(sealed(9, 9), 0)  # from member 0
    assert relay.sending(sealed(1, 1), 0).tolist() == [1, 1]  # to 0: 0's own is no relay
    assert relay.sending(sealed(2, 2), 5).tolist() == [9, 9]  # to 5: member 0's message


#: Environment variables that are settings of a real run, read where they act: torchrun's and
#: the local launcher's ranks, gloo's interface, the launcher's store port handed to its workers,
#: the CSV reader switch.
SETTINGS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "GLOO_SOCKET_IFNAME", "STORE_PORT_ENV",
            "READER_VARIABLE", "SLATE_STORE_PORT", "SLATE_CSV_READER"}  # fmt: skip
#: The launcher hands its whole environment on: to its workers (which take it as theirs), and
#: to the choice of gloo's network interface.
WHOLE = ("engines/distributed/control/launch.py", "engines/distributed/control/workers.py")


READERS = {"os.environ", "os.getenv"}


def environment_reads(path: Path, root: Path = PACKAGE) -> list[str]:
    """Every ``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` in ``path``, as
    ``file:line: key`` (the key as written: a string or a name); ``os.environ`` passed whole
    counts as a read of ``*``."""
    found = []
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and ast.unparse(node) in READERS):
            continue
        parent = parents.get(node)
        key = "*"
        if isinstance(parent, ast.Subscript):
            key = ast.unparse(parent.slice)
        elif isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):
            call = parents[parent]
            key = ast.unparse(call.args[0]) if call.args else "*"  # os.environ.get / setdefault
        elif isinstance(parent, ast.Call) and parent.func is node:
            key = ast.unparse(parent.args[0]) if parent.args else "*"  # os.getenv
        elif isinstance(parent, ast.Compare):
            key = ast.unparse(parent.left)  # "KEY" in os.environ
        found.append((node.lineno, key.strip("'\"")))
    return [f"{path.relative_to(root)}:{line}: {key}" for line, key in sorted(found)]


def test_the_environment_reader_sees_every_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\n"
        "a = os.environ['A']\n"
        "b = os.environ.get('B', '')\n"
        "c = os.getenv('C')\n"
        "d = 'D' in os.environ\n"
        "os.environ.setdefault('E', 'x')\n"
        "f = {**os.environ}\n"
    )
    assert environment_reads(sample, tmp_path) == [
        "sample.py:2: A", "sample.py:3: B", "sample.py:4: C", "sample.py:5: D", "sample.py:6: E",
        "sample.py:7: *",
    ]  # fmt: skip


def test_only_the_faults_package_reads_a_test_hook_from_the_environment():
    """Outside ``slate/faults`` the environment is read only for a real run's settings, and no
    module names a ``SLATE_*`` variable other than those settings."""
    reads, names = [], []
    for path in PACKAGE.rglob("*.py"):
        if "faults" in path.relative_to(PACKAGE).parts[:1]:
            continue
        reads += [
            read
            for read in environment_reads(path)
            if read.rsplit(": ", 1)[1] not in SETTINGS
            and not (read.startswith(WHOLE) and read.endswith((": *", ": environment")))
        ]
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and text.startswith("SLATE_") and text not in SETTINGS:
                names.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {text}")
    assert reads == [] and names == []


def test_the_attacker_and_the_honest_sender_are_senders_of_the_guard():
    """Both have every member of :class:`slate.security.robust.Sender`, with its parameters
    (the guard calls either, never knowing which)."""
    members = [name for name in vars(Sender) if not name.startswith("_")]
    assert "sent" in members and "heard" in members and "listens" in members
    for cls in (Attacker, HonestSender):
        for name in members:
            ours, theirs = getattr(Sender, name), getattr(cls, name)
            if callable(ours):
                assert list(inspect.signature(theirs).parameters) == list(
                    inspect.signature(ours).parameters
                ), (cls, name)
            else:
                assert hasattr(cls, name), (cls, name)
