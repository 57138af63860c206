"""MkDocs hooks for the documentation site (mkdocs.yml): pages that include files from
outside docs/, and links that leave docs/.

- A line ``<!-- include PATH -->`` in a page is replaced by the file at PATH (relative to
  the page), its links rewritten to work from the page: README.md is the home page and
  benchmarks/RESULTS.md, CHANGELOG.md and CONTRIBUTING.md are pages of the site, while
  keeping one copy of each in the repository.
- A link from a page to a repository file outside docs/ (``../benchmarks/RESULTS.md#x``,
  ``../examples/fastapi_app.py``) points at the page that includes it, or else at a copy of
  the file under ``repo/`` in the built site: the site stays whole offline, and
  ``mkdocs build --strict`` still fails on a link to a file that does not exist.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INCLUDE = re.compile(r"^<!-- include (\S+) -->$", re.M)
# [text](target) and ![alt](target); targets without spaces, as in our Markdown
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
# repository files that are pages of the site: file -> the page that includes it
INCLUDED = {
    "README.md": "index.md",
    "benchmarks/RESULTS.md": "performance/results.md",
    "CHANGELOG.md": "project/changelog.md",
    "CONTRIBUTING.md": "project/contributing.md",
}
COPIES = "repo"


def _split(target: str) -> tuple[str, str]:
    path, _, anchor = target.partition("#")
    return path, f"#{anchor}" if anchor else ""


def _external(target: str) -> bool:
    return (
        target.startswith(("#", "mailto:")) or re.match(r"[a-z][a-z0-9+.-]*:", target) is not None
    )


def _file_of(repo_path: str) -> str:
    """A folder stands for its README.md (examples/ -> examples/README.md), or for the
    listing of its files that :func:`on_files` makes (``index.md``)."""
    if (ROOT / repo_path).is_dir():
        readme = "README.md" if (ROOT / repo_path / "README.md").is_file() else "index.md"
        return posixpath.join(repo_path, readme)
    return repo_path


def _exists(repo_path: str) -> bool:
    """A repository file, or the listing of an existing folder."""
    path = ROOT / repo_path
    return path.is_file() or (path.name == "index.md" and path.parent.is_dir())


def _listing(repo_path: str) -> str:
    """A page listing the files of a repository folder (the target of a link to it)."""
    folder = posixpath.dirname(repo_path)
    names = sorted(p.name for p in (ROOT / folder).iterdir() if p.is_file())
    return f"# {folder}/\n\n" + "".join(f"- [{n}]({n})\n" for n in names)


def _repo_dir(src_uri: str) -> str:
    """The repository folder of a page's source (a copy under repo/ keeps its own)."""
    if src_uri.startswith(f"{COPIES}/"):
        return posixpath.dirname(src_uri[len(COPIES) + 1 :])
    return posixpath.join("docs", posixpath.dirname(src_uri))


def _site_path(repo_path: str) -> str | None:
    """Where a repository file is in the site (a path under docs/), or None if it is not."""
    repo_path = _file_of(repo_path)
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    if repo_path in INCLUDED:
        return INCLUDED[repo_path]
    return f"{COPIES}/{repo_path}" if _exists(repo_path) else None


def _rewrite(text: str, source_dir: str, page_dir: str) -> str:
    """Links of ``text`` (written in the repository folder ``source_dir``) made to work from
    the page in the docs folder ``page_dir``."""

    def one(match: re.Match[str]) -> str:
        target = match.group(2)
        if _external(target):
            return match.group(0)
        path, anchor = _split(target)
        repo_path = posixpath.normpath(posixpath.join(source_dir, path))
        site = _site_path(repo_path)
        if site is None:  # left as written: --strict reports it
            return match.group(0)
        new = posixpath.relpath(site, page_dir or ".")
        return f"{match.group(1)}{new}{anchor}{match.group(3)}"

    return LINK.sub(one, text)


def _outside_targets(text: str, source_dir: str) -> set[str]:
    found = set()
    for match in LINK.finditer(text):
        if _external(match.group(2)):
            continue
        repo_path = posixpath.join(source_dir, _split(match.group(2))[0])
        repo_path = _file_of(posixpath.normpath(repo_path))
        if not repo_path.startswith("docs/") and repo_path not in INCLUDED:
            if _exists(repo_path):
                found.add(repo_path)
    return found


def _text(repo_path: str) -> str:
    """A repository Markdown file, or the listing that stands for a folder."""
    if (ROOT / repo_path).is_file():
        return (ROOT / repo_path).read_text(encoding="utf-8")
    return _listing(repo_path)


def on_files(files: Files, config: Any) -> Files:
    """Add a copy of every repository file outside docs/ that a page links to (and of the
    files that a copied Markdown file links to, and so on)."""
    todo: list[tuple[str, str]] = []  # (text, its repository folder)
    for file in files.documentation_pages():
        text = Path(file.abs_src_path).read_text(encoding="utf-8")
        page_dir = posixpath.join("docs", posixpath.dirname(file.src_uri))
        todo.append((text, page_dir))
        for include in INCLUDE.findall(text):
            repo_path = posixpath.normpath(posixpath.join(page_dir, include))
            todo.append(
                ((ROOT / repo_path).read_text(encoding="utf-8"), posixpath.dirname(repo_path))
            )
    wanted: set[str] = set()
    while todo:
        text, folder = todo.pop()
        for repo_path in _outside_targets(text, folder) - wanted:
            wanted.add(repo_path)
            if repo_path.endswith(".md"):  # a page of its own, outside the nav
                text = _text(repo_path)
                todo.append((text, posixpath.dirname(repo_path)))
    for repo_path in sorted(wanted):
        uri = f"{COPIES}/{repo_path}"
        if (ROOT / repo_path).is_file():
            files.append(File.generated(config, uri, abs_src_path=str(ROOT / repo_path)))
        else:
            files.append(File.generated(config, uri, content=_listing(repo_path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Expand the includes and rewrite the links that leave docs/."""
    page_dir = posixpath.dirname(page.file.src_uri)
    repo_dir = _repo_dir(page.file.src_uri)

    def include(match: re.Match[str]) -> str:
        repo_path = posixpath.normpath(posixpath.join(repo_dir, match.group(1)))
        inner = (ROOT / repo_path).read_text(encoding="utf-8")
        return _rewrite(inner, posixpath.dirname(repo_path), page_dir)

    markdown = INCLUDE.sub(include, markdown)
    return _rewrite(markdown, repo_dir, page_dir)
