"""The ``slate train`` parser is generated from one declaration per setting
(:mod:`slate.cli.train_settings`): every argparse action holds its declaration's type, default,
choices, metavar and group, and every :class:`TrainConfig` field is declared exactly once."""

from __future__ import annotations

import argparse
import collections
import dataclasses

import pytest

from slate.cli.parser import build_parser
from slate.cli.train_settings import SETTINGS, train_settings
from slate.config import TrainConfig, must_agree


def _train_parser() -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices["train"]


def _actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in _train_parser()._actions if a.option_strings and a.dest != "help"}


def test_every_train_config_field_has_exactly_one_declaration():
    declared = collections.Counter(s.dest for s in train_settings())
    fields = [f.name for f in dataclasses.fields(TrainConfig)]
    assert {name: declared[name] for name in fields} == dict.fromkeys(fields, 1)
    assert max(declared.values()) == 1, [d for d, n in declared.items() if n > 1]


def test_each_generated_action_is_its_declaration():
    actions = _actions()
    groups = {a.dest: g.title for g in _train_parser()._action_groups for a in g._group_actions}
    flagged = [s for s in train_settings() if s.option_strings]
    assert sorted(actions) == sorted(s.dest for s in flagged)
    for setting in flagged:
        action = actions[setting.dest]
        assert tuple(action.option_strings[: len(setting.option_strings)]) == (
            setting.option_strings
        ), setting.dest
        assert action.default == setting.default, setting.dest
        assert action.type is setting.type, setting.dest
        assert action.choices == setting.choices, setting.dest
        assert action.metavar == setting.metavar, setting.dest
        assert action.nargs == setting.nargs or setting.nargs is None, setting.dest
        assert action.help == setting.help, setting.dest
        assert groups[setting.dest] == setting.group, setting.dest


def test_a_field_s_default_and_classification_are_its_own():
    fields = TrainConfig.__dataclass_fields__
    for setting in train_settings():
        if not setting.is_field:
            assert setting.agreed is False, setting.dest  # every other flag is a site's own
            continue
        assert setting.agreed == must_agree(fields[setting.dest]), setting.dest
        default = fields[setting.dest].default
        if setting.action != "append":
            assert setting.default == default, setting.dest


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--features", "12"], {"n_features": 12}),
        (["--id-column", "a,b", "--id-column", "c"], {"id_columns": ["a,b", "c"]}),
        (["--no-standardize", "--party-ap"], {"standardize": False, "party_ap": True}),
        (["--feature-range", "-1", "1"], {"feature_range": [-1.0, 1.0]}),
        (["--lr", "auto", "--gradient-tracking"], {"lr": "auto", "gradient_tracking": True}),
        (["--drop-party", "1@5"], {"drop_party": ["1@5"]}),
        ([], {"standardize": None, "timeout": 60.0, "engine": "simulator", "job": None}),
    ],
)
def test_flags_parse_as_before(argv, expected):
    parsed = vars(build_parser().parse_args(["train", *argv]))
    assert {key: parsed[key] for key in expected} == expected


def test_the_table_declares_no_flag_twice():
    flags = [f for s in train_settings() for f in s.option_strings]
    assert len(flags) == len(set(flags))
    assert all(s.group is not None or not s.option_strings for s in SETTINGS)
