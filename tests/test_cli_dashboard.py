"""``python -m delayq.dashboard`` and ``delayq dashboard`` without the extra: one line, exit 2;
``python -m delayq.dashboard`` takes its defaults from REDIS_URL and DELAYQ_PREFIX."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# runs a module as `python -m` does, with jinja2 made unimportable (as without the extra)
_WITHOUT_JINJA = """
import runpy, sys
sys.modules["jinja2"] = None
sys.argv = [sys.argv[1], *sys.argv[2:]]
if sys.argv[0] == "delayq.dashboard":
    runpy.run_module("delayq.dashboard", run_name="__main__", alter_sys=True)
else:
    from delayq.cli import main
    main()
"""


@pytest.mark.parametrize(
    "args",
    [["delayq.dashboard"], ["delayq.cli", "dashboard"]],
    ids=["python-m", "delayq-dashboard"],
)
def test_without_the_extra(args: list[str]) -> None:
    got = subprocess.run(
        [sys.executable, "-c", _WITHOUT_JINJA, *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert got.returncode == 2, got.stderr
    assert "Traceback" not in got.stderr
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1, got.stderr
    assert lines[0].startswith("error: the dashboard needs the dashboard extra")
    assert "missing: jinja2" in lines[0]


def test_python_m_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    import delayq.dashboard.app
    from delayq.dashboard.__main__ import main

    made: dict[str, Any] = {}

    def fake_create_app(redis: object, prefix: object = None, **options: object) -> str:
        made.update(redis=redis, prefix=prefix, **options)
        return "app"

    monkeypatch.setattr(delayq.dashboard.app, "create_app", fake_create_app)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: made.update(served=app, **kw))
    monkeypatch.setenv("REDIS_URL", "redis://example:6390/3")
    monkeypatch.setenv("DELAYQ_PREFIX", "shop")
    assert main(["--port", "8123", "--page-size", "50"]) == 0
    assert made["redis"] == "redis://example:6390/3" and made["prefix"] == "shop"
    assert made["page_size"] == 50 and made["served"] == "app" and made["port"] == 8123
    assert main(["--prefix", "other"]) == 0 and made["prefix"] == "other"


def test_python_m_bad_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from delayq.dashboard.__main__ import main

    monkeypatch.setenv("DELAYQ_PREFIX", "bad{prefix}")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad dashboard settings") and len(err.strip().splitlines()) == 1
