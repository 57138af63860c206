"""Each peer's own virtualenv under ``benchmarks/.venvs/<name>``, built from its pinned requirements.

A venv is rebuilt only when its requirements file or the base interpreter
changed (a marker file records both), so repeated runs start at once.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "benchmarks" / ".venvs"
REQUIREMENTS = ROOT / "benchmarks" / "peers" / "requirements"
PLOT_ENV = "_plot"

__all__ = ["PLOT_ENV", "VENVS", "base_python", "ensure", "freeze"]


def base_python() -> str:
    """The interpreter our own venv was made from: peers get the same Python."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _fingerprint(requirements: Path) -> str:
    digest = hashlib.sha256(requirements.read_bytes())
    digest.update(base_python().encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()


def ensure(name: str, *, log=print) -> Path:
    """The Python executable of ``name``'s venv, created or rebuilt if needed."""
    requirements = REQUIREMENTS / f"{name}.txt"
    if not requirements.is_file():
        raise FileNotFoundError(f"no pinned requirements for {name!r}: {requirements}")
    venv = VENVS / name
    python = venv / "bin" / "python"
    marker = venv / ".bench-fingerprint"
    want = _fingerprint(requirements)
    if python.exists() and marker.exists() and marker.read_text() == want:
        return python
    log(f"building the {name} virtualenv from {requirements.relative_to(ROOT)} ...")
    if venv.exists():
        shutil.rmtree(venv)
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([base_python(), "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-r", str(requirements)],
        capture_output=True, text=True,
    )  # fmt: skip
    if pip.returncode != 0:
        raise RuntimeError(
            f"pip install for {name} failed:\n{pip.stdout[-3000:]}{pip.stderr[-3000:]}"
        )
    marker.write_text(want)
    return python


def freeze(python: Path | str) -> list[str]:
    """``pip freeze`` of an environment (every installed version, for the record)."""
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line for line in out.stdout.splitlines() if line and not line.startswith("-e ")]
