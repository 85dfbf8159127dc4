"""Every relative link of README.md, BENCHMARKS.md, RELIABILITY.md and docs/ points at a file
of the repository, and a link to a heading (``page.md#heading``) at a heading that page has
(GitHub's anchors: lower case, punctuation dropped, spaces as ``-``)."""

import re

import pytest
from repo import ROOT

PAGES = sorted(
    [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "RELIABILITY.md", *ROOT.joinpath("docs").rglob("*.md")]
)
FENCED = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    return CODE.sub("", FENCED.sub("", text))


def anchors(text: str) -> set:
    """The anchors GitHub gives the headings of a Markdown text."""
    seen: dict = {}
    for title in HEADING.findall(FENCED.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        yield slug if n == 0 else f"{slug}-{n}"


def broken_links(text: str, folder):
    """The links of ``text`` (a page in ``folder``) that point nowhere, with why."""
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (folder / path).resolve() if path else None
        if dest is None:  # a heading of this very page
            if anchor not in set(anchors(text)):
                yield f"{target}: no heading with that anchor here"
            continue
        if not dest.exists() or ROOT.resolve() not in (dest, *dest.parents):
            yield f"{target}: no such file"
        elif anchor and dest.suffix == ".md" and anchor not in set(anchors(dest.read_text())):
            yield f"{target}: {dest.name} has no heading with that anchor"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file_that_exists(page):
    assert list(broken_links(page.read_text(), page.parent)) == []


def test_the_anchors_are_githubs():
    text = "# Live in Foxglove / Lichtblick: `vipc-foxglove`\n## Spark's Python workers: the pipeline's daemon\n"
    text += "## A\n## A\n"
    assert list(anchors(text)) == [
        "live-in-foxglove--lichtblick-vipc-foxglove",
        "sparks-python-workers-the-pipelines-daemon",
        "a",
        "a-1",
    ]


def test_a_missing_file_and_a_missing_heading_are_found():
    text = (
        "# Here\n[ok](README.md) [gone](nope.md) [bad anchor](README.md#no-such-heading) `[code](x.md)`\n"
        "```\n[in a block](y.md)\n```\n[web](https://example.com) [up](../etc/passwd) [self](#here) [no](#there)\n"
    )
    assert list(broken_links(text, ROOT)) == [
        "nope.md: no such file",
        "README.md#no-such-heading: README.md has no heading with that anchor",
        "../etc/passwd: no such file",
        "#there: no heading with that anchor here",
    ]
