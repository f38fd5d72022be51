"""The documentation stays true to the code: the README's links lead to files, the HTTP API page
lists exactly the routes of the live OpenAPI document, the Layout page lists exactly the package
folders, and the mkdocs nav lists every page (`make docs` builds the site with --strict)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGES = ("config", "net", "wal", "health", "sync", "node", "shoal")
# [text](target) of Markdown, not images; the target up to a space or the closing parenthesis
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _gen_api() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative_links(text: str) -> list[str]:
    """Link targets of `text` that point into the repository (no scheme, no bare anchor)."""
    targets = [match.group(1) for match in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_every_relative_link_of_the_readme_points_to_a_file() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = relative_links(readme)
    assert len(links) >= 20, links
    for target in links:
        path = target.split("#", 1)[0]
        assert not path.startswith("/"), f"README links {target}: use a relative link"
        assert (ROOT / path).is_file(), f"README links {target}, which is not a file"


def test_the_link_check_sees_a_missing_file() -> None:
    assert relative_links("[a](docs/nope.md) [b](https://x.org/y) [c](#top) ![i](p.png)") == [
        "docs/nope.md"
    ]


def _package_folders() -> set[str]:
    return {
        f"{init.parent.relative_to(ROOT).as_posix()}/"
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
    }


def _layout_folders() -> set[str]:
    page = (DOCS / "layout.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z_/]+/)` \|", page, re.M))


def test_the_layout_page_lists_every_package_folder_and_only_those() -> None:
    listed = _layout_folders()
    packages = _package_folders()
    assert "node/election/" in packages
    missing = sorted(packages - listed)
    assert not missing, f"docs/layout.md lacks a row for {missing}"
    for folder in sorted(listed):
        assert (ROOT / folder).is_dir(), f"docs/layout.md lists {folder}, which does not exist"
        assert (ROOT / folder / "__init__.py").is_file(), f"{folder} is not a package"


async def test_the_http_api_page_is_generated_from_the_live_document() -> None:
    gen_api: Any = _gen_api()
    document = await gen_api.live_document()
    text = gen_api.PAGE.read_text(encoding="utf-8")
    assert gen_api.render_page(text, document) == text, "run: python docs/gen_api.py"
    table = text.split(gen_api.BEGIN, 1)[1].split(gen_api.END, 1)[0]
    listed = set(re.findall(r"^\| `([A-Z]+)` \| `([^`]+)` \|", table, re.M))
    operations = {(method, path) for method, path, _ in gen_api.operations(document)}
    assert ("GET", "/v1/openapi.json") in operations
    assert listed == operations


def test_the_route_table_changes_with_the_document() -> None:
    gen_api: Any = _gen_api()
    operation = {"summary": "a | b", "responses": {"200": {}}, "x-shoal-callers": ["peer"]}
    document = {"paths": {"/v1/x": {"post": operation}}}
    page = f"head\n{gen_api.BEGIN}\nold\n{gen_api.END}\ntail\n"
    rendered = gen_api.render_page(page, document)
    assert "| `POST` | `/v1/x` | a \\| b | peer | 200 |" in rendered
    assert "old" not in rendered
    assert rendered.endswith(f"{gen_api.END}\ntail\n")


def _nav_pages(entries: list[Any]) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages |= _nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_the_site_nav_lists_every_page_and_only_existing_ones() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)
    nav = _nav_pages(config["nav"])
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")}
    assert {"gpus.md", "benchmarks-cli.md", "runbooks.md"} <= nav
    assert nav == pages
