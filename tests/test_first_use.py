"""What a new user meets first, on a machine with or without a GPU: the arch rule and its messages,
the words of ``list``, op names for ``warm``/``list``, ``hidden=0``, and ``load_jit``'s checks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tvm_ffi

from jit_kernel import cli
from jit_kernel.engine import builder, families, prebuilt, target
from jit_kernel.engine.dispatch import Dispatcher, JitDisabledError, jit_request
from jit_kernel.engine.jit import load_jit, make_build_request
from jit_kernel.engine.spec import ConfigError, IntRange, KernelSpec, OneOf, symbol_name
from jit_kernel.engine.target import Arch, InvalidArchError, NoCudaArchError, compile_arch

HEADER = "#pragma once\nnamespace user {\ntemplate <int N> struct Add { static int run(int x) { return x + N; } };\n}\n"


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GPU visible and no JIT_KERNEL_CUDA_ARCH."""
    monkeypatch.setattr(target, "_current_device", lambda: None)
    monkeypatch.setattr(target, "device_count", lambda: 0)
    monkeypatch.delenv("JIT_KERNEL_CUDA_ARCH", raising=False)
    target.clear()
    yield
    target.clear()


@pytest.fixture
def user_header(tmp_path: Path) -> Path:
    path = tmp_path / "user_add.cuh"
    path.write_text(HEADER)
    return path


# ---------------------------------------------------------------------------------------------
# One arch rule


def test_with_no_gpu_every_build_asks_for_the_arch_the_same_way(no_gpu: None, user_header: Path) -> None:
    """The rule has no default arch: the dispatcher, load_jit and the engine all raise the one
    message, which names the variable (and no command-line option, which these do not have)."""
    wrappers = [("run", "user::Add<5>::run")]
    raised = []
    for build in (
        lambda: compile_arch(),
        lambda: target.current(),
        lambda: jit_request(families.ADD_CONSTANT_CUDA, (7,)),
        lambda: make_build_request("user_add", cuda_files=[str(user_header)], cuda_wrappers=wrappers),
        lambda: load_jit("user_add", cuda_files=[str(user_header)], cuda_wrappers=wrappers),
    ):
        with pytest.raises(NoCudaArchError) as error:
            build()
        raised.append(str(error.value))
    assert len(set(raised)) == 1
    assert "JIT_KERNEL_CUDA_ARCH=9.0a" in raised[0] and "--arch" not in raised[0]


def test_the_rule_takes_the_option_then_the_variable_then_the_gpu(
    no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(NoCudaArchError, match="or pass --arch 9\\.0a"):
        compile_arch(None, "--arch")
    assert compile_arch("8.0", "--arch") == Arch(8, 0)
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "10.0a")
    assert compile_arch() == Arch(10, 0, "a")
    assert compile_arch("9.0a") == Arch(9, 0, "a")  # the caller's own arch wins over the variable
    monkeypatch.delenv("JIT_KERNEL_CUDA_ARCH")
    monkeypatch.setattr(target, "_current_device", lambda: 0)
    monkeypatch.setattr(target, "device_properties", lambda index: ((9, 0), 132, "Fake GPU"))
    target.clear()
    assert compile_arch() == Arch(9, 0, "a")


@pytest.mark.parametrize("command", [["warm", "add_constant"], ["clangd"]])
def test_commands_name_the_variable_and_their_option(
    command: list[str], no_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / ".clangd"
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, *(["--output", str(output)] if command == ["clangd"] else [])])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "JIT_KERNEL_CUDA_ARCH" in err and "--arch 9.0a" in err
    assert "Traceback" not in err and not output.exists()


