"""Reliability: strict mode loads what `warm` compiled, any legal path builds, a bad
cache folder is one clear error, a killed build leaves no compilers and no garbage behind, and a
process that compiles nothing logs nothing."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

import jit_kernel
from jit_helpers import write_host_kernel
from jit_kernel.engine import cache, env, families
from jit_kernel.engine.dispatch import Dispatcher, JitDisabledError
from jit_kernel.engine.jit import make_build_request

PACKAGE_PARENT = str(Path(jit_kernel.__file__).resolve().parent.parent)
SEEDS = Path(__file__).resolve().parent / "cpp" / "seeds"
# Legal in a path, special to ninja (space, `$`, `:`) or to a shell (space, `$`).
ODD = "a b $x $$y:z"


def _environment(**overrides: str) -> dict[str, str]:
    """A subprocess environment that imports this jit_kernel and logs at the default level."""
    base = {k: v for k, v in os.environ.items() if k not in ("JIT_KERNEL_LOG_LEVEL", "JIT_KERNEL_DISABLE_JIT")}
    path = os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))
    return {**base, "PYTHONPATH": path, **overrides}


def _python(script: str, **environment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(script)],
        capture_output=True, text=True, env=_environment(**environment), check=False,
    )  # fmt: skip


ADD_SEVEN = """
    import torch, jit_kernel
    x = torch.arange(5, dtype=torch.int32)
    print("sum", int(jit_kernel.add_constant(x, 7).sum()))
"""


def _request(folder: Path, *flags: str, name: str = "robust") -> cache.BuildRequest:
    return make_build_request(
        name,
        cpp_files=[str(folder / "kernel.cc")],
        cpp_wrappers=[("value", "user::value")],
        extra_include_paths=[str(folder)],
        extra_cflags=list(flags),
    )


# --- Item 2: JIT_KERNEL_DISABLE_JIT forbids compiling, not loading what `warm` compiled ---------


WARM_SEVEN = "python -m jit_kernel warm add_constant_host --config=7"


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache that `warm` filled with add_constant_host<7> (as an image build would)."""
    root = tmp_path_factory.mktemp("warmed") / "cache"
    command = [sys.executable, *WARM_SEVEN.split()[1:]]
    warm = subprocess.run(
        command, capture_output=True, text=True, env=_environment(JIT_KERNEL_CACHE_DIR=str(root)), check=False
    )
    assert warm.returncode == 0, warm.stdout + warm.stderr
    return root


