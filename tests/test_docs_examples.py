"""The code of docs/adding-a-kernel.md runs: its C++ blocks are written to the files they name, its
Python blocks are executed in order in one fresh process (a kernel built for sm_90a where no GPU is
visible), and its GPU blocks run where a GPU is; elsewhere they are compiled only. A Python or C++
block without an ``<!-- example: ... -->`` marker fails the test: every example is checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

DOC = Path(__file__).resolve().parents[1] / "docs" / "adding-a-kernel.md"
_BLOCK = re.compile(r"(?:<!-- example: (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str, str]]:
    return [(m["marker"] or "", m["lang"], m["code"]) for m in _BLOCK.finditer(DOC.read_text())]


def test_every_code_example_is_checked() -> None:
    unmarked = [code.splitlines()[0] for marker, lang, code in _blocks() if lang in ("python", "cpp") and not marker]
    assert not unmarked, f"examples in {DOC.name} without an '<!-- example: ... -->' marker: {unmarked}"


@pytest.mark.slow
def test_the_guide_runs(tmp_path: Path) -> None:
    script: list[str] = []
    for marker, _lang, code in _blocks():
        kind, _, argument = marker.partition(" ")
        if kind == "file":
            target = tmp_path / argument
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(code)
        elif kind == "run":
            script.append(code)
        elif kind == "gpu":
            if torch.cuda.is_available():
                script.append(code)
            else:
                compile(code, f"{DOC.name} (GPU example)", "exec")
        elif kind:
            pytest.fail(f"unknown example marker {marker!r} in {DOC.name}")
    env = {**os.environ, "JIT_KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    if not torch.cuda.is_available():
        env["JIT_KERNEL_CUDA_ARCH"] = "9.0a"
    program = "\n".join(script) + "\nprint('the guide ran')\n"
    (tmp_path / "guide.py").write_text(program)
    result = subprocess.run(
        [sys.executable, "guide.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, textwrap.shorten(result.stderr[-4000:], 4000)
    assert result.stdout.strip().endswith("the guide ran")
