"""The run agreement (slate.training.agreement): every site's settings and the declarations it
received, compared before step 1."""

from __future__ import annotations

import dataclasses

import pytest

from slate.config import TrainConfig
from slate.training.agreement import RunMismatch, check_same_run, run_fingerprint
from slate.training.configuration import resolve_and_check


def fingerprints(declared_by_receiver: list[list[str]], **changed):
    config = resolve_and_check(TrainConfig(dataset="digits", nodes=3)).flags
    out = []
    for rank, digests in enumerate(declared_by_receiver):
        flags = dataclasses.replace(config, **changed) if rank == 2 else config
        out.append((rank, run_fingerprint(flags, None, digests)))
    return out


def test_the_same_settings_and_declarations_agree():
    same = ["a1", "b1", "c1"]
    check_same_run(fingerprints([same, same, same]))


def test_a_site_that_declared_differently_to_different_sites_is_named():
    """Party 1 sent one declaration to party 0 and another to parties 1 and 2: whichever order
    the fingerprints come in, party 1 is the one named."""
    seen = [["a1", "b1", "c1"], ["a1", "b2", "c1"], ["a1", "b2", "c1"]]
    with pytest.raises(RunMismatch, match="Party 1 sent different declarations") as caught:
        check_same_run(list(reversed(fingerprints(seen))))
    assert "no" in str(caught.value) and "trained" in str(caught.value)


def test_a_changed_flag_is_named_with_both_values():
    same = ["a", "b", "c"]
    with pytest.raises(RunMismatch, match=r"party 2 has --lr 0\.5 where party 0 has"):
        check_same_run(fingerprints([same, same, same], lr=0.5))


def _parameter_classes() -> list[type]:
    """Every dataclass whose fields are settings of a run: the flags, the hyperparameters the
    algorithms share, each algorithm's own and each compression operator's."""
    from slate.algorithms import ALGORITHMS, AlgorithmConfig
    from slate.communication.compression import COMPRESSORS

    return [
        TrainConfig,
        AlgorithmConfig,
        *(cls.Params for cls in ALGORITHMS.values()),
        *(cls.Params for cls in COMPRESSORS.values()),
    ]


@pytest.mark.parametrize("cls", _parameter_classes(), ids=lambda cls: cls.__name__)
def test_every_setting_says_whether_the_sites_must_agree_on_it(cls):
    from slate.config import must_agree

    for field in dataclasses.fields(cls):
        assert isinstance(must_agree(field), bool), field.name


def test_a_field_declared_without_a_classification_is_refused():
    from slate.config import agreed, agreed_fields, per_site

    @dataclasses.dataclass
    class Settings:
        shared: int = agreed(1)
        own: str = per_site("x")
        forgotten: float = 0.5

    with pytest.raises(TypeError, match="'forgotten' is not classified"):
        agreed_fields(Settings)


def test_each_algorithm_flag_is_a_train_config_field_classified_alike():
    """An algorithm's parameter is stored as a flag: the TrainConfig field of its name exists,
    holds None until resolved (or the same default), and is classified as the parameter is."""
    from slate.algorithms import parameter_fields
    from slate.config import must_agree

    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for parameter in parameter_fields():
        slot = fields[parameter.dest]
        assert slot.default in (None, parameter.field.default), parameter.dest
        assert must_agree(slot) == must_agree(parameter.field), parameter.dest


def test_the_fingerprint_holds_the_agreed_settings_and_no_site_s_own():
    flags = resolve_and_check(TrainConfig(dataset="digits", nodes=3, wan="80,10")).flags
    fingerprint = run_fingerprint(flags)
    for name in ("lr", "lr_dual", "coda_objective", "momentum", "compress", "eval_every",
                 "robust", "on_party_loss", "standardize"):  # fmt: skip
        assert fingerprint[name] == getattr(flags, name)
    for name in ("dataset", "train", "test", "out", "device", "threads", "wan", "drop_party"):
        assert name not in fingerprint
