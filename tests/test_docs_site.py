"""The documentation site builds: ``mkdocs build --strict`` (mkdocs.yml) into a temporary
folder, with no broken link or anchor and no missing reference, every public name in the
API reference, and pages that load nothing from the network.

About 20 s on a quiet machine (most of it mkdocstrings reading the package).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# (package, its reference page): every name of the package's __all__ is on the page
REFERENCE = {
    "delayq": "reference/index.html",
    "delayq.testing": "reference/testing.html",
    "delayq.postgres": "reference/integrations.html",
    "delayq.prometheus": "reference/integrations.html",
    "delayq.otel": "reference/integrations.html",
    "delayq.dashboard": "reference/integrations.html",
    "delayq.spark": "reference/integrations.html",
}
# public names whose documentation lives in files that other changes are editing now
# (an alias and three schema constants without a docstring of their own)
UNDOCUMENTED = {
    "delayq.testing.redis_url_context",
    "delayq.spark.QUEUE_SCHEMA",
    "delayq.spark.REJECTS_SCHEMA",
    "delayq.spark.STATES",
}
# what a page may load: files of the site itself (no scheme, no //host)
RESOURCE = re.compile(
    r"<(?:script|img|iframe|source|audio|video)\b[^>]*\bsrc=\"([^\"]+)\""
    r"|<link\b[^>]*\bhref=\"([^\"]+)\""
    r"|@import\s+(?:url\()?[\"']?([^\"')\s;]+)"
    r"|url\(\s*[\"']?((?:https?:)?//[^\"')\s]+)",
    re.I,
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.environ.get("CI"):  # CI installs the docs extra (dev): there it must run
        pytest.importorskip("mkdocs")
        pytest.importorskip("material")
        pytest.importorskip("mkdocstrings_handlers.python")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_every_page_of_the_menu_is_built(site: Path) -> None:
    nav = re.findall(r":\s*(\S+)\.md\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    assert len(nav) >= 30
    for page in nav:
        assert (site / f"{page}.html").is_file(), page
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "How it compares" in index and "Getting started" in index


def test_the_pages_load_nothing_from_the_network(site: Path) -> None:
    """No web fonts, CDN scripts or styles: every script, style, image and font a page or
    stylesheet loads is a file of the site (links to other sites are fine)."""
    outside = []
    for path in [*site.rglob("*.html"), *site.rglob("*.css")]:
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in RESOURCE.finditer(text):
            url = next(g for g in match.groups() if g)
            if re.match(r"([a-z][a-z0-9+.-]*:|//)", url, re.I) and not url.startswith("data:"):
                outside.append((path.relative_to(site).as_posix(), url))
    assert not outside, outside[:20]


def test_every_public_name_is_in_the_reference(site: Path) -> None:
    import importlib

    griffe = pytest.importorskip("griffe")
    root = griffe.load("delayq", search_paths=[str(ROOT)])  # once: the packages are its members
    for package, page in REFERENCE.items():
        html = (site / page).read_text(encoding="utf-8")
        loaded = root if package == "delayq" else root[package.removeprefix("delayq.")]
        names = (
            importlib.import_module(package).__all__
            if package != "delayq.spark"
            else [str(n) for n in loaded.exports or ()]
        )  # delayq.spark imports pyspark
        assert names, package
        for name in names:
            if name == "__version__" or f"{package}.{name}" in UNDOCUMENTED:
                continue
            assert loaded[name].docstring, f"{package}.{name} has no docstring"
            assert f'id="{package}.{name}"' in html, f"{package}.{name} is not on {page}"
