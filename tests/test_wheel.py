"""The built package works on its own: ``python -m build`` makes the sdist and, from it, the
wheel; the wheel goes into a fresh virtualenv (no checkout on the path, no PYTHONPATH, run
from an empty folder), which runs the demo and a smoke test of what the package must carry
(Lua scripts, dashboard templates and static files, SQL, ``py.typed``, the license).

About 30 s, most of it the build's two isolated environments (setuptools comes from pip's
cache); the venv gets no pip of its own (this interpreter's pip installs into it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from delayq.testing.binary import find_redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
# what the sdist is built from: the package and the files pyproject.toml names
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "delayq")

SMOKE = r"""
import importlib.metadata, importlib.resources, json, sys
import delayq
from delayq import lua

here = importlib.resources.files("delayq")
names = lambda folder: sorted(p.name for p in here.joinpath(folder).iterdir() if p.is_file())
meta = importlib.metadata.metadata("delayq")
for name in lua.PER_TYPE + lua.GROUPED + lua.STANDALONE:
    assert "KEYS" in lua.source(name), name
print(json.dumps({
    "file": delayq.__file__,
    "version": delayq.__version__,
    "typed": here.joinpath("py.typed").is_file(),
    "lua": names("lua"),
    "templates": names("dashboard/templates"),
    "static": names("dashboard/static"),
    "sql": names("postgres/sql"),
    "license": meta.get("License-Expression"),
    "sys_path_has_checkout": any(p.rstrip("/") == sys.argv[1] for p in sys.path),
}))
"""


def _files(folder: str) -> list[str]:
    return sorted(
        p.name for p in (ROOT / "delayq" / folder).iterdir() if p.is_file() and p.suffix != ".pyc"
    )


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_installs_and_runs_without_the_checkout(tmp_path: Path) -> None:
    if not os.environ.get("CI"):  # CI installs build (the dev extra): there it must run
        pytest.importorskip("build")
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: building writes *.egg-info beside the sources
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], tmp_path, env, 300)
    (wheel,) = dist.glob("delayq-*.whl")
    (sdist,) = dist.glob("delayq-*.tar.gz")

    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    assert {"LICENSE", "README.md", "pyproject.toml", "delayq/py.typed"} <= members
    assert {f"delayq/lua/{n}" for n in _files("lua")} <= members
    with zipfile.ZipFile(wheel) as whl:
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in whl.namelist())

    venv = tmp_path / "venv"
    # without pip of its own (ensurepip takes seconds): this pip installs into it
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, 120)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", str(wheel)]
    _run(pip, tmp_path, env, 300)

    work = tmp_path / "elsewhere"  # not the checkout: nothing to import from the cwd
    work.mkdir()
    found = json.loads(_run([python, "-c", SMOKE, str(ROOT)], work, env, 60))
    assert found["file"].startswith(str(venv)), found["file"]
    assert not found["sys_path_has_checkout"]
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and found["version"] == version.group(1)
    assert found["typed"] and found["license"] == "MIT"
    assert found["lua"] == _files("lua")
    assert found["templates"] == _files("dashboard/templates")
    assert found["static"] == _files("dashboard/static")
    assert found["sql"] == _files("postgres/sql")

    # the demo from the installed package, starting its own private redis-server
    env["DELAYQ_REDIS_SERVER"] = find_redis_server_binary()
    env.pop("REDIS_URL", None)
    out = _run(
        [python, "-m", "delayq", "demo", "--events", "6", "--spread", "1", "--seed", "7"],
        work,
        env,
        120,
    )
    assert "started a private redis-server" in out and "dead letter" in out.lower(), out
