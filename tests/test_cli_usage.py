"""Bad command lines give one ``error: ...`` line and exit code 2, never a traceback, with the
newest Typer the ``cli`` extra allows (the venv's) and with the oldest (installed by
scripts/test.sh into ``.cache/typer-oldest``, or ``$DELAYQ_TYPER_OLDEST``).

Typer 0.2x+ bundles its own click (``typer._click``) whose exceptions are not ``click``'s,
which is how every typo once became a 40-line traceback: these run the real command in a
subprocess, so the Typer (and click) in use is the one on its path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _oldest_typer() -> str:
    found = re.search(r'"typer>=([0-9.]+)', (ROOT / "pyproject.toml").read_text())
    assert found, "pyproject.toml's cli extra must bound typer from below"
    return found.group(1)


OLDEST = _oldest_typer()
OLDEST_DIR = Path(os.environ.get("DELAYQ_TYPER_OLDEST") or ROOT / ".cache" / "typer-oldest")

BAD_LINES = [
    pytest.param(["inspect", "ping"], "Missing argument 'ID'", id="missing-argument"),
    pytest.param(["stats", "--bogus"], "--bogus", id="unknown-option"),
    pytest.param(["bogus"], "No such command 'bogus'", id="unknown-command"),
    pytest.param(["worker", "x:y", "--processes", "0"], "--processes", id="processes-0"),
    pytest.param(["enqueue", "cli_app:CliJob"], "Missing option '--id'", id="enqueue-without-id"),
    pytest.param(["dead"], "missing command", id="bare-dead"),
    pytest.param(["dead", "purge"], "Missing argument 'TYPE'", id="dead-purge-no-type"),
    pytest.param(["stats", "--interval"], "--interval", id="option-without-value"),
    pytest.param(["scheduled", "t", "--limit", "x"], "--limit", id="not-a-number"),
    pytest.param(["worker", "x:y", "--log-level", "loud"], "--log-level", id="bad-choice"),
    pytest.param(
        ["worker", "x:y", "--reload", "--reload-dir", "/nonexistent"],
        "does not exist",
        id="reload-dir-missing",
    ),
    pytest.param(["dashboard", "--port", "99999"], "--port", id="port-out-of-range"),
    pytest.param(["batches", "show"], "Missing argument 'BATCH_ID'", id="batches-show-no-id"),
    pytest.param(["batches", "list", "--state", "shut"], "--state must be", id="batches-state"),
]


def _variants() -> list[object]:
    reason = (
        f"the oldest allowed Typer ({OLDEST}) is not installed in {OLDEST_DIR}: scripts/test.sh "
        f"installs it (pip install --target {OLDEST_DIR} typer=={OLDEST})"
    )
    installed = (OLDEST_DIR / f"typer-{OLDEST}.dist-info").is_dir()
    return [
        pytest.param(None, id="typer-newest"),
        pytest.param(
            OLDEST_DIR, id="typer-oldest", marks=pytest.mark.skipif(not installed, reason=reason)
        ),
    ]


def run_cli(
    typer_dir: Path | None, *args: str, driver: str = ""
) -> subprocess.CompletedProcess[str]:
    path = [str(typer_dir)] if typer_dir else []
    path += [str(ROOT), str(ROOT / "tests")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "COLUMNS": "100",
        "REDIS_URL": "redis://127.0.0.1:1/0",  # never reached: usage errors come first
    }
    code = driver or "import sys; from delayq.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT / "tests",
    )


@pytest.mark.parametrize("typer_dir", _variants())
def test_the_typer_in_use(typer_dir: Path | None) -> None:
    path = [str(typer_dir)] if typer_dir else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    got = subprocess.run(
        [sys.executable, "-c", "import typer; print(typer.__version__)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    version = got.stdout.strip()
    if typer_dir is not None:
        assert version == OLDEST
    else:
        major, minor = (int(x) for x in version.split(".")[:2])
        assert (major, minor) < (0, 30), f"typer {version} is beyond the range pyproject allows"


# one process per Typer runs every command line (importing the CLI is the slow part)
_DRIVER = """
import contextlib, io, json, sys, traceback
from delayq.cli.app import main
results = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except BaseException:
            traceback.print_exc()
            code = -1
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
print(json.dumps(results))
"""


@pytest.mark.parametrize("typer_dir", _variants())
def test_bad_command_lines_are_one_line_errors(typer_dir: Path | None) -> None:
    cases = [(p.values[0], p.values[1], p.id) for p in BAD_LINES]
    got = run_cli(typer_dir, json.dumps([args for args, _, _ in cases]), driver=_DRIVER)
    assert got.returncode == 0, got.stderr
    results = json.loads(got.stdout)
    for (args, expected, name), result in zip(cases, results, strict=True):
        where = f"{name}: {args} -> {result}"
        assert result["code"] == 2, where
        assert "Traceback" not in result["stderr"] + result["stdout"], where
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1, where
        assert lines[0].startswith("error: "), where
        assert expected in lines[0], where
        if "must be" not in lines[0]:  # click's usage errors say where to look next
            assert "--help" in lines[0], where
        assert result["stdout"] == "", where


@pytest.mark.parametrize("typer_dir", _variants())
def test_help_still_works(typer_dir: Path | None) -> None:
    for args in ([], ["--help"], ["dead", "--help"], ["stats", "-h"]):
        got = run_cli(typer_dir, *args)
        assert got.returncode == 0, (args, got.stderr)
        assert "Usage" in got.stdout, args
        assert got.stderr == ""


# every command's help, with the source text of its help strings (typer.main builds the
# click command tree the way `delayq` runs it)
_HELP_DRIVER = """
import contextlib, io, json, sys
import typer.main
from delayq.cli.app import app, main

def walk(command, path):
    yield path, command
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, [*path, name])

results = []
for path, command in walk(typer.main.get_command(app), []):
    if path == ["demo"]:  # its own argparse help
        continue
    texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*path, "--help"])
    results.append({"path": path, "code": code, "texts": texts, "help": out.getvalue()})
print(json.dumps(results))
"""


@pytest.mark.parametrize("typer_dir", _variants())
def test_help_shows_bracketed_words(typer_dir: Path | None) -> None:
    """``[prometheus]`` or ``[group]`` in a help text is Rich markup to Typer unless
    escaped (``\\[``): it vanished from ``--help`` ("needs delayq):"). Every bracketed
    word of every command's help shows."""
    got = run_cli(typer_dir, driver=_HELP_DRIVER)
    assert got.returncode == 0, got.stderr
    results = json.loads(got.stdout)
    assert len(results) > 30  # every command and group
    for result in results:
        shown = " ".join(result["help"].replace("│", " ").split())
        for source in result["texts"]:
            for word in re.findall(r"\\?\[[a-z][\w-]*\]", source):
                word = word.lstrip("\\")
                assert word in shown, (result["path"], word, result["help"])
