"""Decentralised algorithms, one per module, and the registry used by the CLI and configs.

Each algorithm owns its parameter dataclass (``Algorithm.Params``); with the parameters they
share (:class:`AlgorithmConfig`) these are the algorithms' flags of ``slate train`` and
``slate tune``: :func:`parameter_fields` lists them (name, type, default, help, whether the
sites must agree, all from the dataclasses), :func:`parameter_defaults` gives their generic
defaults, and :func:`configure` turns flag values into an algorithm's two dataclasses.

An algorithm outside this package joins the registry with :func:`register_algorithm` (and
leaves it with :func:`unregister_algorithm`): for this process only (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from slate.algorithms.base import Algorithm, AlgorithmConfig, NoParams
from slate.algorithms.coda import CODA, CodaParams
from slate.algorithms.dpsgd import DPSGD, DPSGDParams
from slate.algorithms.slate import SLATE, SlateParams
from slate.algorithms.slate_m import SLATEM, SlateMParams
from slate.config import TrainConfig, must_agree
from slate.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "CODA",
    "DPSGD",
    "SLATE",
    "SLATEM",
    "Algorithm",
    "AlgorithmConfig",
    "CodaParams",
    "DPSGDParams",
    "NoParams",
    "ParameterField",
    "SlateMParams",
    "SlateParams",
    "build_algorithm",
    "configure",
    "parameter_defaults",
    "parameter_fields",
    "register_algorithm",
    "unregister_algorithm",
]

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (SLATE, SLATEM, DPSGD, CODA)}
_BUILT_IN = frozenset(ALGORITHMS)


def build_algorithm(name: str, config: AlgorithmConfig, params: Any = None) -> Algorithm:
    """Instantiate the algorithm registered under ``name`` with the shared ``config`` and its
    own ``params`` (None: its parameter dataclass's defaults)."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"Unknown --algorithm {name!r}; expected one of {', '.join(sorted(ALGORITHMS))}."
        )
    return ALGORITHMS[name](config, params)


@dataclass(frozen=True)
class ParameterField:
    """One algorithm parameter that is a flag: ``dest`` is the flag's name with underscores
    (``--coda-objective`` -> ``coda_objective``, the :class:`~slate.config.TrainConfig` field),
    ``kind`` its type without ``None`` (``bool``, ``int``, ``float`` or ``str``), ``field`` the
    dataclass field (default, ``help``, ``choices``, classification), ``owner`` its dataclass."""

    dest: str
    kind: type
    field: dataclasses.Field
    owner: type

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


