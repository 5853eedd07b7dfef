"""The installed wheel, away from the checkout: ``slate reproduce`` starts and finds its presets.

The test builds a wheel of the project with the setuptools of this environment (no build
isolation, no index), installs it with ``pip install --target`` into a folder of its own, and runs
Python there with ``-S`` (no site-packages, so the editable install's path to ``src/`` is never
added) and ``-P``, from a folder outside the checkout, with only that folder and the third-party
packages on ``PYTHONPATH``. That one Python (a fresh interpreter costs about 3 s, most of it
torch's import) both probes the package and runs ``slate reproduce EXPERIMENT --help`` for each
experiment tested, as ``python -m slate`` runs it (``runpy``, the module run as ``__main__``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPERIMENTS = ["table2", "claims"]
PROBE = """\
import contextlib, io, json, runpy, sys
import slate, slate.cli
from slate.studies.reproduce import default_config_dir, load_preset
folder = default_config_dir()
path = list(sys.path)
helps = {}
for experiment in json.loads(sys.argv[1]):  # python -m slate reproduce EXPERIMENT --help
    sys.argv = [sys.argv[0], "reproduce", experiment, "--help"]
    out, code = io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module("slate", run_name="__main__", alter_sys=True)
        except SystemExit as end:
            code = end.code
    helps[experiment] = {"code": code, "stdout": out.getvalue()}
print(json.dumps({
    "slate": slate.__file__,
    "folder": str(folder),
    "presets": sorted(p.name for p in folder.glob("*.toml")),
    "w7a": load_preset("w7a", folder),
    "path": path,
    "helps": helps,
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The wheel installed into ``TMP/site``, and the environment that imports only it."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy of the files the build reads, so that the build leaves no build/ or
    # egg-info in the checkout.
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src" / "slate",
        source / "src" / "slate",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    pip_env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [sys.executable, "-m", "pip", "--no-input", "-q"]
    dist, site = tmp / "dist", tmp / "site"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        check=True, env=pip_env, timeout=120,
    )  # fmt: skip
    (wheel,) = dist.glob("slate-*.whl")
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
        check=True, env=pip_env, timeout=120,
    )  # fmt: skip
    third_party = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *third_party])
    return site, env


@pytest.fixture(scope="module")
def probe(installed, tmp_path_factory) -> dict:
    """What :data:`PROBE` printed, run by ``python -S -P`` from a folder outside the checkout."""
    _, env = installed
    done = subprocess.run(
        [sys.executable, "-S", "-P", "-c", PROBE, json.dumps(EXPERIMENTS)],
        env=env, cwd=tmp_path_factory.mktemp("away"), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.processes
def test_the_installed_package_holds_the_presets_of_the_checkout(installed, probe):
    site, _ = installed
    assert Path(probe["slate"]).resolve().is_relative_to(site.resolve())
    assert Path(probe["folder"]).resolve().is_relative_to(site.resolve())
    assert not any(Path(p).resolve().is_relative_to(ROOT) for p in probe["path"] if p)
    checkout = ROOT / "configs"
    assert probe["presets"] == sorted(p.name for p in checkout.glob("*.toml"))
    with open(checkout / "w7a.toml", "rb") as handle:
        expected = tomllib.load(handle)
    assert probe["w7a"] == expected
    assert probe["w7a"]["dataset"] == "w7a"


@pytest.mark.processes
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_reproduce_help_runs_from_the_wheel(probe, experiment):
    done = probe["helps"][experiment]
    assert done["code"] in (0, None), done  # sys.exit(0) (None: the module ended on its own)
    assert f"usage: slate reproduce {experiment}" in done["stdout"]
    assert "--configs" in done["stdout"]