def test_clangd_takes_the_arch_from_the_variable(no_gpu: None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    assert cli.main(["clangd", "--output", str(tmp_path / ".clangd")]) == 0
    assert "--cuda-gpu-arch=sm_90a" in (tmp_path / ".clangd").read_text()
    assert cli.main(["clangd", "--arch", "8.9", "--overwrite", "--output", str(tmp_path / ".clangd")]) == 0
    assert "--cuda-gpu-arch=sm_89" in (tmp_path / ".clangd").read_text()


def test_doctor_skips_the_cuda_self_test_with_the_rule_or_compiles_for_the_arch_given(
    no_gpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[str | None] = []
    monkeypatch.setattr(cli, "jit_module", lambda spec, config, cuda_arch=None: built.append(cuda_arch))
    with pytest.raises(NoCudaArchError, match=r"--arch 9\.0a"):
        cli._self_test_cuda(False, None)
    assert built == []
    assert "compiled and loaded for sm_90a (not run: no GPU)" in cli._self_test_cuda(False, "9.0a")
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "8.0")
    assert "for sm_80" in cli._self_test_cuda(False, None)
    assert built == ["9.0a", "8.0"]


# ---------------------------------------------------------------------------------------------
# An invalid arch names where it came from


def test_an_invalid_variable_names_itself_and_the_valid_forms(no_gpu: None, monkeypatch) -> None:
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "sm90")
    with pytest.raises(InvalidArchError) as error:
        compile_arch()
    assert "JIT_KERNEL_CUDA_ARCH='sm90'" in str(error.value) and "MAJOR.MINOR" in str(error.value)
    assert "9.0a" in str(error.value) and isinstance(error.value, ValueError)


@pytest.mark.parametrize(
    ("command", "environment", "status", "named"),
    [
        (["list", "add_constant"], {"JIT_KERNEL_CUDA_ARCH": "9.0x"}, 1, "JIT_KERNEL_CUDA_ARCH='9.0x'"),
        (["warm", "add_constant", "--arch", "sm90"], {}, 2, "--arch='sm90'"),
    ],
)
def test_the_cli_reports_an_invalid_arch_in_one_line(
    command: list[str],
    environment: dict[str, str],
    status: int,
    named: str,
    no_gpu: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        cli.main(command)
    assert exited.value.code == status
    err = capsys.readouterr().err
    assert named in err and "MAJOR.MINOR" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# "prebuilt" means in the installed library


def _install_manifest(monkeypatch: pytest.MonkeyPatch, spec: KernelSpec, configs, cuda_version: str | None) -> None:
    entries = {}
    for config in configs:
        symbol = symbol_name(spec, "run", config)
        digest = prebuilt.current_digest(spec, config)
        archs = () if spec.target == "host" else (Arch(9, 0, "a"),)
        entries[symbol] = prebuilt.PrebuiltSymbol(symbol, spec.family, "run", config, spec.target, archs, (), digest)
    found = prebuilt.Manifest(Path("/nonexistent/lib.so"), cuda_version, tvm_ffi.__version__, "0", entries)
    monkeypatch.setattr(prebuilt, "manifest", lambda: found)
    monkeypatch.setattr(prebuilt, "problem", lambda: None)
    monkeypatch.delenv("JIT_KERNEL_DISABLE_PREBUILT", raising=False)


def test_list_calls_prebuilt_only_what_the_installed_library_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(tmp_path))
    spec = families.ADD_CONSTANT_HOST
    _install_manifest(monkeypatch, spec, [(1,)], None)  # the grid has 1, 2 and 3
    assert cli.main(["list", spec.family]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if f"{spec.family}<" in line]
    assert len(rows) == 3 and all(row.startswith("  grid ") for row in rows)
    assert "prebuilt (host)" in rows[0] and rows[0].endswith("-> prebuilt")
    for row in rows[1:]:
        assert "not in the installed library" in row and "prebuilt (" not in row
        assert row.endswith(
            "-> jit (not in the installed prebuilt library (its grid, when it was built, lacked this config))"
        )


