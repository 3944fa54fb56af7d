"""The documentation stays in step with the tree: the architecture picture with its Graphviz
source, every relative link with a file, every repository path a page names with what is there,
and the README short enough to read (issue 37)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PICTURE_SOURCE = DOCS / "architecture.dot"
PICTURE = DOCS / "architecture.svg"
README_MAX_LINES = 200
LINE_MAX_CHARS = 100

# [text](target), ![alt](target) and a reference's definition, [name]: target.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)|^\[[^\]]+\]:[ \t]*(\S+)", re.MULTILINE)
# A path in backquotes that starts with a top-level folder of the repository.
TOP_FOLDERS = (
    "schemas", "topology", "simulator", "producers", "streams", "planner", "actions", "c4",
    "bench", "tests", "deploy", "docs", "scripts", "examples", "build_backend",
)  # fmt: skip
REPO_PATH = re.compile(r"`((?:" + "|".join(TOP_FOLDERS) + r")/[A-Za-z0-9_./*-]*)")
# XML comments carry the Graphviz version and the page count: they vary, the drawing does not.
SVG_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def link_targets(text: str) -> list[str]:
    return [inline or reference for inline, reference in LINK.findall(text)]


def normalised_svg(text: str) -> str:
    without_comments = SVG_COMMENT.sub("", text)
    return "\n".join(line.rstrip() for line in without_comments.splitlines() if line.strip())


def test_the_picture_is_its_source_rendered_by_graphviz() -> None:
    dot = shutil.which("dot")
    assert dot, "Graphviz's dot is missing: apt-get install graphviz (scripts/test.sh does)"
    rendered = subprocess.run(
        [dot, "-Tsvg", str(PICTURE_SOURCE)], capture_output=True, text=True, check=True
    ).stdout
    assert normalised_svg(rendered) == normalised_svg(PICTURE.read_text(encoding="utf-8")), (
        "docs/architecture.svg is stale: dot -Tsvg docs/architecture.dot -o docs/architecture.svg"
    )


def test_readme_and_architecture_page_show_the_picture() -> None:
    for page in (REPO / "README.md", DOCS / "architecture.md"):
        targets = link_targets(page.read_text(encoding="utf-8"))
        assert any(target.endswith("architecture.svg") for target in targets), page


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_points_to_a_file(page: Path) -> None:
    broken = []
    for target in link_targets(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor on the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: no such file: {broken}"


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_repository_path_named_exists(page: Path) -> None:
    missing = []
    for path in REPO_PATH.findall(page.read_text(encoding="utf-8")):
        path = path.rstrip(".")
        if not any(REPO.glob(path.rstrip("/"))):
            missing.append(path)
    assert not missing, f"{page.relative_to(REPO)} names paths that are not there: {missing}"


def test_readme_is_short_with_short_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    long_lines = [number for number, line in enumerate(lines, 1) if len(line) > LINE_MAX_CHARS]
    assert not long_lines, f"README.md lines over {LINE_MAX_CHARS} characters: {long_lines}"


def test_the_checks_catch_what_they_look_for() -> None:
    assert link_targets('see [a](docs/x.md#part "title"), ![p](p.svg) and [b]\n[b]: b.md') == [
        "docs/x.md#part",
        "p.svg",
        "b.md",
    ]
    assert REPO_PATH.findall("`planner/eval/` and `actions/x.py::f` not `c4.io/job`") == [
        "planner/eval/",
        "actions/x.py",
    ]
    assert normalised_svg("<!-- v1\n -->\n<svg>\n<!-- t -->\n</svg>\n") == "<svg>\n</svg>"
