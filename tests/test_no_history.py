"""The product speaks of what the code does, not of how it came to be: no issue numbers, numbered or
dated work-log headings, numbered sessions or calls, probe names, numbered seeds or commit hashes in
the code, comments, tests, docs, CI scripts or tools. (History lives in git.)

Each pattern names the history habit it catches; ordinary uses of the same words ("the call",
"--calls 2000", "a pytest session", "ninja runs in its own session", "the seed's signature") and
hexadecimal that is not a commit (``0x1f``, SHA-256 digests, identifiers) do not match. Generated
provenance, the source commit that ``jit_kernel.benchmark`` records with its results, is the one
place a commit hash belongs (``GENERATED_PROVENANCE``). The test lists every offending file:line.

The examples below are built from parts at run time, so this file's own text holds none of the
habits it names, and the scan covers this file too."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("python", "csrc", "include", "tests", "docs", "ci", ".ci", "tools", "README.md")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".so", ".o", ".a", ".pyc", ".whl", ".gz", ".tgz", ".zip", ".pdf"}

ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"(?:twenty|thirty|forty)-?(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth)|"
    r"\d+(?:st|nd|rd|th))"
)
DATE = r"(?:19|20)\d\d-[01]\d-[0-3]\d"
HEX = "[0-9a-f]{7,40}"  # a git commit, abbreviated (7 and up) or whole (40)

# name -> pattern (case-insensitive, searched in each line); N stands for a number in the comments
PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        # "issue N", "issues N and M", "issue #N"; not "issues/N" in a URL
        "issue number": r"\bissues? #?\d+\b",
        # "call N", "calls N and M" of a work log; not a command-line flag such as "--calls N"
        "numbered call": r"(?<![-\w])calls? \d+\b",
        # an ordinal (in words or as "Nth") and "session(s)", as a heading or in a parenthesis
        "ordinal session": rf"\b{ORDINAL}[ -]sessions?\b",
        # "## Session N", "session N"
        "numbered session": r"\bsessions? #?\d+\b",
        # a run, call or round numbered within "this session", or the session before or after;
        # not "its own session" (a process group) nor "this session may have compiled" (pytest's)
        "this session": r"\b(?:(?:runs?|calls?|rounds?) \d+ of (?:this|that|the) session|(?:previous|next) session)\b",
        # "seed 0NN", "seeds 0NN/0NN"; not "the seed's API"
        "numbered seed": r"\bseeds? 0\d\d\b",
        # a hidden folder named probe, as in "(carry" followed by it; not an attribute "obj.probe"
        "probe folder": r"(?<![\w.])\." + "probe" + r"\b",
        # "probe sN", "probe sNb", "probes sNa and sNb"
        "probe name": r"\bprobes? s\d+[a-z]?\b",
    }.items()
}
# A commit quoted in prose: 7 to 40 lowercase hex digits holding both a letter and a digit, standing
# alone. Not part of a longer word or number (a SHA-256 digest, `0x` constants, identifiers such as
# `bf16x2`), a path, a version or an option (`.`, `/`, `-`, `#`, `:` next to it), nor letters or
# digits alone ("deadbeef", "2026").
COMMIT_HASH = re.compile(rf"(?<![\w.:/#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d){HEX}(?![\w/#-]|\.\w|:\w)")
# In code, a string literal that is nothing but hex is data (a test's synthetic commit or digest), not
# prose: such literals are blanked before the search. Docs get no such exemption.
CODE_SUFFIXES = {".py", ".sh", ".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp"}
HEX_LITERAL = re.compile(r"""(["'])[0-9a-f]+\1""")
# Headings of a dated work log: a markdown heading holding a date, or a comment line opening with one.
HEADING_PATTERNS: dict[str, re.Pattern[str]] = {
    "dated heading": re.compile(rf"^\s{{0,3}}#{{1,6}}\s.*\b{DATE}\b"),
    "dated comment": re.compile(rf"^\s*(?://+|#+|\*)\s*\(?{DATE}\b"),
}
# Lines that record the commit a result was measured at, exactly as jit_kernel.benchmark writes them,
# per file (a glob relative to the repository root): the "commit" field of each script's JSON result
# (results.environment), and in the report generated from them the header's environment line
# (report.environment_lines) and the note on a section from another run than the rest (report.render).
GENERATED_PROVENANCE: dict[str, tuple[re.Pattern[str], ...]] = {
    "docs/benchmarks/data/*.json": (re.compile(rf'^\s*"commit": "{HEX}",?$'),),
    "docs/benchmarks.md": (
        re.compile(rf"^- \*\*Source commit\*\*: {HEX}$"),
        re.compile(rf"^_From another run than the other sections: {DATE}, commit {HEX}\._$"),
    ),
}


def scanned_files() -> list[Path]:
    """The files of SCANNED that belong to the repository: in a git checkout, what git tracks or
    would track (build outputs it ignores, such as a prebuilt manifest copied into the package, are
    not the product's text); elsewhere (an unpacked sdist) every file under SCANNED."""
    if (ROOT / ".git").exists() and shutil.which("git"):
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SCANNED],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = (ROOT / name for name in sorted(set(listed.split("\0"))) if name)
        return [p for p in paths if p.is_file() and p.suffix.lower() not in BINARY_SUFFIXES]
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
            continue
        for file in sorted(path.rglob("*")):
            if not file.is_file() or file.suffix.lower() in BINARY_SUFFIXES:
                continue
            if SKIPPED_DIRS.intersection(file.relative_to(ROOT).parts):
                continue
            files.append(file)
    return files


