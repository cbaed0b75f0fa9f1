"""The product speaks of what the code does, not of how it came to be: no issue numbers, numbered or
dated work-log headings, numbered sessions or calls, probe names or numbered seeds in the code,
comments, tests or docs. (History lives in git.)

Each pattern names the history habit it catches; ordinary uses of the same words ("the call",
"--calls 2000", "a pytest session", "ninja runs in its own session", "the seed's signature") do not
match. The test lists every offending file:line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("python", "csrc", "include", "tests", "docs", "README.md")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".so", ".o", ".a", ".pyc", ".whl", ".gz", ".tgz", ".zip", ".pdf"}
THIS_FILE = Path(__file__).resolve()

ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"(?:twenty|thirty|forty)-?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|"
    r"\d+(?:st|nd|rd|th))"
)
DATE = r"(?:19|20)\d\d-[01]\d-[0-3]\d"

# name -> pattern (case-insensitive, searched in each line)
PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        # "issue 15", "issues 17 and 18", "issue #4"; not "issues/123" in a URL
        "issue number": r"\bissues? #?\d+\b",
        # "call 4", "calls 2 and 3" of a work log; not a command-line flag such as "--calls 2000"
        "numbered call": r"(?<![-\w])calls? \d+\b",
        # "Eighteenth session", "(tenth session)", "14th session", "eleventh and seventeenth sessions"
        "ordinal session": rf"\b{ORDINAL}[ -]sessions?\b",
        # "## Session 3", "session 12"
        "numbered session": r"\bsessions? #?\d+\b",
        # "(run 2 of this session)", "the previous session"; not "its own session" (a process group)
        # nor "this session may have compiled" (a pytest session)
        "this session": r"\b(?:(?:runs?|calls?|rounds?) \d+ of (?:this|that|the) session|(?:previous|next) session)\b",
        # "seed 003", "seeds 001/002"; not "the seed's API"
        "numbered seed": r"\bseeds? 0\d\d\b",
        # ".probe/s17b/probe.py", "(carry .probe)"; not "obj.probe" (an attribute)
        "probe folder": r"(?<![\w.])\.probe\b",
        # "probe s17b", "probes s15b and s15c"
        "probe name": r"\bprobes? s\d+[a-z]?\b",
    }.items()
}
# Headings of a dated work log: a markdown heading holding a date, or a comment line opening with one.
HEADING_PATTERNS: dict[str, re.Pattern[str]] = {
    "dated heading": re.compile(rf"^\s{{0,3}}#{{1,6}}\s.*\b{DATE}\b"),
    "dated comment": re.compile(rf"^\s*(?://+|#+|\*)\s*\(?{DATE}\b"),
}


def scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
            continue
        for file in sorted(path.rglob("*")):
            if not file.is_file() or file.resolve() == THIS_FILE or file.suffix.lower() in BINARY_SUFFIXES:
                continue
            if SKIPPED_DIRS.intersection(file.relative_to(ROOT).parts):
                continue
            files.append(file)
    return files


CONTINUATION = re.compile(r"^\s*(?://+|#+|\*|--)?\s*")  # a comment's marker on its next line


def offences(text: str) -> list[tuple[int, str, str]]:
    """(line number, pattern name, line) of every line of ``text`` matching a history pattern, or
    starting a match that a line break splits ("fourteenth" / "session")."""
    lines = text.splitlines()
    found = []
    for index, line in enumerate(lines):
        following = CONTINUATION.sub("", lines[index + 1]) if index + 1 < len(lines) else ""
        joined = f"{line.rstrip()} {following}"
        for name, pattern in PATTERNS.items():
            match = pattern.search(joined)
            if match and match.start() <= len(line.rstrip()):
                found.append((index + 1, name, line.strip()))
                break
        else:
            for name, pattern in HEADING_PATTERNS.items():
                if pattern.search(line):
                    found.append((index + 1, name, line.strip()))
                    break
    return found


def test_patterns_catch_history_and_spare_ordinary_words() -> None:
    history = [
        "## Eighteenth session (2026-11-26): fewer instructions",
        "### Probe s15 (call 1; graph us)",
        "# call 2, tree bff85c8 (carry .probe, .bench-old = git archive 1d6a406)",
        "in CUDA-graph replay (issue 15).",
        "Before and after issues 13-16",
        "the kernel author's Python API (seed 003).",
        "Fixture: the tutorial kernel of seeds 001/002",
        "measured in docs/benchmarks.md, thirteenth session",
        "## Session 3",
        "(run 2 of this session)",
        "the 14th session's kernels",
        "## 2026-11-22: benchmarks",
        "// 2026-11-22 rewrote the loop",
        "calls 2 and 3 ran the probes",
        "// (eleventh and seventeenth sessions.) Up to kDecodeTokens tokens",
    ]
    ordinary = [
        "python -m jit_kernel.benchmark.bench_dispatch --cpu-only --calls 2000",
        "ninja runs in its own session and gets SIGTERM",
        "A fresh cache per session, unless the developer points the tests at one",
        "strict mode loads what is cached, and this session may have compiled any config already",
        "the seed's benchmark helpers keep the seed's signatures",
        "each call allocates its output; the call 's arguments",
        "self.probe(x) returns the first match",
        "see https://github.com/pytorch/pytorch/issues/12345",
        "| 16 | 4096 | 2.00 | 125% |",
        "- **Measured**: 2026-11-27",
        "torch.manual_seed(0)",
    ]
    assert [line for line in history if not offences(line)] == []
    assert [line for line in ordinary if offences(line)] == []
    # a match split by a line break is reported once, on the line where it starts
    assert offences("up = down; docs/benchmarks.md, fourteenth\nsession).") == [
        (1, "ordinal session", "up = down; docs/benchmarks.md, fourteenth")
    ]
    assert offences("// measured in the\n// seventeenth session") == [(2, "ordinal session", "// seventeenth session")]
    assert offences("a call\n4 lines later") == [(1, "numbered call", "a call")]


def test_no_development_history_in_the_product() -> None:
    found = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}:{number}: [{name}] {line[:160]}" for number, name, line in offences(text)]
    assert not found, f"{len(found)} lines speak of development history:\n" + "\n".join(found)
