"""Every relative link in the repository's Markdown points at something that exists.

For each *.md file (README.md, ARCHITECTURE.md, docs/**; hidden folders, virtual environments and
run outputs skipped), every inline link or image `[text](target)` whose target is not a URL must name
an existing file or folder, relative to the file that holds the link; a `#anchor` on a Markdown
target (or a bare `#anchor`, meaning the same file) must match one of its headings as GitHub slugs
them. Links inside code (fenced blocks, `inline code`) are not links and are not checked."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"runs", "build", "dist", "node_modules", "__pycache__", "site-packages"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) or [text](target "title"); text may hold one level of brackets (e.g. an image)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def markdown_files(root: Path = REPO) -> list[Path]:
    """The repository's *.md files, skipping hidden folders, virtual environments and outputs."""
    found: list[Path] = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                if (entry.name.startswith(".") or entry.name in SKIP_DIRS or entry.name.endswith(".egg-info")
                        or (entry / "pyvenv.cfg").exists()):
                    continue
                walk(entry)
            elif entry.suffix == ".md":
                found.append(entry)

    walk(root)
    return found


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            continue
        if match:
            fence = match.group(1)
            continue
        out.append((number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)))
    return out


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: link text kept, markup and punctuation dropped (except
    '-' and '_'), lower case, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (repeats get -1, -2, ... as on
    GitHub) and explicit <a name=...> / <a id=...> targets."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines_raw(path.read_text(encoding="utf-8")):
        found.update(EXPLICIT_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def prose_lines_raw(text: str) -> list[tuple[int, str]]:
    """Like prose_lines, but with inline code kept (a heading's `code` is part of its slug)."""
    code_free = dict(prose_lines(text))
    lines = text.splitlines()
    return [(number, lines[number - 1]) for number in code_free]


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of each inline link outside code; link text may wrap onto the next line."""
    kept = dict(prose_lines(text))
    prose = "\n".join(kept.get(number, "") for number in range(1, len(text.splitlines()) + 1))
    return [(prose.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in LINK.finditer(prose)]


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for each relative link in path that points nowhere."""
    problems: list[str] = []
    rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    for number, target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto:, ...
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{rel}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            problems.append(f"{rel}:{number}: {target} (no heading with that anchor)")
    return problems


def test_markdown_files_found():
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "ARCHITECTURE.md"} <= names
    assert any(name.startswith("docs/") for name in names)


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(path: Path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_slugs_match_the_repositorys_anchors():
    assert github_slug("Where the GPU path stands (round 27, one H200)") == "where-the-gpu-path-stands-round-27-one-h200"
    assert github_slug("Shared prefixes (`trainer.share_prefix`, on with packing)") == \
        "shared-prefixes-trainershare_prefix-on-with-packing"
    assert github_slug("InterQ-RL: budgeted execution-prefix correction (`interq`)") == \
        "interq-rl-budgeted-execution-prefix-correction-interq"
    assert github_slug("Side by side: `agentq sweep`") == "side-by-side-agentq-sweep"


def test_a_broken_link_is_caught(tmp_path: Path):
    (tmp_path / "b.md").write_text("# Real heading\n\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md) [ok](b.md#real-heading) [web](https://example.com/x.md) `[code](nowhere.md)`\n"
        "[missing](nowhere.md)\n"
        "[bad anchor](b.md#not-a-heading)\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "[self](#missing-here)\n"
        "[link text that\nwraps](gone.md)\n")
    problems = broken_links(page)
    assert len(problems) == 4, problems
    assert "a.md:2: nowhere.md (no such file)" in problems[0]
    assert "b.md#not-a-heading" in problems[1]
    assert "#missing-here" in problems[2]
    assert "a.md:9: gone.md (no such file)" in problems[3]