def provenance_of(path: Path) -> tuple[re.Pattern[str], ...]:
    """The generated provenance lines allowed in ``path`` (a file under ROOT)."""
    relative = path.relative_to(ROOT).as_posix()
    return tuple(
        p for glob, patterns in GENERATED_PROVENANCE.items() if fnmatch.fnmatch(relative, glob) for p in patterns
    )


CONTINUATION = re.compile(r"^\s*(?://+|#+|\*|--)?\s*")  # a comment's marker on its next line


def offences(text: str, provenance: tuple[re.Pattern[str], ...] = (), code: bool = False) -> list[tuple[int, str, str]]:
    """(line number, pattern name, line) of every line of ``text`` matching a history pattern, or
    starting a match that a line break splits (an ordinal at a line's end, "session" on the next).
    A line matching one of ``provenance`` may hold a commit hash; so may a hex string literal where
    ``text`` is ``code``."""
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
            searched = HEX_LITERAL.sub('""', line) if code else line
            if COMMIT_HASH.search(searched) and not any(p.search(line) for p in provenance):
                found.append((index + 1, "commit hash", line.strip()))
                continue
            for name, pattern in HEADING_PATTERNS.items():
                if pattern.search(line):
                    found.append((index + 1, name, line.strip()))
                    break
    return found


def _(*parts: str) -> str:
    """``parts`` joined by single spaces: a fixture spelled so that this file's text never matches."""
    return " ".join(parts)


DAY = "-".join(("2031", "04", "05"))
SHORT = "".join(("c0", "ffee", "42"))  # a synthetic abbreviated commit
FULL = SHORT * 5  # and a whole one (40 digits)

