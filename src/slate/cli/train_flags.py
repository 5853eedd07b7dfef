"""The flags of ``slate train`` and ``slate tune``, generated from their declarations.

Each flag is declared once, in :mod:`slate.cli.train_settings` (the algorithms' parameters in
their dataclasses, :func:`slate.algorithms.parameter_fields`); this module turns the
declarations into argparse groups and arguments, in ``--help``'s order.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from slate.cli.train_settings import TrainSetting, comma_items, lr_value, train_settings

__all__ = ["add_settings", "add_train_arguments", "comma_items", "lr_value"]


def add_settings(p: argparse.ArgumentParser, settings: Iterable[TrainSetting]) -> None:
    """One argument per setting that has a flag, in the setting's argparse group (created in
    the order groups first appear)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in settings:
        if not setting.option_strings or setting.group is None:
            continue
        if setting.group not in groups:
            groups[setting.group] = p.add_argument_group(setting.group)
        groups[setting.group].add_argument(*setting.option_strings, **setting.argparse_options())


def add_train_arguments(p: argparse.ArgumentParser, job: bool = True) -> None:
    """The flags of ``slate train`` (and, without ``--job``, ``slate tune``): data, tables,
    algorithm, communication, privacy and run groups."""
    add_settings(p, (s for s in train_settings() if job or s.dest != "job"))
