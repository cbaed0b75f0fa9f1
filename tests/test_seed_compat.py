"""Code written against the seed's API (``sglang.jit_kernel`` 0.5.12 / 0.5.16) runs with only
the package prefix changed. The seed's module paths, names and signatures (CPU), the
module/function name clash of ``add_constant`` / ``scale`` / ``per_tensor_quant_fp8`` in every import
form (fresh interpreters where order matters), the argument mapping of every seed wrapper onto
the one implementation (CPU, with the op recorded), and the seed's in-place semantics on the GPU.
The seed's documented usage is ported too: the dev guide's ``add_constant`` example and the
tutorial's ``scale`` kernel built from a user's own folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import jit_kernel
import jit_kernel.ops.hicache
import jit_kernel.ops.norm
import jit_kernel.ops.quant
from _norm_helpers import assert_close, fake_cuda

TESTS = Path(__file__).resolve().parent
TUTORIAL_SCALE_CUH = TESTS / "cpp" / "seeds" / "scale.cuh"
USER_SCALE_WRAPPER = TESTS / "compat_user_kernel" / "scale_op.py"


# ---------------------------------------------------------------------------------------------
# The seed's names and signatures, as released (0.5.12, plus what 0.5.16 added). Each entry:
# module, name, the seed's parameter list, parameters we add (each with a default, so every seed
# call binds the same way), and seed-required keywords we take under a second spelling too
# (default None here, still required: checked at call time).

SEED_API: list[tuple[str, str, str, set[str], set[str]]] = [
    ("utils", "cache_once", "fn", set(), set()),
    ("utils", "make_cpp_args", "*args", set(), set()),
    (
        "utils",
        "load_jit",
        "*args, cpp_files=None, cuda_files=None, cpp_wrappers=None, cuda_wrappers=None, extra_cflags=None, "
        "extra_cuda_cflags=None, extra_ldflags=None, extra_include_paths=None, extra_dependencies=None, "
        "build_directory=None, header_only=True",
        set(),
        set(),
    ),
    ("utils", "get_ci_test_range", "full_range, ci_range", set(), set()),
    ("utils", "should_run_full_tests", "", set(), set()),
    ("utils", "is_hip_runtime", "", set(), set()),
    ("utils", "is_musa_runtime", "", set(), set()),
    ("utils", "get_jit_cuda_arch", "", set(), set()),
    ("utils", "override_jit_cuda_arch", "major, minor, suffix=''", set(), set()),
    ("utils", "is_arch_support_pdl", "", set(), set()),
    ("utils", "register_dependency", "name", set(), set()),
    ("utils", "empty_sentinel", "device, dtype", set(), set()),
    ("utils", "lazy_register_class", "name, init_fn", set(), set()),
    ("add_constant", "add_constant", "src, constant", {"out"}, set()),
    ("scale", "scale", "src, factor, out=None", set(), set()),
    ("norm", "rmsnorm", "input, weight, out=None, eps=1e-6", set(), set()),
    (
        "norm",
        "fused_add_rmsnorm",
        "input, residual, weight, eps=1e-6, *, cast_x_before_out_mul=False",
        set(),
        set(),
    ),
    ("norm", "fused_inplace_qknorm", "q, k, q_weight, k_weight, eps=1e-6, *, head_dim=0", set(), set()),
    ("norm", "fused_inplace_qknorm_across_heads", "q, k, q_weight, k_weight, eps=1e-6", set(), set()),
    ("norm", "can_use_fused_inplace_qknorm", "head_dim, dtype", set(), set()),
    ("norm", "is_supported_jit_fused_add_rmsnorm_hidden_size", "hidden_size", set(), set()),
    ("per_tensor_quant_fp8", "per_tensor_quant_fp8", "input, output_q, output_s, is_static=False", set(), set()),
    ("per_tensor_quant_fp8", "per_tensor_absmax_fp8", "input, output_s", set(), set()),
    # page_size: SGLang 0.5.23's (tests/test_hicache.py checks its later hicache API).
    ("hicache", "can_use_hicache_jit_kernel", "*, element_size, unroll=None, block_quota=None", {"page_size"}, set()),
    (
        "hicache",
        "transfer_hicache_one_layer",
        "k_cache_dst, v_cache_dst, indices_dst, k_cache_src, v_cache_src, indices_src, *, element_dim=None, "
        "unroll=None, block_quota=None",
        {"page_size"},
        set(),
    ),
    (
        "hicache",
        "transfer_hicache_all_layer",
        "k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src, *, kv_cache_src_stride_bytes, "
        "kv_cache_dst_stride_bytes, element_size=None, unroll=None, block_quota=None",
        {"page_size"},
        set(),
    ),
    (
        "hicache",
        "transfer_hicache_one_layer_mla",
        "cache_dst, indices_dst, cache_src, indices_src, *, element_dim=None, unroll=None, block_quota=None",
        {"page_size"},
        set(),
    ),
    (
        "hicache",
        "transfer_hicache_all_layer_mla",
        "ptr_dst, indices_dst, ptr_src, indices_src, *, cache_src_stride_bytes, cache_dst_stride_bytes, "
        "element_size=None, unroll=None, block_quota=None",
        {"kv_cache_src_stride_bytes", "kv_cache_dst_stride_bytes", "page_size"},
        {"cache_src_stride_bytes", "cache_dst_stride_bytes"},
    ),
    # 0.5.16's staged write-back
    ("hicache", "can_use_write_back_jit_kernel", "*, element_size, unroll=None, block_quota=None", set(), set()),
    (
        "hicache",
        "transfer_hicache_all_layer_staged_lf_pf",
        "k_ptr_src, v_ptr_src, src_indices, dst_indices, staging_k, staging_v, dst_k, dst_v, *, page_size, "
        "element_size=None, unroll=None, block_quota=None",
        {"staged_copies"},
        set(),
    ),
    (
        "hicache",
        "transfer_hicache_all_layer_mla_staged_lf_pf",
        "ptr_src, src_indices, dst_indices, staging, dst, *, page_size, element_size=None, unroll=None, "
        "block_quota=None",
        {"staged_copies"},
        set(),
    ),
    ("cuda_wait_value", "stream_wait_value", "flag, value", set(), set()),
    ("cuda_wait_value", "Event", "", {"device"}, set()),
    ("cuda_wait_value", "Event.record", "self, value=1", set(), set()),
    ("cuda_wait_value", "Event.wait", "self, value=1", {"timeout"}, set()),
    ("benchmark.utils", "is_in_ci", "", set(), set()),
    ("benchmark.utils", "get_benchmark_range", "full_range, ci_range", set(), set()),
    ("benchmark.utils", "run_benchmark", "fn, quantiles=(), scale=1.0", {"use_cuda_graph", "rep_ms"}, set()),
    ("benchmark.utils", "run_benchmark_no_cudagraph", "fn, quantiles=(), scale=1.0", set(), set()),
    (
        "benchmark.utils",
        "multigpu_bench_main",
        "name, file, num_gpus, main_fn, *, pre_launch_fn=None, timeout=None",
        set(),
        set(),
    ),
    (
        "benchmark.utils",
        "create_empty",
        "*shape, dtype=torch.bfloat16, device='cuda'",
        set(),
        set(),
    ),
    (
        "benchmark.utils",
        "create_random",
        "*shape, dtype=torch.bfloat16, device='cuda'",
        set(),
        set(),
    ),
]


def _seed_signature(params: str) -> inspect.Signature:
    namespace: dict[str, Any] = {"torch": torch}
    exec(f"def seed({params}): pass", namespace)
    return inspect.signature(namespace["seed"])


def _resolve(module: str, name: str) -> Any:
    obj: Any = importlib.import_module(f"jit_kernel.{module}")
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(
    ("module", "name", "seed", "extras", "required_at_call"), SEED_API, ids=[f"{m}.{n}" for m, n, *_ in SEED_API]
)
def test_seed_signature(module: str, name: str, seed: str, extras: set[str], required_at_call: set[str]) -> None:
    """Every call the seed's signature accepts binds to the same parameters here."""
    ours = inspect.signature(_resolve(module, name)).parameters
    theirs = _seed_signature(seed).parameters
    P = inspect.Parameter
    # Positional parameters (and *args): same names, order, kinds and defaults, as a prefix.
    positional = [p for p in theirs.values() if p.kind in (P.POSITIONAL_OR_KEYWORD, P.VAR_POSITIONAL)]
    ours_list = list(ours.values())
    assert [(p.name, p.kind, p.default) for p in ours_list[: len(positional)]] == [
        (p.name, p.kind, p.default) for p in positional
    ]
    for p in theirs.values():
        if p.kind == P.KEYWORD_ONLY:
            assert p.name in ours, f"missing keyword {p.name}"
            assert ours[p.name].kind == P.KEYWORD_ONLY, p.name
            expected = None if p.name in required_at_call else p.default
            assert ours[p.name].default == expected, p.name
    added = {n for n in ours if n not in theirs}
    assert added == extras
    for n in added:
        assert ours[n].default is not P.empty or ours[n].kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD), n


