"""One build contract: one Target per device, one TranslationUnit for JIT and the
prebuilt build, and a cache key that covers every file the compiler read."""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest
import tvm_ffi

from jit_helpers import fake_gpu, recorded_logs  # noqa: F401 (fake_gpu is a fixture)
from jit_kernel.engine import aot, builder, cache, families, jit, prebuilt, target
from jit_kernel.engine.dispatch import jit_request
from jit_kernel.engine.jit import make_build_request
from jit_kernel.engine.spec import IntRange, KernelSpec, symbol_name
from jit_kernel.engine.target import Arch
from jit_kernel.engine.unit import TranslationUnit

REPO = Path(__file__).resolve().parent.parent


# --- Target ---------------------------------------------------------------------------------------


def test_target_is_memoised_per_device_and_carries_sm_count_and_pdl(fake_gpu, monkeypatch) -> None:  # noqa: F811
    fake_gpu((9, 0))
    here = target.current()
    assert here is target.current()
    assert (str(here.arch), here.sm_count, here.pdl, here.arch_list) == ("9.0a", 132, True, "9.0a")
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "8.0")
    overridden = target.current()
    assert (str(overridden.arch), overridden.pdl, overridden.from_override) == ("8.0", False, True)
    assert overridden.sm_count == 132  # still the device's


def test_override_without_gpu_is_a_target(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(target, "_current_device", lambda: None)
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "10.0a")
    assert target.current().arch == Arch(10, 0, "a")
    assert target.current().device is None


def _fake_manifest(monkeypatch: pytest.MonkeyPatch, spec: KernelSpec, config: tuple, built_for: str, digest: str):
    entry = prebuilt.PrebuiltSymbol(
        symbol=symbol_name(spec, "run", config),
        family=spec.family,
        export="run",
        config=config,
        target=spec.target,
        machine_code=(Arch.parse(built_for),),
        ptx=(),
        unit_digest=digest,
    )
    found = prebuilt.Manifest(Path("/nonexistent/lib.so"), "13.0", tvm_ffi.__version__, "0", {entry.symbol: entry})
    monkeypatch.setattr(prebuilt, "manifest", lambda: found)
    monkeypatch.setattr(prebuilt, "problem", lambda: None)
    monkeypatch.delenv("JIT_KERNEL_DISABLE_PREBUILT", raising=False)


