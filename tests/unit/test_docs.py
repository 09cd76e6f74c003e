"""The documentation's shape: a README of at most 300 lines that starts with the two-command
Quick start, short paragraphs, and relative links (README.md, SECURITY.md, docs/*.md) that
reach a file that exists, and a heading there when they name one."""

from __future__ import annotations

import os
import re

import pytest

from conftest import REPO

README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")
MAX_README_LINES = 300
MAX_PARAGRAPH_LINES = 10
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def doc_files() -> list[str]:
    docs = sorted(os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md"))
    return [README, os.path.join(REPO, "SECURITY.md"), *docs]


def prose(path: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    with open(path) as f:
        for n, line in enumerate(f.read().split("\n"), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced:
                out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    return {slug(line.lstrip("#")) for _, line in prose(path) if re.match(r"#{1,6} ", line)}


def test_readme_is_at_most_300_lines():
    with open(README) as f:
        n = len(f.read().rstrip("\n").split("\n"))
    assert n <= MAX_README_LINES, f"README.md has {n} lines; the depth goes to docs/"


def test_readme_starts_with_the_two_command_quick_start():
    with open(README) as f:
        text = f.read()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections and sections[0] == "Quick start", sections[:3]
    body = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```", body, re.M | re.S)
    assert block, "no sh block in the Quick start"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


@pytest.mark.parametrize("path", doc_files(), ids=os.path.basename)
def test_every_relative_link_reaches_a_file_and_heading(path):
    broken = []
    for n, line in prose(path):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                broken.append(f"{n}: {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                broken.append(f"{n}: {target}: no such heading")
    assert not broken, broken


@pytest.mark.parametrize("path", [README, *doc_files()[2:]], ids=os.path.basename)
def test_paragraphs_are_short(path):
    long, run, start = [], 0, 0
    for n, line in prose(path) + [(0, "")]:
        new_block = not line.strip() or line.startswith(("|", "#")) or re.match(r"\s*(- |\d+\. )", line)
        if new_block:
            if run > MAX_PARAGRAPH_LINES:
                long.append(f"line {start}: {run} lines")
            run, start = (1 if line.strip() and not line.startswith(("|", "#")) else 0), n
        else:
            run += 1
    assert not long, long


def test_every_docs_file_is_linked_from_the_readme():
    with open(README) as f:
        linked = {os.path.normpath(t.partition("#")[0]) for t in LINK.findall(f.read())}
    missing = [n for n in sorted(os.listdir(DOCS)) if n.endswith(".md") and f"docs/{n}" not in linked]
    assert not missing, missing