SEED_MODULE_NAMES = {
    "utils": [
        "CPPArgList",
        "KERNEL_PATH",
        "DEFAULT_INCLUDE",
        "DEFAULT_CFLAGS",
        "DEFAULT_LDFLAGS",
        "CPP_DTYPE_MAP",
        "CPP_TEMPLATE_TYPE",
        "ArchInfo",
    ],
    "hicache": ["DEFAULT_BLOCK_QUOTA"],
    "benchmark.utils": ["DEFAULT_DTYPE", "DEFAULT_DEVICE", "DEFAULT_QUANTILES"],
}


@pytest.mark.parametrize("module", sorted({m for m, *_ in SEED_API} | set(SEED_MODULE_NAMES)))
def test_seed_module_exports(module: str) -> None:
    mod = importlib.import_module(f"jit_kernel.{module}")
    names = {n.split(".")[0] for m, n, *_ in SEED_API if m == module} | set(SEED_MODULE_NAMES.get(module, ()))
    assert not [n for n in names if not hasattr(mod, n)]
    if hasattr(mod, "__all__"):
        assert names <= set(mod.__all__) | set(SEED_MODULE_NAMES.get(module, ()))


def test_constants_and_shared_objects() -> None:
    from jit_kernel import utils
    from jit_kernel.benchmark import utils as bench
    from jit_kernel.cuda_wait_value import Event, stream_wait_value
    from jit_kernel.ops import stream_wait

    assert bench.DEFAULT_QUANTILES == [0.5, 0.2, 0.8]
    assert bench.DEFAULT_DTYPE is torch.bfloat16 and bench.DEFAULT_DEVICE == "cuda"
    assert (utils.KERNEL_PATH / "include" / "sgl_kernel").is_dir() and (utils.KERNEL_PATH / "csrc").is_dir()
    assert [str(jit_kernel.engine.env.INCLUDE_DIR)] == utils.DEFAULT_INCLUDE
    assert utils.DEFAULT_CFLAGS == ["-std=c++20", "-O3"]
    assert utils.CPP_DTYPE_MAP[torch.float32] == "fp32_t" and utils.CPP_DTYPE_MAP[torch.float8_e4m3fn] == "fp8_e4m3_t"
    # One implementation: the seed modules hand out the package's own objects.
    assert utils.load_jit is jit_kernel.load_jit and utils.cache_once is jit_kernel.cache_once
    assert Event is stream_wait.Event and stream_wait_value is stream_wait.stream_wait_value
    from jit_kernel import hicache

    assert hicache.transfer_hicache_one_layer is jit_kernel.transfer_hicache_one_layer
    assert hicache.can_use_hicache_jit_kernel is jit_kernel.can_use_hicache_jit_kernel


