"""The parties agree on the run, not only on the data.

Every setting that changes the trajectory, or the sequence of collectives the parties take part
in, must be the same at every site: a different ``--lr`` silently mixes two models, and a
different ``--compress`` or ``--eval-every`` makes the messages or collectives of the parties
disagree (gloo then aborts or waits for the timeout). Before step 1 each party therefore sends
the others its :func:`run_fingerprint`; all of them run :func:`check_same_run` on the same list,
so either all go on or all stop with the same one-paragraph message, which names the site, the
flag and both values.

Which settings those are is declared on each field of :class:`~slate.config.TrainConfig`
(:func:`slate.config.agreed` or :func:`slate.config.per_site`; the algorithms' and compression
operators' parameter dataclasses classify theirs the same way), and
``tests/training/test_agreement.py`` fails for a field declared without either.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from slate.config import agreed_fields
from slate.errors import ConfigError
from slate.security.messages import ANY, MapOf

__all__ = [
    "FINGERPRINT_SHAPE",
    "RunMismatch",
    "check_same_run",
    "run_fingerprint",
]


DECLARATIONS = "declarations"  # the fingerprint's digests of every site's declarations

#: One party's fingerprint on the wire: [party, {setting: value}] (values are only compared).
FINGERPRINT_SHAPE = [int, MapOf(ANY, 256)]


class RunMismatch(ConfigError):
    """The sites were started with different training settings."""


def _slate_version() -> str:
    try:
        return version("slate")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "unknown"


def run_fingerprint(
    config: Any,
    roster: str | None = None,
    declarations: list[str] | None = None,
    dictionary: str | None = None,
) -> dict[str, Any]:
    """The settings of ``config`` (a run's flags, every value filled: ``RunPlan.flags``) that
    every site must share (its fields declared :func:`~slate.config.agreed`), the digest of the
    run's ``roster`` (None without one), the digests of every site's declarations as this site
    received them (:meth:`slate.data.declared.Declared.digests`; None without per-party files),
    the sha256 of the ``--schema`` file (``dictionary``; None without one: the file's path is
    the site's own, its content must be everyone's) and the slate and torch versions."""
    values = dataclasses.asdict(config)
    out = {name: values[name] for name in agreed_fields(type(config))}
    out["roster"] = roster
    out[DECLARATIONS] = declarations
    out["schema"] = None if dictionary is None else f"sha256 {dictionary}"
    out["slate version"] = _slate_version()
    out["torch version"] = str(torch.__version__)  # TorchVersion does not load weights_only
    return out


def _flag(name: str) -> str:
    return name if " " in name else "--" + name.replace("_", "-")


def check_same_run(fingerprints: list[tuple[int, dict[str, Any]]]) -> None:
    """Raise :class:`RunMismatch` unless every ``(rank, fingerprint)`` equals party 0's (the
    lowest rank's); the message names the first differing site, every flag it differs in and
    both values (and the job file, when the sites were started with ``--job``), or the site
    whose declarations differ between the sites that received them."""
    ordered = sorted(fingerprints, key=lambda item: item[0])
    ref_rank, reference = ordered[0]
    _check_declarations(ordered)
    for rank, fingerprint in ordered[1:]:
        differing = [name for name, value in reference.items() if fingerprint.get(name) != value]
        if not differing:
            continue
        if JOB in differing or reference.get(JOB) is not None:
            raise RunMismatch(_job_mismatch(rank, fingerprint, ref_rank, reference, differing))
        pairs = "; ".join(
            f"{_flag(name)} {fingerprint.get(name)!r} where party {ref_rank} has "
            f"{reference[name]!r}"
            for name in differing
        )
        raise RunMismatch(
            f"The sites were started with different training settings: party {rank} has "
            f"{pairs}. Every site must run the same algorithm with the same flags (and the "
            "same slate and torch versions); no step was taken. Restart the sites with one "
            "command line (only --rank, --train, --test and --out may differ), or give every "
            "site the same job file ('slate job init', 'slate train --job FILE')."
        )


#: The fingerprint's digest of the ``--job`` file (a :class:`~slate.config.TrainConfig` field).
JOB = "job_sha256"


def _job_mismatch(
    rank: int, theirs: dict[str, Any], ref_rank: int, ours: dict[str, Any], differing: list[str]
) -> str:
    """One paragraph for a site whose job file, or whose settings beside the job file, differ
    from party ``ref_rank``'s: the keys that differ, with both values."""
    keys = [name for name in differing if name != JOB]
    pairs = "; ".join(f"{name} {theirs.get(name)!r} against {ours[name]!r}" for name in keys)
    digests = f"sha256 {_digest(theirs.get(JOB))} against {_digest(ours.get(JOB))}"
    return (
        f"The sites were started with different job files: party {rank}'s job file differs "
        f"from party {ref_rank}'s ({digests})"
        + (f" in {', '.join(keys)}: {pairs}" if keys else "")
        + ". Every site must run with the same job file (and the same slate and torch "
        "versions); no step was taken. Give every site the same file and restart them."
    )


def _digest(value: Any) -> str:
    return "none (no --job)" if value is None else f"{str(value)[:12]}..."


def _check_declarations(ordered: list[tuple[int, dict[str, Any]]]) -> None:
    """Every site must have received the same declaration from each site: one that differs
    between receivers was sent differently to different sites, by its declarer."""
    received = [(rank, f.get(DECLARATIONS)) for rank, f in ordered]
    seen = [digests for _, digests in received if digests is not None]
    if len(seen) < len(received) or not seen:
        return  # (a site without declarations differs in its flags: reported below)
    for declarer in range(min(len(d) for d in seen)):
        versions = {digests[declarer] for digests in seen}
        if len(versions) > 1:
            raise RunMismatch(
                f"Party {declarer} sent different declarations (row counts, value ranges) to "
                "different sites: the sites compared what each received before step 1, and "
                f"they differ. Party {declarer} runs modified code or lies; nothing was "
                "trained. Remove it from the roster, or ask its site to run the same slate."
            )