def test_a_users_own_spec_is_not_said_to_be_outside_its_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel author's spec lists its grid, but the installed library holds only the package's
    families: the reason says so, rather than "not in the prebuilt grid"."""
    own = KernelSpec(
        "user_add", ("user_add.cuh",), ("n",), {"run": "user::Add<{args}>::run"}, {"n": IntRange(0, 9)}, ((1,),)
    )
    _install_manifest(monkeypatch, families.ADD_CONSTANT_CUDA, [(1,)], "13.0")
    here = target.Target(Arch(9, 0, "a"), 0, "Fake GPU", 132, False)
    assert (
        prebuilt.unusable_reason(own, (1,), here)
        == "not in the installed prebuilt library (it has no user_add kernels)"
    )
    assert prebuilt.unusable_reason(families.ADD_CONSTANT_CUDA, (5,), here) == "config not in the prebuilt grid"
    assert prebuilt.unusable_reason(families.ADD_CONSTANT_CUDA, (2,), here).startswith(
        "not in the installed prebuilt library (its grid"
    )
    _install_manifest(monkeypatch, families.ADD_CONSTANT_HOST, [(1,)], None)
    assert "built without CUDA" in prebuilt.unusable_reason(families.ADD_CONSTANT_CUDA, (1,), here)


def test_strict_mode_tells_a_kernel_author_how_to_fill_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, user_header: Path
) -> None:
    """``warm`` knows only the package's families: for a spec of one's own the advice is jit_module."""
    own = KernelSpec(
        "user_add",
        (str(user_header),),
        ("n",),
        {"run": "user::Add<{args}>::run"},
        {"n": IntRange(0, 9)},
        ((1,),),
        "host",
    )
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JIT_KERNEL_DISABLE_JIT", "1")
    with pytest.raises(JitDisabledError) as error:
        Dispatcher(own).function("run", (1,))
    message = str(error.value)
    assert "jit_module(spec, (1,))" in message and "python -m jit_kernel warm" not in message
    assert "families.py" not in message


# ---------------------------------------------------------------------------------------------
# Op names where families are asked for


def test_ops_map_to_the_families_they_launch() -> None:
    ops = cli.op_families()
    assert ops["silu_and_mul"] == (families.ACTIVATION,)
    assert ops["gelu_tanh_and_mul"] == (families.ACTIVATION,)
    assert ops["fused_add_rmsnorm"] == (families.RMSNORM,)
    assert ops["fused_inplace_qknorm"] == (families.QKNORM,)
    assert ops["silu_and_mul_per_token_group_quant_fp8"] == (families.PER_TOKEN_GROUP_QUANT_FP8,)
    assert ops["add_constant"] == (families.ADD_CONSTANT_HOST, families.ADD_CONSTANT_CUDA)
    assert ops["transfer_hicache_one_layer"] == (families.HICACHE, families.HICACHE_TMA)
    assert "load_jit" not in ops and "make_cpp_args" not in ops
    reached = {spec for specs in ops.values() for spec in specs}
    # Not top-level ops: hicache_pages' (reached through hicache's), the all-reduce's (methods of
    # jit_kernel.distributed.CustomAllReduce), the launch site (every eager call's kernel lookup).
    not_ops = {families.HICACHE_PAGES, families.CUSTOM_ALL_REDUCE, families.LAUNCH_SITE}
    assert reached >= set(families.ALL_FAMILIES) - not_ops
    assert families.LAUNCH_SITE not in reached


def test_list_and_warm_take_op_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "silu_and_mul"]) == 0
    out = capsys.readouterr().out
    assert "\nactivation (cuda; activation.cuh; params dtype; ops gelu_and_mul, gelu_tanh_and_mul, silu_and_mul)" in out
    assert "\nrmsnorm (" not in out
    with pytest.raises(SystemExit) as exited:
        cli.main(["warm", "transfer_hicache_one_layer", "--config", "1024,2,1024"])
    assert exited.value.code == 2
    assert "2 families (hicache, hicache_tma); with --config, name one of them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["warm", "silu_and_mull"])
    assert "unknown kernel family or op 'silu_and_mull'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# hidden=0


def test_the_generic_width_is_explained_where_it_is_met(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "rmsnorm", "--config", "0,bf16_t"]) == 0
    out = capsys.readouterr().out
    assert "  hidden=0: the generic kernel, which takes the width at run time" in out
    assert any(note.startswith("head_dim=0: the generic kernel") for note in families.QKNORM.value_notes())
    with pytest.raises(
        ConfigError, match=r"hidden must be one of 0, 1024, .*16384 \(0: the generic kernel, which takes"
    ):
        families.RMSNORM.check_config((3, "bf16_t"))
    with pytest.raises(ValueError, match="not one of the values"):
        OneOf((1, 2), notes={0: "absent"})


# ---------------------------------------------------------------------------------------------
# load_jit's wrappers


@pytest.mark.parametrize(
    ("wrappers", "message"),
    [
        (("run", "user::Add<5>::run"), r"got one pair .*pass \[\('run'"),
        (["run"], "pair of strings"),
        ([("run", "user::Add<5::run")], "an unclosed '<'"),
        ([("run", "user::Add<5>::run;")], "a ';' outside braces"),
        ([("run", "[](int x) { return x; ")], "an unclosed '{'"),
        ([("run", "user::Add<5>)::run")], r"an unmatched '\)'"),
        ([("run", "")], "it is empty"),
        ([("run", "user::Add<5>::run"), ("run", "user::Add<6>::run")], "'run' is given twice"),
        ([("r-un", "user::Add<5>::run")], "not a C identifier"),
    ],
)
def test_wrappers_of_an_impossible_shape_fail_before_any_compiler(
    wrappers: object, message: str, user_header: Path
) -> None:
    with pytest.raises(ValueError, match=message):
        make_build_request("user_add", cpp_files=[str(user_header)], cpp_wrappers=wrappers)  # type: ignore[arg-type]


def test_shapes_a_compiler_takes_pass_the_check(user_header: Path) -> None:
    for expression in (
        "user::Add<5>::run",
        "ns::f<(N > 4), 2>",
        "&ns::T<int[4]>::g",
        "ns::h<(a >> 1)>",
        "static_cast<int (*)(int)>(ns::k)",
        "[](int x) -> int { int y = x < 3; return y; }",
    ):
        make_build_request("user_add", cpp_files=[str(user_header)], cpp_wrappers=[("f", expression)])


def test_files_without_wrappers_are_an_error_not_an_empty_module(user_header: Path) -> None:
    with pytest.raises(ValueError, match=r"would export nothing.*header_only=False"):
        load_jit("user_add", cuda_files=[str(user_header)])


def test_a_misspelt_wrapper_is_one_short_error_naming_it_and_the_call(user_header: Path) -> None:
    with pytest.raises(builder.BuildError) as error:
        load_jit("user_add_typo", cpp_files=[str(user_header)], cpp_wrappers=[("run", "user::Add<5>::rnu")])
    message = str(error.value)
    assert "('run', 'user::Add<5>::rnu')" in message and "rnu" in message.splitlines()[1]
    assert f"load_jit was called at {__file__}:" in message
    assert len(message) < 600 and "main.cpp" not in message
    assert "main.cpp:" in error.value.compiler_output  # the whole output stays available


def test_nvcc_errors_on_a_wrapper_line_are_attributed_to_the_wrapper(user_header: Path) -> None:
    request = make_build_request(
        "user_add",
        cuda_files=[str(user_header)],
        cuda_wrappers=[("ok", "user::Add<1>::run"), ("run", "user::Add<5>::rnu")],
        cuda_arch="9.0a",
    )
    (unit,) = request.units
    line = next(n for n, text in enumerate(unit.text().splitlines(), 1) if "rnu" in text)
    output = f'cuda.cu({line}): error: class "user::Add<5>" has no member "rnu"\n  extern "C" ... 8 KB of it\n'
    short = builder.wrapper_failure(request, output * 3)
    assert short is not None and "1 wrapper(s) do not compile" in short
    assert "('run', 'user::Add<5>::rnu'): class \"user::Add<5>\" has no member \"rnu\"" in short
    in_header = f'{user_header}(3): error: expected a ";"\n' + output
    assert builder.wrapper_failure(request, in_header) is None  # the user's own line says it best