# ---------------------------------------------------------------------------------------------
# The name clash: jit_kernel.add_constant / .scale / .per_tensor_quant_fp8 are our ops and modules.

CLASH = {
    "add_constant": jit_kernel.ops.add_constant.add_constant,
    "scale": jit_kernel.ops.scale.scale,
    "per_tensor_quant_fp8": jit_kernel.ops.quant.per_tensor_quant_fp8,
}


def _check_clash_forms() -> None:
    """Every form works, whatever was imported first. Runs in this process and in fresh ones."""
    x = torch.arange(10, dtype=torch.int32)
    for name, op in CLASH.items():
        module = sys.modules[f"jit_kernel.{name}"]
        assert isinstance(module, types.ModuleType)
        assert importlib.import_module(f"jit_kernel.{name}") is module
        top = getattr(jit_kernel, name)
        forms: dict[str, Any] = {}
        exec(f"from jit_kernel import {name} as a\nimport jit_kernel.{name} as b", forms)
        exec(f"from jit_kernel.{name} import {name} as c", forms)
        assert forms["a"] is top and forms["b"] is top
        assert callable(top) and top.__code__ is op.__code__  # calling it runs our top-level op
        assert forms["c"] is module.__dict__[name] is getattr(top, name)  # the seed's function
        for public in module.__all__:
            assert getattr(top, public) is getattr(module, public)
    # add_constant: the seed's function is ours; every form computes src + constant (CPU host kernel).
    expected = x + 1
    for form in (
        jit_kernel.add_constant,
        jit_kernel.add_constant.add_constant,
        sys.modules["jit_kernel.add_constant"].add_constant,
    ):
        assert torch.equal(form(x, 1), expected)
    # per_tensor_quant_fp8: the top-level op allocates its outputs; the seed's function requires them.
    # A CPU tensor reaches the kernel's C++ device check (built for sm_90 where there is no GPU).
    if not torch.cuda.is_available():
        os.environ.setdefault("JIT_KERNEL_CUDA_ARCH", "9.0")
    with pytest.raises(ValueError, match="expected cuda but got cpu"):
        jit_kernel.per_tensor_quant_fp8(torch.ones(4))
    with pytest.raises(TypeError):
        jit_kernel.per_tensor_quant_fp8.per_tensor_quant_fp8(torch.ones(4))  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="expected cuda but got cpu"):
        jit_kernel.scale.scale(torch.ones(4), 2.0)


def test_clash_forms_in_this_process() -> None:
    _check_clash_forms()


@pytest.mark.parametrize(
    "first",
    [
        "import jit_kernel.add_constant as m1, jit_kernel.scale as m2, jit_kernel.per_tensor_quant_fp8 as m3",
        "from jit_kernel.scale import scale\n"
        "from jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8\n"
        "from jit_kernel.add_constant import add_constant",
        "import importlib; importlib.import_module('jit_kernel.per_tensor_quant_fp8')",
    ],
    ids=["import-submodule-as", "from-submodule-import", "importlib"],
)
def test_clash_forms_when_a_submodule_is_imported_first(first: str) -> None:
    """A fresh interpreter whose first import is a seed submodule (the package attribute must still be the op)."""
    check = "import test_seed_compat\ntest_seed_compat._check_clash_forms()"
    script = f"{first}\nimport sys\nsys.path.insert(0, {str(TESTS)!r})\n{check}\nprint('ok')\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


class _Stop(Exception):
    pass


def _trace(fn: Callable[..., object], make_args: Callable[[], tuple[torch.Tensor, ...]]) -> list[object]:
    """The ops in the one graph torch.compile(fullgraph=True) captures, for fake CUDA inputs
    (nothing runs; the fake implementations check the arguments as the ops do)."""
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        raise _Stop

    torch._dynamo.reset()
    with fake_cuda(), pytest.raises(Exception) as caught:
        torch.compile(fn, fullgraph=True, backend=backend)(*make_args())
    assert graphs, caught.value  # a graph break (fullgraph) fails before the backend sees a graph
    return [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]


def test_clashing_names_trace_under_torch_compile_fullgraph() -> None:
    def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = jit_kernel.scale(x, 0.5)
        q, s = jit_kernel.per_tensor_quant_fp8(y)
        return q, s

    ops = _trace(model, lambda: (torch.empty(4, 64, device="cuda"),))
    assert torch.ops.jit_kernel.scale in ops and torch.ops.jit_kernel.per_tensor_quant_fp8 in ops