def test_override_changes_the_prebuilt_decision(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    spec = families.ADD_CONSTANT_CUDA
    _fake_manifest(monkeypatch, spec, (1,), "8.0", prebuilt.current_digest(spec, (1,)))
    fake_gpu((8, 0))
    assert prebuilt.unusable_reason(spec, (1,), target.current()) is None
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    reason = prebuilt.unusable_reason(spec, (1,), target.current())
    assert reason is not None and "sm_90a (JIT_KERNEL_CUDA_ARCH)" in reason


def test_prebuilt_of_another_unit_is_not_used(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    spec = families.ADD_CONSTANT_CUDA
    _fake_manifest(monkeypatch, spec, (1,), "8.0", "0" * 24)
    fake_gpu((8, 0))
    reason = prebuilt.unusable_reason(spec, (1,), target.current())
    assert reason is not None and "another translation unit" in reason


# --- TranslationUnit: one description, rendered for JIT and for CMake ------------------------------


def _cmake_unquote(argument: str) -> list[str]:
    words = re.split(r"(?<!\\);", argument)
    return [re.sub(r"\\(.)", r"\1", word) for word in words]


def _generated_options(sources_cmake: Path) -> dict[Path, list[str]]:
    pattern = re.compile(r'^set_source_files_properties\("([^"]+)" PROPERTIES COMPILE_OPTIONS "((?:\\.|[^"\\])*)"\)$')
    options = {}
    for line in sources_cmake.read_text().splitlines():
        match = pattern.match(line)
        if match:
            options[Path(match.group(1))] = _cmake_unquote(match.group(2))
    return options


@pytest.mark.parametrize("jobs", [2, 64])
def test_generated_cmake_inputs_equal_the_jit_description_for_every_grid_entry(tmp_path: Path, jobs: int) -> None:
    """Every config's JIT unit is in the generated unit that exports it: the same lines, compile
    options and digest. With 64 jobs each family is a unit of its own; with 2, families merge into 4
    units (unit_groups)."""
    manifest = aot.generate(tmp_path, "9.0a", "13.0", tvm_ffi.__version__, jobs=jobs)
    options = _generated_options(tmp_path / "sources.cmake")
    symbols = manifest["symbols"]
    assert isinstance(symbols, dict)
    texts = {path: path.read_text().splitlines() for path in options}
    exporter = {
        line.split("(", 1)[1].split(",", 1)[0]: path
        for path, lines in texts.items()
        for line in lines
        if line.startswith("TVM_FFI_DLL_EXPORT_TYPED_FUNC(")
    }
    cuda_units = [path for path in options if path.parent.name == "cuda"]
    families_with_grid = [spec for spec in families.ALL_FAMILIES if spec.prebuilt and spec.target == "cuda"]
    assert len(cuda_units) == (len(families_with_grid) if jobs == 64 else 4)
    checked = 0
    for spec in families.ALL_FAMILIES:
        for config in spec.prebuilt:
            (jit_unit,) = jit_request(spec, config, "9.0a").units
            (path,) = {exporter[symbol] for symbol, _ in jit_unit.exports}  # one unit holds the config
            assert options[path] == list(jit_unit.compile_args())
            assert all(line in texts[path] for line in jit_unit.text().splitlines())
            for symbol, expression in jit_unit.exports:
                assert symbols.pop(symbol)["unit_digest"] == jit_unit.digest()
                assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({symbol}, (::host::ffi_export({expression})));" in texts[path]
                del exporter[symbol]
            checked += 1
    assert checked == sum(len(spec.prebuilt) for spec in families.ALL_FAMILIES) > 40
    assert not exporter and not symbols  # nothing generated that JIT does not describe


def test_unit_groups_keep_each_family_whole() -> None:
    units = [
        (spec.family, TranslationUnit.for_config(spec, spec.prebuilt[0]))
        for spec in families.ALL_FAMILIES
        if spec.prebuilt and spec.target == "cuda"
    ]
    assert aot.unit_groups(units, len(units)) == [[unit] for unit in units]  # enough jobs: one unit per family
    groups = aot.unit_groups(units, 2)
    assert len(groups) == 4 and sorted(f for group in groups for f, _ in group) == sorted(f for f, _ in units)
    for group in groups:  # the declared order within a group, so the generated text is stable
        assert [f for f, _ in group] == [f for f, _ in units if any(f == g for g, _ in group)]
    merged = TranslationUnit.merge([unit for _, unit in groups[0]])
    assert merged.exports == tuple(e for _, unit in groups[0] for e in unit.exports)
    assert len(set(merged.sources)) == len(merged.sources)
    host = TranslationUnit.for_config(families.ADD_CONSTANT_HOST, families.ADD_CONSTANT_HOST.prebuilt[0])
    with pytest.raises(ValueError, match="same flags and include folders"):
        TranslationUnit.merge([units[0][1], host])


def test_generate_removes_the_units_of_an_earlier_grouping(tmp_path: Path) -> None:
    aot.generate(tmp_path, "9.0a", "13.0", tvm_ffi.__version__, jobs=64)
    aot.generate(tmp_path, "9.0a", "13.0", tvm_ffi.__version__, jobs=2)
    listed = set(_generated_options(tmp_path / "sources.cmake"))
    on_disk = {*(tmp_path / "cuda").iterdir(), *(tmp_path / "host").iterdir()}
    assert listed == on_disk and sum(path.parent.name == "cuda" for path in on_disk) == 4


def test_only_units_of_the_same_sources_and_flags_combine() -> None:
    spec = families.ADD_CONSTANT_CUDA
    one, two = (TranslationUnit.for_config(spec, config) for config in spec.prebuilt[:2])
    combined = TranslationUnit.combine([one, two])
    assert combined.exports == one.exports + two.exports
    assert combined.text().startswith(one.text().rsplit("TVM_FFI_DLL_EXPORT_TYPED_FUNC", 1)[0])
    other = TranslationUnit.for_config(families.ADD_CONSTANT_HOST, families.ADD_CONSTANT_HOST.prebuilt[0])
    with pytest.raises(ValueError, match="same sources, flags and include folders"):
        TranslationUnit.combine([one, other])
    with pytest.raises(ValueError, match="no translation unit"):
        TranslationUnit.combine([])


def test_a_flag_only_the_prebuilt_build_would_use_is_impossible(tmp_path: Path, monkeypatch) -> None:
    """CMakeLists.txt adds no compile flag or include folder of its own; a spec's extra flag reaches
    both builds, and changes the digest the dispatcher compares."""
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert "target_include_directories" not in cmake
    assert re.findall(r"target_compile_options\([^)]*\)", cmake) == [
        "target_compile_options(jit_kernel_prebuilt PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${JIT_KERNEL_AOT_CUDA_FLAGS}>)"
    ]
    assert not re.search(r"(?<![\w-])-O[0-3s]|expt-relaxed|-std=", cmake)
    base = families.ADD_CONSTANT_CUDA
    flagged = KernelSpec(
        family="flagged",
        sources=base.sources,
        params=base.params,
        exports=base.exports,
        domains={"constant": IntRange(-8, 8)},
        prebuilt=((1,),),
        extra_cuda_cflags=("-DJIT_KERNEL_ONLY_HERE=1",),
    )
    monkeypatch.setattr(aot, "ALL_FAMILIES", (flagged,))
    aot.generate(tmp_path, "9.0a", "13.0", tvm_ffi.__version__)
    (generated,) = _generated_options(tmp_path / "sources.cmake").values()
    (jit_unit,) = jit_request(flagged, (1,), "9.0a").units
    assert "-DJIT_KERNEL_ONLY_HERE=1" in generated and generated == list(jit_unit.compile_args())
    assert jit_unit.digest() != TranslationUnit.for_config(base, (1,)).digest()


def test_the_prebuilt_builds_own_nvcc_flags_choose_archs_and_packaging_only(tmp_path: Path) -> None:
    """The flags only CMake passes (JIT_KERNEL_AOT_CUDA_FLAGS) pick the archs, compile them in parallel
    and compress the fatbin: none changes what a unit's code compiles to."""
    aot.generate(tmp_path, "8.0;9.0a;12.0+PTX", "13.0", tvm_ffi.__version__, compress=True)
    match = re.search(r'^set\(JIT_KERNEL_AOT_CUDA_FLAGS "([^"]*)"\)$', (tmp_path / "sources.cmake").read_text(), re.M)
    assert match is not None
    assert _cmake_unquote(match.group(1)) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_120,code=[sm_120,compute_120]",
        "--threads=0",
        "-Xfatbin=-compress-all",
    ]


def test_unit_digest_does_not_depend_on_where_the_package_lives(tmp_path: Path, monkeypatch) -> None:
    """CMake builds from the source tree, the wheel installs elsewhere: the digests must agree."""
    import shutil

    from jit_kernel.engine import env, unit

    spec = families.ADD_CONSTANT_HOST
    here = TranslationUnit.for_config(spec, (1,)).digest()
    for folder in ("include", "csrc"):
        shutil.copytree(env.DATA_ROOT / folder, tmp_path / folder)
    monkeypatch.setattr(env, "DATA_ROOT", tmp_path)
    monkeypatch.setattr(env, "INCLUDE_DIR", tmp_path / "include")
    monkeypatch.setattr(env, "CSRC_DIR", tmp_path / "csrc")
    monkeypatch.setattr(unit, "_closure_digest", functools.cache(unit._closure_digest.__wrapped__))
    moved = TranslationUnit.for_config(spec, (1,))
    assert str(tmp_path) in moved.text() and moved.digest() == here
    (tmp_path / "include" / "sgl_kernel" / "utils.h").write_text("// edited\n")
    monkeypatch.setattr(unit, "_closure_digest", functools.cache(unit._closure_digest.__wrapped__))
    assert TranslationUnit.for_config(spec, (1,)).digest() != here


# --- The closure digest's on-disk memo --------------------------------------------------------------


def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a new process starts with: no per-process memo of digests or of the memo file."""
    from jit_kernel.engine import unit

    monkeypatch.setattr(unit, "_closure_digest", functools.cache(unit._closure_digest.__wrapped__))
    monkeypatch.setattr(unit, "_closure_memo", functools.cache(unit._closure_memo.__wrapped__))


def _closure_folder(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A source that includes "x.h" (found in the include folder) and <sub/y.h>."""
    src, inc = tmp_path / "src", tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    src.mkdir()
    (inc / "x.h").write_text("#pragma once\nconstexpr int kX = 1;\n")
    (inc / "sub" / "y.h").write_text("#pragma once\nconstexpr int kY = 2;\n")
    source = src / "k.cuh"
    source.write_text('#include "x.h"\n#include <sub/y.h>\n')
    return source, src, inc


def test_closure_memo_agrees_with_a_fresh_walk_and_sees_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jit_kernel.engine import unit

    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    source, src, inc = _closure_folder(tmp_path)

    def digest() -> str:
        _fresh_process(monkeypatch)
        return unit._closure_digest((source,), (inc,))

    walked = unit._walk_closure((source,), (inc,))[0]
    first = digest()
    assert first == walked and (tmp_path / "cache" / "closure-digests.json").is_file()

    def forbidden(path: Path) -> bytes:
        raise AssertionError(f"a memo hit read {path}")

    with monkeypatch.context() as m:
        m.setattr(Path, "read_bytes", forbidden)
        assert digest() == first  # another process, nothing changed: no file read

    (inc / "sub" / "y.h").write_text("#pragma once\nconstexpr int kY = 3;\n")  # an included header edited
    edited = digest()
    assert edited != first and edited == unit._walk_closure((source,), (inc,))[0]

    (src / "x.h").write_text("#pragma once\nconstexpr int kX = 9;\n")  # a new header that takes "x.h"
    shadowed = digest()
    assert shadowed not in (first, edited) and shadowed == unit._walk_closure((source,), (inc,))[0]

    (src / "sub").mkdir()  # beside the source: not where <sub/y.h> is looked up, the same digest
    (src / "sub" / "y.h").write_text("#pragma once\n")
    assert digest() == shadowed


def test_closure_memo_damaged_or_unwritable_is_only_slower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.engine import unit

    source, _, inc = _closure_folder(tmp_path)
    expected = unit._walk_closure((source,), (inc,))[0]
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(cache_dir))
    key = json.dumps([[str(source)], [str(inc)]])
    entries = ({"paths": 5}, {"paths": [], "stamps": [], "digest": "0"}, {"digest": 1, "paths": ["a"], "stamps": ["b"]})
    for damaged in ("{not json", "[1, 2]", '{"k": 5}', *(json.dumps({key: e}) for e in entries)):
        (cache_dir / "closure-digests.json").write_text(damaged)
        _fresh_process(monkeypatch)
        assert unit._closure_digest((source,), (inc,)) == expected
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(blocked))
    _fresh_process(monkeypatch)
    assert unit._closure_digest((source,), (inc,)) == expected