def _kind(annotation: Any) -> type:
    """``int | None`` -> ``int``; a plain type as it is."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (kind,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return kind
    return annotation


def _fields_of(cls: type) -> Iterator[ParameterField]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        yield ParameterField(flag[2:].replace("-", "_"), _kind(hints[f.name]), f, cls)


def parameter_fields() -> list[ParameterField]:
    """The algorithms' flags, in order: :class:`AlgorithmConfig`'s that are flags (a ``help``
    in their metadata; ``--lr`` is the run's, which also chooses ``auto``), then each registered
    algorithm's own, in the registry's order. A flag two algorithms declare must be declared
    the same way (one flag, one meaning)."""
    found: dict[str, ParameterField] = {}
    sources = [AlgorithmConfig, *(cls.Params for cls in ALGORITHMS.values())]
    for source in sources:
        for parameter in _fields_of(source):
            if "help" not in parameter.field.metadata:
                continue
            known = found.get(parameter.dest)
            if known is not None and (known.field.metadata, known.kind, known.field.default) != (
                parameter.field.metadata, parameter.kind, parameter.field.default
            ):  # fmt: skip
                raise TypeError(
                    f"{parameter.flag} is declared differently by {known.owner.__name__} and "
                    f"{source.__name__}"
                )
            found.setdefault(parameter.dest, parameter)
    return list(found.values())


def parameter_defaults() -> dict[str, Any]:
    """Each algorithm flag's generic default (its dataclass's): what a flag left unset takes
    where the dataset gives none (:func:`slate.config.resolve_config`)."""
    return {p.dest: p.field.default for p in parameter_fields()}


def configure(name: str, **values: Any) -> tuple[AlgorithmConfig, Any]:
    """The shared config and algorithm ``name``'s own parameters from flag values by name
    (``lr``, ``margin``, ..., ``lr_dual``, ``coda_objective``): ``None`` takes the default, and
    another algorithm's flags are ignored (a run's flags hold every algorithm's). A name that
    is no algorithm's flag is a ``TypeError``."""
    if name not in ALGORITHMS:
        build_algorithm(name, AlgorithmConfig())  # the unknown name's error
    shared = {p.dest: p for p in _fields_of(AlgorithmConfig)}
    own = {p.dest: p for p in _fields_of(ALGORITHMS[name].Params)}
    known = {p.dest for cls in ALGORITHMS.values() for p in _fields_of(cls.Params)}
    unknown = set(values) - set(shared) - known
    if unknown:
        raise TypeError(f"not a parameter of any algorithm: {', '.join(sorted(unknown))}")

    def given(table: dict[str, ParameterField]) -> dict[str, Any]:
        return {
            p.field.name: values[dest] for dest, p in table.items() if values.get(dest) is not None
        }

    return AlgorithmConfig(**given(shared)), ALGORITHMS[name].Params(**given(own))


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Add ``cls`` to :data:`ALGORITHMS` under ``cls.name`` (``--algorithm NAME``), for this
    process; returns ``cls``, so that it may decorate the class.

    Checked first, each a ``TypeError`` or ``ValueError`` naming the class: ``cls`` is an
    :class:`Algorithm` with a ``name`` no algorithm has yet; its ``Params`` is a dataclass whose
    every field is classified (:func:`slate.config.agreed` or :func:`slate.config.per_site`);
    every field that is a flag (a ``help`` in its metadata) has its slot in
    :class:`slate.config.TrainConfig` (where a run's flags live); and a flag another algorithm
    declares too is declared the same way (:func:`parameter_fields`).
    """
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"register_algorithm takes a subclass of Algorithm, got {cls!r}")
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name: set the class attribute name = '...'")
    if cls.name in ALGORITHMS:
        raise ValueError(
            f"an algorithm named {cls.name!r} is registered already "
            f"({ALGORITHMS[cls.name].__name__}); choose another name"
        )
    if not dataclasses.is_dataclass(cls.Params):
        raise TypeError(f"{cls.__name__}.Params must be a dataclass, got {cls.Params!r}")
    for f in dataclasses.fields(cls.Params):
        must_agree(f)
    slots = {f.name for f in dataclasses.fields(TrainConfig)}
    missing = [p for p in _fields_of(cls.Params) if "help" in p.field.metadata]
    missing = [p for p in missing if p.dest not in slots]
    if missing:
        raise TypeError(
            f"{cls.__name__}.Params declares the flag(s) {', '.join(p.flag for p in missing)}, "
            "but TrainConfig has no slot for them: add "
            + ", ".join(f"{p.dest}: {p.kind.__name__} | None = agreed(None)" for p in missing)
            + " to slate.config.TrainConfig, or leave help= out of the field (a parameter set "
            "from Python only)"
        )
    ALGORITHMS[cls.name] = cls
    try:
        parameter_fields()
    except TypeError:
        del ALGORITHMS[cls.name]
        raise
    return cls


def unregister_algorithm(name: str) -> None:
    """Remove the algorithm :func:`register_algorithm` added under ``name``; the built-in ones
    stay (a ``ValueError``), as does an unknown name (a ``KeyError``)."""
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is built in and cannot be unregistered")
    if name not in ALGORITHMS:
        raise KeyError(f"no algorithm named {name!r} is registered")
    del ALGORITHMS[name]