def test_seed_forms_trace_under_torch_compile_fullgraph() -> None:
    from jit_kernel.norm import fused_add_rmsnorm, fused_inplace_qknorm, rmsnorm
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8

    def model(x, r, w, q, k, qw, out_q, out_s):
        fused_add_rmsnorm(x, r, w)
        rmsnorm(x, w)  # in place
        fused_inplace_qknorm(q, k, qw, qw, head_dim=q.shape[-1])
        per_tensor_quant_fp8(x, out_q, out_s)
        return x

    def make_args() -> tuple[torch.Tensor, ...]:
        def cuda(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.empty(*shape, dtype=dtype, device="cuda")

        return (
            cuda(4, 64),
            cuda(4, 64),
            cuda(64),
            cuda(4, 2, 32),
            cuda(4, 1, 32),
            cuda(32),
            cuda(4, 64, dtype=torch.float8_e4m3fn),
            cuda(1),
        )

    ops = _trace(model, make_args)
    for op in ("fused_add_rmsnorm", "rmsnorm_out", "fused_inplace_qknorm", "per_tensor_quant_fp8"):
        assert getattr(torch.ops.jit_kernel, op) in ops, op


# ---------------------------------------------------------------------------------------------
# Each seed wrapper maps its arguments onto the one implementation (the op recorded, on the CPU).


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return "result-of-the-op"


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Callable[[object, str], _Recorder]:
    def patch(module: object, name: str) -> _Recorder:
        recorder = _Recorder()
        monkeypatch.setattr(module, name, recorder)
        return recorder

    return patch


def test_seed_rmsnorm_is_in_place_and_takes_out_third(record: Callable[[object, str], _Recorder]) -> None:
    from jit_kernel.norm import rmsnorm

    op = record(jit_kernel.ops.norm, "rmsnorm")
    x, w, y = object(), object(), object()
    assert rmsnorm(x, w) is None  # type: ignore[arg-type]
    assert rmsnorm(x, w, y) is None  # type: ignore[arg-type]
    assert rmsnorm(x, w, y, 1e-5) is None  # type: ignore[arg-type]
    assert rmsnorm(x, w, eps=1e-3) is None  # type: ignore[arg-type]
    assert rmsnorm(input=x, weight=w, out=None, eps=0.5) is None  # type: ignore[arg-type]
    assert op.calls == [
        ((x, w, 1e-6), {"out": x}),
        ((x, w, 1e-6), {"out": y}),
        ((x, w, 1e-5), {"out": y}),
        ((x, w, 1e-3), {"out": x}),
        ((x, w, 0.5), {"out": x}),
    ]


def test_seed_rmsnorm_with_eps_in_out_position_fails_loudly() -> None:
    """The torch-style call ``rmsnorm(x, w, 1e-6)`` passed to the seed's form must raise, not compute."""
    from jit_kernel.norm import rmsnorm

    with fake_cuda():
        x = torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(1024, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(TypeError, match=r"out must be a torch\.Tensor"):
            rmsnorm(x, w, 1e-6)  # type: ignore[arg-type]


def test_top_level_rmsnorm_with_out_in_eps_position_fails_loudly() -> None:
    """And the seed-style call ``rmsnorm(x, w, y)`` passed to the top-level (torch-style) form raises."""
    with fake_cuda():
        x = torch.empty(4, 1024, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(1024, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="eps must be a float"):
            jit_kernel.rmsnorm(x, w, torch.empty_like(x))  # type: ignore[arg-type]


def test_seed_norm_wrappers_map_onto_the_ops(record: Callable[[object, str], _Recorder]) -> None:
    from jit_kernel import norm

    fused = record(jit_kernel.ops.norm, "fused_add_rmsnorm")
    qk = record(jit_kernel.ops.norm, "fused_inplace_qknorm")
    across = record(jit_kernel.ops.norm, "qknorm_across_heads")
    a, b, c, d = object(), object(), object(), object()
    assert norm.fused_add_rmsnorm(a, b, c) is None  # type: ignore[arg-type]
    assert norm.fused_add_rmsnorm(a, b, c, 1e-5, cast_x_before_out_mul=False) is None  # type: ignore[arg-type]
    assert norm.fused_add_rmsnorm(a, b, c, 1e-4, cast_x_before_out_mul=True) is None  # type: ignore[arg-type]
    assert fused.calls == [
        ((a, b, c, 1e-6), {"cast_x_before_out_mul": False}),
        ((a, b, c, 1e-5), {"cast_x_before_out_mul": False}),
        ((a, b, c, 1e-4), {"cast_x_before_out_mul": True}),
    ]
    assert norm.fused_inplace_qknorm(a, b, c, d) is None  # type: ignore[arg-type]
    assert norm.fused_inplace_qknorm(a, b, c, d, 1e-5, head_dim=0) is None  # type: ignore[arg-type]
    assert qk.calls == [((a, b, c, d, 1e-6), {}), ((a, b, c, d, 1e-5), {})]
    assert norm.fused_inplace_qknorm_across_heads(a, b, c, d, 0.1) is None  # type: ignore[arg-type]
    assert across.calls == [((a, b, c, d, 0.1), {})]


def test_seed_norm_refusals() -> None:
    from jit_kernel import norm

    with fake_cuda():
        x = torch.empty(4, 8, 128, device="cuda", dtype=torch.bfloat16)
        w = torch.empty(128, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="cast_x_before_out_mul must be a bool"):
            norm.fused_add_rmsnorm(x, x, w, cast_x_before_out_mul=1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="head_dim=64 does not match"):
            norm.fused_inplace_qknorm(x, x, w, w, head_dim=64)
        with pytest.raises(TypeError, match="head_dim must be an int"):
            norm.fused_inplace_qknorm(x, x, w, w, head_dim=128.0)  # type: ignore[arg-type]


def test_seed_norm_capability_queries() -> None:
    from jit_kernel import norm

    assert not norm.can_use_fused_inplace_qknorm(128, torch.int32)
    assert not norm.can_use_fused_inplace_qknorm(0, torch.bfloat16)
    assert not norm.can_use_fused_inplace_qknorm(1 << 21, torch.bfloat16)
    assert norm.is_supported_jit_fused_add_rmsnorm_hidden_size(4096)
    assert norm.is_supported_jit_fused_add_rmsnorm_hidden_size(100)  # any size, where the seed needed % 16
    assert not norm.is_supported_jit_fused_add_rmsnorm_hidden_size(0)
    assert not norm.is_supported_jit_fused_add_rmsnorm_hidden_size(True)  # type: ignore[arg-type]


def test_seed_quant_wrappers(record: Callable[[object, str], _Recorder]) -> None:
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_absmax_fp8, per_tensor_quant_fp8

    op = record(jit_kernel.ops.quant, "per_tensor_quant_fp8")
    a, q, s = object(), object(), object()
    assert per_tensor_quant_fp8(a, q, s) is None  # type: ignore[arg-type]
    assert per_tensor_quant_fp8(a, q, s, True) is None  # type: ignore[arg-type]
    assert per_tensor_quant_fp8(input=a, output_q=q, output_s=s, is_static=False) is None  # type: ignore[arg-type]
    assert op.calls == [((a, q, s, False), {}), ((a, q, s, True), {}), ((a, q, s, False), {})]
    with pytest.raises(TypeError, match="output_q and output_s are required"):
        per_tensor_quant_fp8(a, None, s)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"output_s must be a torch\.Tensor"):
        per_tensor_absmax_fp8(a, None)  # type: ignore[arg-type]


def test_seed_hicache_wrappers(record: Callable[[object, str], _Recorder]) -> None:
    from jit_kernel.hicache import can_use_hicache_jit_kernel, transfer_hicache_all_layer_mla

    assert can_use_hicache_jit_kernel(element_size=1024, unroll=2, block_quota=8)
    assert not can_use_hicache_jit_kernel(element_size=1024, unroll=3)
    assert not can_use_hicache_jit_kernel(element_size=1024, block_quota=-1)
    assert not can_use_hicache_jit_kernel(element_size=40)
    op = record(jit_kernel.ops.hicache, "transfer_hicache_all_layer_mla")
    a, b, c, d = object(), object(), object(), object()
    transfer_hicache_all_layer_mla(a, b, c, d, cache_src_stride_bytes=1152, cache_dst_stride_bytes=2304)  # type: ignore[arg-type]
    transfer_hicache_all_layer_mla(a, b, c, d, kv_cache_src_stride_bytes=64, kv_cache_dst_stride_bytes=64, unroll=4)  # type: ignore[arg-type]
    common = {"element_size": None, "block_quota": None, "page_size": None}
    assert op.calls == [
        (
            (a, b, c, d),
            {"kv_cache_src_stride_bytes": 1152, "kv_cache_dst_stride_bytes": 2304, "unroll": None, **common},
        ),
        ((a, b, c, d), {"kv_cache_src_stride_bytes": 64, "kv_cache_dst_stride_bytes": 64, "unroll": 4, **common}),
    ]
    with pytest.raises(TypeError, match="missing required keyword argument 'cache_dst_stride_bytes'"):
        transfer_hicache_all_layer_mla(a, b, c, d, cache_src_stride_bytes=64)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        transfer_hicache_all_layer_mla(  # type: ignore[arg-type]
            a, b, c, d, cache_src_stride_bytes=64, kv_cache_src_stride_bytes=64, cache_dst_stride_bytes=64
        )


# ---------------------------------------------------------------------------------------------
# jit_kernel.utils


def test_get_ci_test_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.utils import get_ci_test_range, should_run_full_tests

    full, ci = [1, 2, 3], [1]
    for name in ("CI", "JIT_KERNEL_BENCH_CI", "JIT_KERNEL_RUN_FULL_TESTS"):
        monkeypatch.delenv(name, raising=False)
    assert get_ci_test_range(full, ci) is full and not should_run_full_tests()
    monkeypatch.setenv("CI", "true")
    assert get_ci_test_range(full, ci) is ci
    monkeypatch.setenv("JIT_KERNEL_RUN_FULL_TESTS", "1")
    assert should_run_full_tests() and get_ci_test_range(full, ci) is full


def test_make_cpp_args_takes_strings_like_the_seeds() -> None:
    from jit_kernel.utils import make_cpp_args

    args = make_cpp_args(128, True, torch.bfloat16, "float", 0.5)
    assert list(args) == ["128", "true", "bf16_t", "float", "0.5"] and str(args) == "128, true, bf16_t, float, 0.5"
    with pytest.raises(TypeError):
        jit_kernel.make_cpp_args("float")  # the top-level one takes Python values only


def test_jit_arch_and_pdl(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel import utils

    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "8.0")
    assert utils.get_jit_cuda_arch() == utils.ArchInfo(8, 0, "") and not utils.is_arch_support_pdl()
    with utils.override_jit_cuda_arch(9, 0, "a"):
        arch = utils.get_jit_cuda_arch()
        assert (arch.target_name, arch.jit_flag) == ("9.0a", "-DSGL_CUDA_ARCH=900")
        assert utils.is_arch_support_pdl()
    assert utils.get_jit_cuda_arch().target_name == "8.0"
    with pytest.raises(ValueError), utils.override_jit_cuda_arch(9, 0, "x"):
        pass
    assert not utils.is_hip_runtime() or torch.version.hip


def test_empty_sentinel_and_lazy_register_class(monkeypatch: pytest.MonkeyPatch) -> None:
    import tvm_ffi

    from jit_kernel.utils import empty_sentinel, lazy_register_class

    sentinel = empty_sentinel(torch.device("cpu"), torch.float16)
    assert sentinel.numel() == 0 and empty_sentinel(torch.device("cpu"), torch.float16) is sentinel
    events: list[str] = []
    monkeypatch.setattr(tvm_ffi, "register_object", lambda name: lambda cls: events.append(name) or cls)

    @lazy_register_class("test.Thing", lambda: events.append("init"))
    class Thing:
        def __init__(self, value: int) -> None:
            self.value = value

    assert events == []  # nothing happens at declaration
    assert Thing(3).value == 3 and Thing(4).value == 4
    assert events == ["init", "test.Thing"]  # once, at the first instantiation


def test_load_jit_dependencies_and_header_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from jit_kernel.engine import deps, jit
    from jit_kernel.utils import load_jit, register_dependency

    requests: list[Any] = []
    monkeypatch.setattr(jit, "load_request", lambda request, root=None: requests.append(request) or "module")
    monkeypatch.setattr(deps, "REGISTERED_DEPENDENCIES", dict(deps.REGISTERED_DEPENDENCIES))
    (tmp_path / "inc").mkdir()
    source = tmp_path / "k.cc"
    source.write_text("int x;\n")
    register_dependency("mylib")(lambda: [str(tmp_path / "inc")])
    with pytest.raises(ValueError, match="already registered"):
        register_dependency("mylib")(list)
    assert load_jit("t", cpp_files=[str(source)], cpp_wrappers=[("f", "f")], extra_dependencies=["mylib", "mylib"]) == (
        "module"
    )
    assert (tmp_path / "inc").resolve() in requests[-1].units[0].include_dirs
    with pytest.raises(ValueError, match="'nope' is not registered"):
        load_jit("t", cpp_files=[str(source)], cpp_wrappers=[("f", "f")], extra_dependencies=["nope"])
    with pytest.raises(ValueError, match="header_only=False"):
        load_jit("t", cpp_files=[str(source)], cpp_wrappers=[("f", "f")], header_only=False)
    assert load_jit("t", cpp_files=[str(source)], header_only=False, build_directory=str(tmp_path)) == "module"
    assert set(deps.REGISTERED_DEPENDENCIES) >= {"cutlass", "flashinfer"}


@pytest.mark.slow
def test_load_jit_header_only_false_with_a_dependency_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A C++ file that exports its own function (the seed's ``header_only=False``) and includes a
    header from a registered dependency: compiled, loaded and called (host code, no GPU)."""
    from jit_kernel.engine import deps
    from jit_kernel.utils import load_jit, register_dependency

    monkeypatch.setattr(deps, "REGISTERED_DEPENDENCIES", dict(deps.REGISTERED_DEPENDENCIES))
    include = tmp_path / "mylib" / "include"
    include.mkdir(parents=True)
    (include / "mylib.h").write_text("inline int mylib_twice(int x) { return 2 * x; }\n")
    register_dependency("mylib")(lambda: [str(include)])
    source = tmp_path / "user.cc"
    source.write_text(
        textwrap.dedent(
            """\
            #include <mylib.h>
            #include <tvm/ffi/function.h>
            int twice_plus_one(int x) { return mylib_twice(x) + 1; }
            TVM_FFI_DLL_EXPORT_TYPED_FUNC(twice_plus_one, twice_plus_one);
            """
        )
    )
    module = load_jit(
        "seed_compat_own_exports", cpp_files=[str(source)], extra_dependencies=["mylib"], header_only=False
    )
    assert module.twice_plus_one(20) == 41


# ---------------------------------------------------------------------------------------------
# jit_kernel.benchmark.utils


def test_run_benchmark_returns_median_max_min(monkeypatch: pytest.MonkeyPatch) -> None:
    from jit_kernel.benchmark import utils as bench

    seen: list[tuple[str, dict[str, Any]]] = []

    def fake(kind: str) -> Callable[..., list[float]]:
        def bench_fn(fn: Callable[[], object], **kwargs: Any) -> list[float]:
            seen.append((kind, kwargs))
            return [2.0, 1.0, 4.0][: len(kwargs["quantiles"])]  # ms at the quantiles asked, in order

        return bench_fn

    testing = types.ModuleType("triton.testing")
    testing.do_bench_cudagraph = fake("graph")  # type: ignore[attr-defined]
    testing.do_bench = fake("events")  # type: ignore[attr-defined]
    triton = types.ModuleType("triton")
    triton.testing = testing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", testing)
    assert bench.run_benchmark(lambda: None) == (2000.0, 4000.0, 1000.0)
    assert bench.run_benchmark(lambda: None, (0.5, 0.1, 0.9), 4.0) == (500.0, 1000.0, 250.0)
    assert bench.run_benchmark_no_cudagraph(lambda: None, scale=2.0) == (1000.0, 2000.0, 500.0)
    assert bench.median_time_us(lambda: None) == 2000.0
    assert [(kind, kw["quantiles"]) for kind, kw in seen] == [
        ("graph", [0.5, 0.2, 0.8]),
        ("graph", [0.5, 0.1, 0.9]),
        ("events", [0.5, 0.2, 0.8]),
        ("graph", [0.5, 0.2, 0.8]),
    ]


def test_benchmark_tensor_helpers() -> None:
    from jit_kernel.benchmark.utils import create_empty, create_random

    empty = create_empty(2, 3, device="cpu")
    random = create_random(4, dtype=torch.float32, device="cpu")
    assert empty.shape == (2, 3) and empty.dtype == torch.bfloat16
    assert random.shape == (4,) and random.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# The seed's documented usage: the tutorial's scale kernel from a user folder, the add_constant example.


@pytest.fixture
def user_scale(tmp_path: Path) -> types.ModuleType:
    """The tutorial's kernel and a user's wrapper for it, in a folder outside the package."""
    folder = tmp_path / "my_kernels"
    folder.mkdir()
    shutil.copy(TUTORIAL_SCALE_CUH, folder / "scale.cuh")
    shutil.copy(USER_SCALE_WRAPPER, folder / "scale_op.py")
    spec = importlib.util.spec_from_file_location("user_scale_op", folder / "scale_op.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_tutorial_scale_from_a_user_folder_builds_without_a_gpu(
    user_scale: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "9.0a")
    module = user_scale._jit_scale_module(torch.float16, 2000, 1000)
    assert module.implements_function("scale")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "factor"), [(torch.float16, 0.5), (torch.float16, 3.0), (torch.bfloat16, 2.0), (torch.float32, 2.0)]
)
def test_tutorial_scale_correctness(user_scale: types.ModuleType, dtype: torch.dtype, factor: float) -> None:
    from jit_kernel.scale import scale

    for size in (1, 127, 128, 1024, 4097):
        src = torch.randn(size, dtype=dtype, device="cuda")
        out = user_scale.scale(src, factor)
        tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(out, src * factor, **tol)
        # The package's own scale, under the seed's module path, agrees.
        torch.testing.assert_close(scale(src, factor), out, **tol)


@pytest.mark.gpu
def test_tutorial_scale_out_param_and_errors(user_scale: types.ModuleType) -> None:
    src = torch.randn(1024, dtype=torch.float16, device="cuda")
    out = torch.empty_like(src)
    assert user_scale.scale(src, 2.0, out=out) is out
    torch.testing.assert_close(out, src * 2.0, rtol=1e-2, atol=1e-2)
    with pytest.raises(AssertionError, match="CUDA"):
        user_scale.scale(torch.randn(128, dtype=torch.float16), 2.0)
    with pytest.raises(AssertionError, match="Unsupported dtype"):
        user_scale.scale(torch.randint(0, 10, (128,), dtype=torch.int32, device="cuda"), 2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 2, 127, 128, 1024, 1025])
def test_add_constant_example(size: int) -> None:
    """The dev guide's example, with its test: ``from <package>.add_constant import add_constant``."""
    from jit_kernel.add_constant import add_constant

    for constant in (0, 1, 7, 1024, -3):
        src = torch.arange(0, size, dtype=torch.int32, device="cuda")
        dst = add_constant(src, constant)
        assert torch.all(dst == src + constant)
        assert torch.equal(jit_kernel.add_constant(src, constant), dst)


def test_add_constant_example_on_the_cpu() -> None:
    from jit_kernel.add_constant import add_constant

    src = torch.arange(0, 1025, dtype=torch.int32)
    assert torch.equal(add_constant(src, 1), src + 1)


# ---------------------------------------------------------------------------------------------
# GPU: the seed's semantics, on real kernels (what is mutated, what is returned).


def _rms_reference(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [1024, 4096, 3000])
def test_gpu_seed_rmsnorm_in_place_and_out(dtype: torch.dtype, hidden: int) -> None:
    from jit_kernel.norm import rmsnorm

    x = torch.randn(33, hidden, device="cuda", dtype=dtype)
    w = torch.rand(hidden, device="cuda", dtype=dtype) + 0.5
    expected = _rms_reference(x, w)
    original = x.clone()
    # out given (positional, third): input untouched, out written, None returned.
    out = torch.full_like(x, float("nan"))
    assert rmsnorm(x, w, out) is None
    assert torch.equal(x, original)
    assert_close(out, expected, dtype)
    out2 = torch.full_like(x, float("nan"))
    assert rmsnorm(x, w, out=out2, eps=1e-6) is None
    assert torch.equal(out2, out)
    # out=None: input normalised in place.
    assert rmsnorm(x, w) is None
    assert torch.equal(x, out)
    # eps as a keyword changes the result like the reference.
    y = original.clone()
    rmsnorm(y, w, eps=0.5)
    assert_close(y, _rms_reference(original, w, 0.5), dtype)
    # The top-level function, torch style: a new tensor, input untouched.
    z = original.clone()
    assert torch.equal(jit_kernel.rmsnorm(z, w, 1e-6), out) and torch.equal(z, original)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_seed_fused_add_rmsnorm(dtype: torch.dtype) -> None:
    from jit_kernel.norm import fused_add_rmsnorm

    x = torch.randn(17, 4096, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    summed = (x.float() + r.float()).to(dtype)
    expected = _rms_reference(summed, w)
    assert fused_add_rmsnorm(x, r, w, 1e-6, cast_x_before_out_mul=False) is None
    assert torch.equal(r, summed)
    assert_close(x, expected, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_seed_fused_add_rmsnorm_cast_x_before_out_mul(dtype: torch.dtype) -> None:
    """The seed path's True is the top level's cast_x_before_out_mul=True (tests/test_norm.py checks
    its rounding): the same bits, and not the default's."""
    from jit_kernel.norm import fused_add_rmsnorm

    x = torch.randn(17, 4096, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.rand(4096, device="cuda", dtype=dtype) + 0.5
    top, top_r = x.clone(), r.clone()
    jit_kernel.fused_add_rmsnorm(top, top_r, w, 1e-6, cast_x_before_out_mul=True)
    default = x.clone()
    jit_kernel.fused_add_rmsnorm(default, r.clone(), w, 1e-6)
    assert fused_add_rmsnorm(x, r, w, 1e-6, cast_x_before_out_mul=True) is None
    assert torch.equal(x, top) and torch.equal(r, top_r)
    assert not torch.equal(x, default)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128, 256, 96])
def test_gpu_seed_qknorms_in_place(head_dim: int) -> None:
    from jit_kernel.norm import can_use_fused_inplace_qknorm, fused_inplace_qknorm, fused_inplace_qknorm_across_heads

    dtype = torch.bfloat16
    assert can_use_fused_inplace_qknorm(head_dim, dtype)
    q = torch.randn(9, 8, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(9, 2, head_dim, device="cuda", dtype=dtype)
    qw = torch.rand(head_dim, device="cuda", dtype=dtype) + 0.5
    kw = torch.rand(head_dim, device="cuda", dtype=dtype) + 0.5
    expected_q, expected_k = _rms_reference(q, qw), _rms_reference(k, kw)
    q2, k2 = q.clone(), k.clone()
    assert fused_inplace_qknorm(q, k, qw, kw) is None
    assert fused_inplace_qknorm(q2, k2, qw, kw, 1e-6, head_dim=head_dim) is None
    assert_close(q, expected_q, dtype)
    assert_close(k, expected_k, dtype)
    assert torch.equal(q2, q) and torch.equal(k2, k)
    # Across heads: whole rows, weights of the row width.
    qa = torch.randn(9, 8 * head_dim, device="cuda", dtype=dtype)
    ka = torch.randn(9, 8 * head_dim, device="cuda", dtype=dtype)
    wa = torch.rand(8 * head_dim, device="cuda", dtype=dtype) + 0.5
    expected_qa, expected_ka = _rms_reference(qa, wa), _rms_reference(ka, wa)
    assert fused_inplace_qknorm_across_heads(qa, ka, wa, wa) is None
    assert_close(qa, expected_qa, dtype)
    assert_close(ka, expected_ka, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 8, 64), (128, 4096), (19260817, 1, 1)])
def test_gpu_seed_per_tensor_quant_fp8(shape: tuple[int, ...]) -> None:
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_quant_fp8

    x = torch.rand(shape, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x, dtype=torch.float8_e4m3fn)
    scale = torch.zeros(1, device="cuda", dtype=torch.float32)
    assert per_tensor_quant_fp8(x, out, scale, is_static=False) is None
    expected_q, expected_s = jit_kernel.per_tensor_quant_fp8(x)
    assert torch.equal(scale, expected_s) and torch.equal(out.view(torch.uint8), expected_q.view(torch.uint8))
    torch.testing.assert_close(scale, x.float().abs().amax().view(1) / 448.0)
    # Static: the scale is read, not written.
    fixed = torch.tensor([0.01], device="cuda")
    out_static = torch.empty_like(out)
    assert per_tensor_quant_fp8(x, out_static, fixed, True) is None
    assert fixed.item() == pytest.approx(0.01)
    top_q, _ = jit_kernel.per_tensor_quant_fp8(x, None, fixed.clone(), is_static=True)
    assert torch.equal(out_static.view(torch.uint8), top_q.view(torch.uint8))
    reference = (x.float() / 0.01).clamp(-448, 448)  # e4m3: 3 mantissa bits, subnormal step 2^-9
    torch.testing.assert_close(out_static.float(), reference, rtol=2**-4, atol=2**-9)


@pytest.mark.gpu
def test_gpu_seed_per_tensor_absmax_fp8_accumulates_a_maximum() -> None:
    from jit_kernel.per_tensor_quant_fp8 import per_tensor_absmax_fp8

    a = torch.randn(1000, 512, device="cuda", dtype=torch.float16)
    b = a * 3
    a_copy = a.clone()
    scale = torch.zeros(1, device="cuda", dtype=torch.float32)
    assert per_tensor_absmax_fp8(a, scale) is None
    assert torch.equal(a, a_copy)  # only output_s is written
    torch.testing.assert_close(scale, a.float().abs().amax().view(1) / 448.0)
    per_tensor_absmax_fp8(b, scale)  # larger: replaces
    torch.testing.assert_close(scale, b.float().abs().amax().view(1) / 448.0)
    per_tensor_absmax_fp8(a, scale)  # smaller: the maximum stays
    torch.testing.assert_close(scale, b.float().abs().amax().view(1) / 448.0)
    # Exact, and bit-equal to the scale dynamic quantisation computes; an unaligned view (offset by
    # one element) and an empty tensor (output_s unchanged) in the seed's call form.
    exact = (b.abs().amax().double() / 448.0).float().view(1)
    assert torch.equal(scale, exact)
    assert torch.equal(scale, jit_kernel.per_tensor_quant_fp8(b)[1])
    per_tensor_absmax_fp8(torch.empty(0, 512, device="cuda", dtype=torch.float16), scale)
    assert torch.equal(scale, exact)
    view = b.view(-1)[1:]
    scale.zero_()
    per_tensor_absmax_fp8(view, scale)
    assert torch.equal(scale, (view.abs().amax().double() / 448.0).float().view(1))


@pytest.mark.gpu
def test_gpu_seed_hicache_mla_all_layer_keywords() -> None:
    from jit_kernel.hicache import transfer_hicache_all_layer_mla

    layers = [torch.randint(0, 255, (64, 1152), dtype=torch.uint8, device="cuda") for _ in range(3)]
    dst = [torch.zeros_like(t) for t in layers]
    table_src = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64, device="cuda")
    table_dst = torch.tensor([t.data_ptr() for t in dst], dtype=torch.uint64, device="cuda")
    idx_src = torch.tensor([3, 5, 7], device="cuda")
    idx_dst = torch.tensor([0, 1, 2], device="cuda")
    transfer_hicache_all_layer_mla(
        table_dst, idx_dst, table_src, idx_src, cache_src_stride_bytes=1152, cache_dst_stride_bytes=1152
    )
    torch.cuda.synchronize()
    for s, d in zip(layers, dst, strict=True):
        assert torch.equal(d[:3], s[idx_src]) and not d[3:].any()


@pytest.mark.gpu
def test_gpu_seed_cuda_wait_value_event() -> None:
    from jit_kernel.cuda_wait_value import Event

    event = Event()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    data = torch.zeros(1 << 20, device="cuda")
    data.fill_(0.0)  # load both kernels before any stream is held (lazy loading syncs the context)
    data.sum()
    torch.cuda.synchronize()  # and the flag's zeroing is done before either stream touches it
    with torch.cuda.stream(producer):
        data.fill_(1.0)
        event.record()
    with torch.cuda.stream(consumer):
        event.wait()
        total = data.sum()
    consumer.synchronize()
    assert total.item() == float(1 << 20)


@pytest.mark.gpu
def test_gpu_clashing_names_run_the_same_kernels() -> None:
    x = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(jit_kernel.scale(x, 0.25), jit_kernel.scale.scale(x, 0.25))
    q, s = jit_kernel.per_tensor_quant_fp8(x)
    q2, s2 = torch.empty_like(q), torch.zeros_like(s)
    jit_kernel.per_tensor_quant_fp8.per_tensor_quant_fp8(x, q2, s2)
    assert torch.equal(s, s2) and torch.equal(q.view(torch.uint8), q2.view(torch.uint8))


def test_a_tutorial_module_written_into_the_package_leaves_the_root_importable(tmp_path: Path) -> None:
    """The tutorial tells kernel authors to write their ``scale.py`` into the package: the package
    root then imports, ``from jit_kernel.scale import scale`` gives the author's function, and the
    top-level op still runs (the root reads the module's names as they are, no ``__all__`` needed)."""
    root = tmp_path / "check out"  # a space in the path, as users have
    shutil.copytree(
        Path(jit_kernel.__file__).parent, root / "python" / "jit_kernel", ignore=shutil.ignore_patterns("lib")
    )
    repo = Path(jit_kernel.engine.env.DATA_ROOT)
    for data in ("include", "csrc"):
        (root / data).symlink_to(repo / data)
    (root / "python" / "jit_kernel" / "scale.py").write_text(USER_SCALE_WRAPPER.read_text())
    script = textwrap.dedent(
        """
        import jit_kernel, torch
        from jit_kernel.scale import scale, _jit_scale_module
        assert scale.__module__ == "jit_kernel.scale", scale.__module__
        assert jit_kernel.scale.scale is scale and callable(jit_kernel.scale)
        print("ok")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(root / "python")}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