HISTORY = [
    _("## Ninth", f"session ({DAY}): a heading"),
    _("### Probe", "s7 (call", "1; a note)"),
    _("# call", "2, tree", SHORT, "(carry", "." + "probe)"),
    _("a limitation (issue", "9)."),
    _("Before and after issues", "3-5"),
    _("the kernel author's API (seed", "007)."),
    _("Fixture: the kernel of seeds", "004/005"),
    _("measured in docs/benchmarks.md, tenth", "session"),
    _("## Session", "4"),
    _("(run", "2 of this", "session)"),
    _("the", "8th", "session's kernels"),
    _("##", f"{DAY}: benchmarks"),
    _("//", DAY, "rewrote the loop"),
    _("calls", "2 and 3 ran the", "probes"),
    _("// (third and", "fifth", "sessions.) Up to N tokens"),
    _("the old layout, measured at", SHORT + ", was slower"),
    _("(built from", FULL + ")"),
    _("see commit", SHORT),
]
ORDINARY = [
    "python -m jit_kernel.benchmark.bench_dispatch --cpu-only --calls 2000",
    "ninja runs in its own session and gets SIGTERM",
    "A fresh cache per session, unless the developer points the tests at one",
    "strict mode loads what is cached, and this session may have compiled any config already",
    "the seed's benchmark helpers keep the seed's signatures",
    "each call allocates its output; the call 's arguments",
    "self.probe(x) returns the first match",
    "see https://github.com/pytorch/pytorch/issues/12345",
    "| 16 | 4096 | 2.00 | 125% |",
    "- **Measured**: " + DAY,
    "torch.manual_seed(0)",
    # hexadecimal that is not a commit
    "MAGIC = 0x466243b1  # the fatbin header",
    "digest = '" + "3f5a0c9e" * 8 + "'  # SHA-256",
    "slim sha256: " + "0" * 63 + "a",
    "the deadbeef pattern, 20260405 bytes, version 0.1.15.post2, sm_90a, bf16x2",
    "color='#1f77b4', wheel jit_kernel-0.1.0-cp311-cp311-linux_x86_64.whl",
    "abc1234.so and /cache/rmsnorm-" + SHORT + "/ hold the module",
]


def test_patterns_catch_history_and_spare_ordinary_words() -> None:
    assert [line for line in HISTORY if not offences(line)] == []
    assert [line for line in ORDINARY if offences(line)] == []
    # a match split by a line break is reported once, on the line where it starts
    assert offences(_("up = down; docs/benchmarks.md, fourteenth\nsession).")) == [
        (1, "ordinal session", "up = down; docs/benchmarks.md, fourteenth")
    ]
    assert offences(_("// measured in the\n// seventeenth", "session")) == [
        (2, "ordinal session", _("// seventeenth", "session"))
    ]
    assert offences(_("a call\n4 lines later")) == [(1, "numbered call", "a call")]


def test_generated_provenance_alone_may_name_a_commit() -> None:
    report = provenance_of(ROOT / "docs/benchmarks.md")
    result = provenance_of(ROOT / "docs/benchmarks/data/bench_norm.json")
    assert offences(f"- **Source commit**: {SHORT}", report) == []
    assert offences(f"_From another run than the other sections: {DAY}, commit {SHORT}._", report) == []
    assert offences(f'  "commit": "{SHORT}",', result) == []
    # the same lines elsewhere, or prose around them, are history
    assert offences(f"- **Source commit**: {SHORT}", provenance_of(ROOT / "docs/api.md")) != []
    assert offences(f'  "commit": "{SHORT}",', report) != []
    assert offences(f"- **Source commit**: {SHORT}, the faster one", report) != []
    # a string literal of code that is only hex is data; the same in prose is not
    assert offences(f'env = {{"JIT_KERNEL_BENCH_COMMIT": "{SHORT}"}}', code=True) == []
    assert offences(f'env = {{"JIT_KERNEL_BENCH_COMMIT": "{SHORT}"}}') != []
    assert offences(f'note = "measured at {SHORT}"', code=True) != []


def test_the_scan_covers_every_scanned_folder() -> None:
    """Each entry of SCANNED contributes files (the scan would pass vacuously on a wrong root), this
    file among them."""
    files = scanned_files()
    relative = {path.relative_to(ROOT).parts[0] for path in files}
    assert relative == set(SCANNED)
    assert Path(__file__).resolve() in files


def test_no_development_history_in_the_product() -> None:
    found = []
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{number}: [{name}] {line[:160]}"
            for number, name, line in offences(text, provenance_of(path), path.suffix in CODE_SUFFIXES)
        ]
    assert not found, f"{len(found)} lines speak of development history:\n" + "\n".join(found)
