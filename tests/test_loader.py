"""load_jit: file resolution, wrappers, the in-process cache, and errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jit_kernel
from jit_helpers import recorded_logs, write_host_kernel
from jit_kernel import load_jit, make_cpp_args
from jit_kernel.engine import env
from jit_kernel.engine.jit import make_build_request


def test_user_kernel_in_own_folder_builds_and_runs(tmp_path: Path) -> None:
    source = write_host_kernel(tmp_path, value=5)
    args = make_cpp_args(3)
    module = load_jit(
        "user_kernel",
        *args,
        cpp_files=[str(source)],
        cpp_wrappers=[("value", "user::value"), ("add", f"user::add<{args}>")],
        extra_include_paths=[str(tmp_path)],
    )
    assert module.value() == 105
    assert module.add(4) == 7


def test_runtime_check_in_user_code_raises_with_file_and_line(tmp_path: Path) -> None:
    source = write_host_kernel(tmp_path)
    module = load_jit(
        "user_kernel_check",
        cpp_files=[str(source)],
        cpp_wrappers=[("add", "user::add<1>")],
        extra_include_paths=[str(tmp_path)],
    )
    with pytest.raises(ValueError, match=r"kernel\.cc:5.*x must be >= 0, got -2"):
        module.add(-2)


def test_in_process_cache_returns_the_same_module(tmp_path: Path) -> None:
    source = write_host_kernel(tmp_path)
    kwargs = {"cpp_files": [str(source)], "cpp_wrappers": [("value", "user::value")],
              "extra_include_paths": [str(tmp_path)]}  # fmt: skip
    first = load_jit("same_module", **kwargs)  # type: ignore[arg-type]
    with recorded_logs() as logs:
        second = load_jit("same_module", **kwargs)  # type: ignore[arg-type]
    assert first is second
    assert logs.compiles() == []


def test_relative_names_resolve_under_package_csrc() -> None:
    module = load_jit(
        "add_constant_host_test",
        cpp_files=["add_constant.h"],
        cpp_wrappers=[("run", "jit_kernel::add_constant::run_host<5>")],
    )
    src = torch.arange(10, dtype=torch.int32)
    out = torch.empty_like(src)
    module.run(out, src)
    assert torch.equal(out, src + 5)
    assert (env.CSRC_DIR / "add_constant.h").is_file()


def test_build_directory_replaces_cache_root(tmp_path: Path) -> None:
    source = write_host_kernel(tmp_path / "src")
    module = load_jit(
        "own_build_dir",
        cpp_files=[str(source)],
        cpp_wrappers=[("value", "user::value")],
        extra_include_paths=[str(tmp_path / "src")],
        build_directory=str(tmp_path / "build"),
    )
    assert module.value() == 101
    assert list((tmp_path / "build").glob("jit_kernel_own_build_dir-*/jit_kernel_own_build_dir.*.so"))


def test_missing_source_names_the_file_and_the_lookup_folder() -> None:
    with pytest.raises(FileNotFoundError, match=r"no_such_kernel\.cuh.*csrc"):
        load_jit("missing", cuda_files=["no_such_kernel.cuh"], cuda_wrappers=[("f", "f")])


def test_compile_error_reports_compiler_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.cc"
    bad.write_text("int broken( { return 0; }\n")
    with pytest.raises(RuntimeError, match=r"bad\.cc:1"):
        load_jit("broken", cpp_files=[str(bad)], cpp_wrappers=[("f", "broken")])


def test_bad_export_name_and_empty_request_are_rejected() -> None:
    with pytest.raises(ValueError, match="not a C identifier"):
        load_jit("x", cpp_wrappers=[("bad-name", "f")])
    with pytest.raises(ValueError, match="at least one"):
        load_jit("x")


def test_module_names_are_sanitised_and_bounded() -> None:
    request = make_build_request("hicache", *make_cpp_args(1024, 2, True), cpp_wrappers=[("f", "f")])
    assert request.name == "jit_kernel_hicache_1024_2_true"
    long_request = make_build_request(*(["x" * 30] * 10), cpp_wrappers=[("f", "f")])
    assert len(long_request.name) <= 96


def test_top_level_exports() -> None:
    assert {"load_jit", "cache_once", "make_cpp_args"} <= set(jit_kernel.__all__)
    assert jit_kernel.__version__