def test_strict_miss_says_what_where_and_which_warm_command(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    refused = _python(ADD_SEVEN, JIT_KERNEL_CACHE_DIR=str(root), JIT_KERNEL_DISABLE_JIT="1")
    assert refused.returncode != 0
    error = refused.stderr.strip().splitlines()[-1]
    assert error.startswith("jit_kernel.engine.dispatch.JitDisabledError: add_constant_host<7> has no usable prebuilt")
    assert f"looked for {root}/jit_kernel_add_constant_host_7-" in error
    # The command the `warmed` fixture runs, aimed at this cache.
    assert f"`JIT_KERNEL_CACHE_DIR={shlex.quote(str(root))} {WARM_SEVEN}`" in error


def test_strict_mode_loads_what_warm_compiled(warmed: Path) -> None:
    root = warmed
    strict = _python(ADD_SEVEN, JIT_KERNEL_CACHE_DIR=str(root), JIT_KERNEL_DISABLE_JIT="1")
    assert strict.returncode == 0, strict.stderr
    assert "sum 45" in strict.stdout


def test_strict_mode_in_process_uses_the_cache_and_never_compiles(
    warmed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = warmed
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(root))
    monkeypatch.setenv("JIT_KERNEL_DISABLE_JIT", "1")
    monkeypatch.setattr("jit_kernel.engine.jit._loaded", {})
    monkeypatch.setattr(cache, "_publish", lambda *args: pytest.fail("strict mode compiled"))
    host = Dispatcher(families.ADD_CONSTANT_HOST)
    assert host.function("run", (7,)) is not None
    assert host.decisions[(7,)].startswith("jit (")
    with pytest.raises(JitDisabledError, match=rf"add_constant_host<8>.*looked for {root}.*--config=8`"):
        host.function("run", (8,))


# --- Item 7: quiet when nothing is compiled ------------------------------------------------------


def test_a_process_that_finds_its_module_cached_logs_nothing(warmed: Path) -> None:
    root = warmed
    hit = _python(ADD_SEVEN, JIT_KERNEL_CACHE_DIR=str(root))
    assert hit.returncode == 0, hit.stderr
    assert "sum 45" in hit.stdout
    assert "jit_kernel" not in hit.stderr, hit.stderr


def test_dispatcher_logs_info_only_when_it_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    class Module:
        def get_function(self, name: str) -> object:
            return name

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("jit_kernel")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        monkeypatch.setattr("jit_kernel.engine.dispatch.load_cached", lambda request: Module())
        Dispatcher(families.ADD_CONSTANT_HOST).function("run", (1234,))
        assert [r.levelno for r in records] == [logging.DEBUG]
        assert "found in the JIT cache" in records[0].getMessage()
        records.clear()
        monkeypatch.setattr("jit_kernel.engine.dispatch.load_cached", lambda request: None)
        monkeypatch.setattr("jit_kernel.engine.dispatch.load_request", lambda request: Module())
        Dispatcher(families.ADD_CONSTANT_HOST).function("run", (1234,))
        assert [(r.levelno, r.getMessage().split(":")[0]) for r in records] == [
            (logging.INFO, "add_constant_host<1234>")
        ]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# --- Item 3: a space, `$` or `:` in the cache, source or package path ----------------------------


@pytest.fixture
def odd_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package's headers and kernels copied under an odd path, as a venv there would hold them."""
    data = tmp_path / f"venv {ODD}" / "jit_kernel"
    shutil.copytree(env.INCLUDE_DIR, data / "include")
    shutil.copytree(env.CSRC_DIR, data / "csrc")
    monkeypatch.setattr(env, "DATA_ROOT", data)
    monkeypatch.setattr(env, "INCLUDE_DIR", data / "include")
    monkeypatch.setattr(env, "CSRC_DIR", data / "csrc")
    return data


def test_odd_characters_in_cache_source_and_package_paths_build(tmp_path: Path, odd_package: Path) -> None:
    source = tmp_path / f"src {ODD}"
    write_host_kernel(source)
    root = tmp_path / f"cache {ODD}"
    assert cache.load_or_build(_request(source), root).value() == 101
    (entry,) = cache.list_entries(root)
    assert entry.valid


@pytest.mark.slow
def test_odd_characters_in_paths_build_a_cuda_module(tmp_path: Path, odd_package: Path) -> None:
    source = tmp_path / f"src {ODD}"
    source.mkdir()
    shutil.copy(SEEDS / "add_constant.cuh", source / "add_constant.cu")
    request = make_build_request(
        "robust_cuda",
        cuda_files=[str(source / "add_constant.cu")],
        cuda_wrappers=[("add_constant", "add_constant<3>")],
        extra_include_paths=[str(source)],
        cuda_arch="9.0a",
    )
    module = cache.load_or_build(request, tmp_path / f"cache {ODD}")
    assert module.implements_function("add_constant")


# --- Item 5a: a cache folder that cannot be written ----------------------------------------------


@pytest.mark.parametrize("where", ["is a file", "is under a file"])
def test_cache_path_blocked_by_a_file_is_one_clear_error(tmp_path: Path, where: str) -> None:
    write_host_kernel(tmp_path / "src")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    root = blocker if where == "is a file" else blocker / "cache"
    with pytest.raises(cache.CacheDirError) as raised:
        cache.load_or_build(_request(tmp_path / "src"), root)
    message = str(raised.value)
    assert "\n" not in message
    assert str(root) in message and "JIT_KERNEL_CACHE_DIR" in message


def _read_only_runner(folder: Path) -> list[str]:
    """A command prefix under which ``folder`` cannot be written, or skip. chmod does not stop
    root, so as root the folder is bind-mounted read-only in a private mount namespace."""
    if os.geteuid() != 0:
        for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            path.chmod(0o555)
        return []
    runner = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"', str(folder)]  # fmt: skip
    probe = subprocess.run([*runner, "sh", "-c", 'touch "$0/probe"', str(folder)], capture_output=True, check=False)
    if shutil.which("unshare") is None or b"Read-only" not in probe.stderr:
        pytest.skip("running as root without a private read-only mount (unshare --mount) to test with")
    return runner


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


def test_read_only_cache_serves_hits_and_a_miss_is_one_clear_error(warmed: Path) -> None:
    root = Path(tempfile.mkdtemp(prefix="jit-kernel-ro-")) / "cache"  # not under root-only pytest folders
    try:
        shutil.copytree(warmed, root)  # a baked cache holding add_constant_host<7>
        before = _snapshot(root)
        runner = _read_only_runner(root)
        script = textwrap.dedent(ADD_SEVEN) + "jit_kernel.add_constant(x, 8)\n"
        result = subprocess.run(
            [*runner, sys.executable, "-W", "ignore", "-c", script],
            capture_output=True, text=True, env=_environment(JIT_KERNEL_CACHE_DIR=str(root)), check=False,
        )  # fmt: skip
        assert "sum 45" in result.stdout, result.stderr
        assert result.returncode != 0
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"jit_kernel.engine.cache.CacheDirError: cannot write to the JIT cache at {root} ("), (
            last
        )
        assert "JIT_KERNEL_CACHE_DIR" in last
        assert _snapshot(root) == before  # neither the hit nor the refused miss wrote anything
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(root.parent, ignore_errors=True)


# --- Item 6: a killed build leaves no compilers running and no garbage behind --------------------