# --- The cache key covers every file the compiler read -------------------------------------------


def _write_hidden_kernel(folder: Path) -> None:
    """A header reached only through an ``-I`` in extra_cflags, and one through ``#include MACRO``."""
    (folder / "hidden").mkdir(parents=True, exist_ok=True)
    (folder / "hidden" / "h.h").write_text("#pragma once\nconstexpr int kHidden = 10;\n")
    (folder / "macro.h").write_text("#pragma once\nconstexpr int kMacro = 1;\n")
    (folder / "kernel.cc").write_text(
        '#define MACRO_HEADER "macro.h"\n#include MACRO_HEADER\n#include <hidden/h.h>\n'
        "namespace user { inline int value() { return kHidden + kMacro; } }\n"
    )


def _hidden_request(folder: Path) -> cache.BuildRequest:
    return make_build_request(
        "hidden_headers",
        cpp_files=[str(folder / "kernel.cc")],
        cpp_wrappers=[("value", "user::value")],
        extra_cflags=[f"-I{folder}"],
    )


@pytest.mark.parametrize(("edited", "before", "after", "expected"), [
    ("hidden/h.h", "= 10;", "= 20;", 21),
    ("macro.h", "= 1;", "= 5;", 15),
])  # fmt: skip
def test_headers_reached_through_flags_or_macros_rebuild(
    tmp_path: Path, edited: str, before: str, after: str, expected: int
) -> None:
    folder, root = tmp_path / "src", tmp_path / "cache"
    _write_hidden_kernel(folder)
    assert cache.load_or_build(_hidden_request(folder), root).value() == 11
    header = folder / edited
    header.write_text(header.read_text().replace(before, after))
    (stale,) = cache.list_entries(root)
    assert not stale.valid and stale.state == f"STALE ({header} changed)"
    with recorded_logs() as logs:
        assert cache.load_or_build(_hidden_request(folder), root).value() == expected
        assert cache.load_or_build(_hidden_request(folder), root).value() == expected
    assert len(logs.compiles()) == 1
    assert [m for m in logs.messages if m.endswith("rebuilding it")] == [
        f"{header} changed since {stale.path.name} was built; rebuilding it"
    ]
    header.touch()  # a new mtime, the same content: no rebuild
    with recorded_logs() as logs:
        assert cache.load_or_build(_hidden_request(folder), root).value() == expected
    assert not logs.compiles()


def test_warm_hit_runs_no_subprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, root = tmp_path / "src", tmp_path / "cache"
    _write_hidden_kernel(folder)
    cache.load_or_build(_hidden_request(folder), root)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a warm hit started a subprocess: {args}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(jit, "_loaded", {})
    assert jit.load_request(_hidden_request(folder), root).value() == 11


def test_depfile_parsing(tmp_path: Path) -> None:
    """Escaped spaces and continuations; ``$`` doubled (g++) or not (nvcc)."""
    for name in ("with space.h", "g$x.h", "nv$$y.h"):
        (tmp_path / name).write_text("")
    depfile = tmp_path / "main.o.d"
    depfile.write_text(f"main.o: main.cpp {tmp_path}/with\\ space.h \\\n {tmp_path}/g$$x.h\n  {tmp_path}/nv$$y.h\n")
    assert builder.depfile_inputs(depfile) == [
        tmp_path / "main.cpp",
        tmp_path / "with space.h",
        tmp_path / "g$x.h",
        tmp_path / "nv$$y.h",
    ]
