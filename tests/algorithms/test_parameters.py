"""The algorithms' parameters: each algorithm's own dataclass, the registry that lists them, and
the flags of ``slate train`` built from them."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

import slate.algorithms as algorithms
from slate.algorithms import (
    CODA,
    SLATE,
    AlgorithmConfig,
    CodaParams,
    build_algorithm,
    configure,
    parameter_defaults,
    parameter_fields,
)
from slate.cli.train_flags import add_train_arguments
from slate.config import TrainConfig, agreed, must_agree


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser


def test_every_algorithm_parameter_is_a_flag_as_its_dataclass_declares_it():
    actions = {a.dest: a for a in _parser()._actions}
    flags = [p.dest for p in parameter_fields()]
    assert flags == ["margin", "gradient_tracking", "alpha", "initial_batch", "momentum",
                     "lr_dual", "coda_objective"]  # fmt: skip
    for parameter in parameter_fields():
        action = actions[parameter.dest]
        assert action.option_strings == [parameter.flag]
        assert action.help == parameter.field.metadata["help"]
        assert action.default == TrainConfig.__dataclass_fields__[parameter.dest].default
        if parameter.kind in (int, float):
            assert action.type is parameter.kind
        assert action.choices == parameter.field.metadata.get("choices")
    assert actions["coda_objective"].choices == ("square", "margin")
    assert actions["gradient_tracking"].const is True  # a switch


def test_a_parameter_of_a_new_algorithm_is_listed_defaulted_and_configured(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class ZetaParams:
        zeta: float = agreed(0.5, help="the new algorithm's zeta")

    class Zeta(SLATE):
        name = "zeta"
        Params = ZetaParams

    monkeypatch.setitem(algorithms.ALGORITHMS, "zeta", Zeta)
    (listed,) = [p for p in parameter_fields() if p.dest == "zeta"]
    assert listed.kind is float and listed.owner is ZetaParams and must_agree(listed.field)
    assert parameter_defaults()["zeta"] == 0.5
    config, params = configure("zeta", lr=0.2, zeta=0.7, lr_dual=3.0)  # CODA's flag: ignored
    assert (config.lr, params) == (0.2, ZetaParams(0.7))
    assert build_algorithm("zeta", config, params).params.zeta == 0.7


def test_a_flag_two_algorithms_declare_differently_is_refused(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class OtherParams:
        alpha: float = agreed(0.9, help="another meaning of --alpha")

    class Other(SLATE):
        name = "other"
        Params = OtherParams

    monkeypatch.setitem(algorithms.ALGORITHMS, "other", Other)
    with pytest.raises(TypeError, match="--alpha is declared differently"):
        parameter_fields()


def test_configure_takes_defaults_for_none_and_refuses_an_unknown_name():
    config, params = configure("coda", lr=0.1, margin=None, lr_dual=None, coda_objective="margin")
    assert config == AlgorithmConfig(lr=0.1) and params == CodaParams(objective="margin")
    with pytest.raises(TypeError, match="not a parameter of any algorithm: lr_duall"):
        configure("coda", lr_duall=0.1)


def test_an_algorithm_refuses_another_algorithm_s_parameters():
    with pytest.raises(TypeError, match="CODA takes CodaParams"):
        CODA(AlgorithmConfig(), algorithms.SlateMParams())
