"""Every relative link in README.md and docs/ leads somewhere: the file exists and, for a ``#anchor``,
the target document has a heading with that anchor (GitHub's rule: lower case, punctuation other
than ``-`` and ``_`` dropped, spaces to hyphens, ``-1``, ``-2`` ... for repeats)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.M)
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")  # inline code: ``kernels[key](*args)`` is no link


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings."""
    seen: Counter[str] = Counter()
    found = set()
    for match in _HEADING.finditer(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", match["title"].replace("`", "").lower()).replace(" ", "-")
        found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def test_anchor_rule() -> None:
    text = "# Norm + fp8 quantisation, Gemma's RMSNorm\n## `load_jit`, `cache_once`\n## Notes\n## Notes\n"
    assert anchors(text) == {"norm--fp8-quantisation-gemmas-rmsnorm", "load_jit-cache_once", "notes", "notes-1"}


def test_relative_links_resolve() -> None:
    broken = []
    for document in _documents():
        text = _CODE.sub("", _FENCE.sub("", document.read_text()))
        for match in _LINK.finditer(text):
            target = match["target"]
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