# Sources whose compiles take a minute or more on a CI machine: g++ evaluating a long constexpr
# loop, and nvcc compiling thousands of kernels (nvcc's front end refuses long constexpr loops).
SLOW_CPP = """
constexpr unsigned long spin(unsigned long n) {
  unsigned long s = 0;
  for (unsigned long i = 0; i < n; ++i) s = s * 31 + i;
  return s;
}
static_assert(spin(3000000) != 1);
"""
SLOW_CPP_FLAGS = ["-fconstexpr-loop-limit=2147483647", "-fconstexpr-ops-limit=4611686018427387904"]
SLOW_CUDA = "".join(
    f"__global__ void k{i}(float* p) {{ p[threadIdx.x] = p[threadIdx.x] * {i}.5f + {i}; }}\n" for i in range(3000)
)


def _process_tree(root_pid: int) -> dict[int, str]:
    """``{pid: command name}`` of every live descendant of ``root_pid`` (zombies count as gone)."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry.name)], names[int(entry.name)] = int(fields[1]), name
    found: dict[int, str] = {}
    pending = [root_pid]
    while pending:
        parent = pending.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = names[pid]
                pending.append(pid)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.add(pid)
        except (OSError, IndexError):
            pass
    return alive


def _working_in(folder: Path) -> dict[int, str]:
    """Live processes whose working directory is ``folder`` (every process of a build has it)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and Path(os.readlink(entry / "cwd")) == folder and _alive({int(entry.name)}):
                found[int(entry.name)] = (entry / "comm").read_text().strip()
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("language", ["c++", "cuda"])
def test_killed_build_stops_its_compilers_and_the_next_build_removes_its_staging(tmp_path: Path, language: str) -> None:
    source = tmp_path / "src"
    source.mkdir()
    root = tmp_path / "cache"
    if language == "cuda":
        (source / "slow.cu").write_text(SLOW_CUDA + "int identity(int x) { return x; }\n")
        build = f"""make_build_request("slow_cuda", cuda_files=[{str(source / "slow.cu")!r}],
            cuda_wrappers=[("f", "identity")], cuda_arch="9.0a")"""
        compiler = "cicc"  # nvcc's device compiler; nvcc itself is its parent
    else:
        (source / "slow.cc").write_text(SLOW_CPP + "int identity(int x) { return x; }\n")
        build = f"""make_build_request("slow_cpp", cpp_files=[{str(source / "slow.cc")!r}],
            cpp_wrappers=[("f", "identity")], extra_cflags={SLOW_CPP_FLAGS!r})"""
        compiler = "cc1plus"
    script = f"""
from pathlib import Path
from jit_kernel.engine import cache
from jit_kernel.engine.jit import make_build_request
cache.load_or_build({build}, Path({str(root)!r}))
"""
    builder = subprocess.Popen([sys.executable, "-W", "ignore", "-c", script], env=_environment())
    try:
        deadline = time.monotonic() + 120
        tree: dict[int, str] = {}
        while not {"ninja", compiler} <= set(tree.values()):
            assert builder.poll() is None and time.monotonic() < deadline, f"the build never reached {compiler}"
            time.sleep(0.05)
            tree = _process_tree(builder.pid)
        (staging,) = (root / ".staging").iterdir()
        os.kill(builder.pid, signal.SIGKILL)
        builder.wait()
        deadline = time.monotonic() + 5
        while (_alive(set(tree)) or _working_in(staging)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = {pid: tree[pid] for pid in _alive(set(tree))} | _working_in(staging)
        assert not left, f"build processes outlived their killed parent: {left}"
    finally:
        if builder.poll() is None:
            builder.kill()
    assert staging.is_dir()  # left behind by the killed process; the next build removes it
    (source / "fast.cc").write_text("int identity(int x) { return x; }\n")
    fast = make_build_request("fast", cpp_files=[str(source / "fast.cc")], cpp_wrappers=[("f", "identity")])
    assert cache.load_or_build(fast, root).f(5) == 5  # another entry: its lock is free
    assert not staging.exists()
    assert list((root / ".staging").iterdir()) == []


def test_sweep_spares_staging_whose_build_is_alive(tmp_path: Path) -> None:
    """The lock decides, not the pid: a folder whose entry lock another process holds stays."""
    root = tmp_path / "cache"
    (root / ".locks").mkdir(parents=True)
    live = root / ".staging" / "live-0123.1.aaaa"
    dead = root / ".staging" / "dead-4567.1.bbbb"  # same (reused) pid as the live one
    live.mkdir(parents=True)
    dead.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys, time
            handle = open({str(root / ".locks" / "live-0123.lock")!r}, "w")
            fcntl.flock(handle, fcntl.LOCK_EX)
            print("held", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        cache.sweep_staging(root)
        assert live.is_dir() and not dead.exists()
    finally:
        holder.kill()
        holder.wait()
    cache.sweep_staging(root)
    assert not live.exists()
