"""The eager calls (ops/_common.py, kernel_op): the first call of a key loads its kernel into the
op's kernel table, later calls find it there. A user meets the second on the second call, so every
check here runs twice: on a cold kernel table and after a good call filled it. A bad call must
raise the same error, word for word, both times; a form the kernel takes only reshaped (a 3-D
input, a 0-d scale, 3-D caches) must still be served, with the same values."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import jit_kernel
from jit_kernel.engine import families
from jit_kernel.ops import activation, hicache, norm, quant, scale, token_quant
from jit_kernel.ops._common import DECLINED, kernel_op

BF16 = torch.bfloat16


def _cuda(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(dtype)


def _error(call: Callable[[], object]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value)


def _same_error_cold_and_armed(table: dict, good: Callable[[], object], bad: Callable[[], object]) -> None:
    table.clear()  # cold: the first call of the key takes the full path
    cold = _error(bad)
    good()
    assert table, "the good call loaded no kernel"
    assert _error(bad) == cold


def _rmsnorm_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x, w, out = _cuda(4, 256), _cuda(256), _cuda(4, 256)
    bad = [
        lambda: jit_kernel.rmsnorm(x, w, out=_cuda(4, 256, dtype=torch.float16)),
        lambda: jit_kernel.rmsnorm(x, _cuda(128), out=out),
        lambda: jit_kernel.rmsnorm(x, w, out=_cuda(4, 512)[:, ::2]),
    ]
    return norm._RMSNORM_KERNELS, lambda: jit_kernel.rmsnorm(x, w, out=out), bad


def _fused_add_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x, r, w = _cuda(4, 256), _cuda(4, 256), _cuda(256)
    bad = [
        lambda: jit_kernel.fused_add_rmsnorm(x, _cuda(3, 256), w),
        lambda: jit_kernel.fused_add_rmsnorm(x, r, w.float()),
    ]
    return norm._FUSED_ADD_KERNELS[False], lambda: jit_kernel.fused_add_rmsnorm(x, r, w), bad


def _qknorm_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    q, k, qw, kw = _cuda(2, 8, 128), _cuda(2, 2, 128), _cuda(128), _cuda(128)
    bad = [
        lambda: jit_kernel.fused_inplace_qknorm(q, k, qw, kw.half()),
        lambda: jit_kernel.fused_inplace_qknorm(q, _cuda(3, 2, 128), qw, kw),
    ]
    return norm._QKNORM_KERNELS, lambda: jit_kernel.fused_inplace_qknorm(q, k, qw, kw), bad


def _across_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    q, k, qw, kw = _cuda(2, 1024), _cuda(2, 256), _cuda(1024), _cuda(256)
    bad = [
        lambda: jit_kernel.qknorm_across_heads(q, _cuda(3, 256), qw, kw),
        lambda: jit_kernel.qknorm_across_heads(q, k, qw, _cuda(128)),
    ]
    return norm._ACROSS_HEADS_KERNELS, lambda: jit_kernel.qknorm_across_heads(q, k, qw, kw), bad


def _quant_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x = _cuda(4, 256)
    q, s = torch.empty(4, 256, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, device="cuda")
    bad = [
        lambda: jit_kernel.per_tensor_quant_fp8(x, _cuda(4, 256), s),
        lambda: jit_kernel.per_tensor_quant_fp8(x, q, torch.empty(1, device="cuda", dtype=BF16)),
        lambda: jit_kernel.per_tensor_quant_fp8(x, q[:2], s),
    ]
    return quant._KERNELS[False], lambda: jit_kernel.per_tensor_quant_fp8(x, q, s), bad


def _scale_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x, out = _cuda(4, 256), _cuda(4, 256)
    bad = [
        lambda: jit_kernel.scale(x, 2.0, out=_cuda(4, 512)[:, ::2]),
        lambda: jit_kernel.scale(x, 2.0, out=_cuda(4, 255)),
    ]
    return scale._KERNELS, lambda: jit_kernel.scale(x, 2.0, out=out), bad


def _silu_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x, out = _cuda(4, 512), _cuda(4, 256)
    bad = [lambda: jit_kernel.silu_and_mul(x, out=_cuda(4, 512)), lambda: jit_kernel.silu_and_mul(x, out=out.half())]
    return activation._KERNELS["silu_and_mul"], lambda: jit_kernel.silu_and_mul(x, out=out), bad


def _hicache_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    caches = [_cuda(64, 1024) for _ in range(4)]
    idx = torch.arange(8, device="cuda")

    def call(i: torch.Tensor = idx, src: torch.Tensor = caches[2]) -> None:
        jit_kernel.transfer_hicache_one_layer(caches[0], caches[1], i, src, caches[3], i)

    bad = [lambda: call(idx.float()), lambda: call(src=caches[2].half()), lambda: call(src=_cuda(64, 512))]
    return hicache._ONE_LAYER_KERNELS, call, bad


def _rmsnorm_functional_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x, w = _cuda(4, 256), _cuda(256)
    bad = [lambda: jit_kernel.rmsnorm(x, _cuda(128)), lambda: jit_kernel.rmsnorm(x, w.half())]
    return norm._RMSNORM_KERNELS, lambda: jit_kernel.rmsnorm(x, w), bad


def _per_token_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x = _cuda(4, 256)
    q, s = torch.empty(4, 256, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(4, 1, device="cuda")
    bad = [
        lambda: jit_kernel.per_token_quant_fp8(x, q, torch.empty(4, 2, device="cuda")),
        lambda: jit_kernel.per_token_quant_fp8(x, q[:2], s),
        lambda: jit_kernel.per_token_quant_fp8(x, _cuda(4, 256), s),
    ]
    return token_quant._TOKEN_KERNELS[False], lambda: jit_kernel.per_token_quant_fp8(x), bad


def _group_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x = _cuda(4, 256)
    bad = [
        lambda: jit_kernel.per_token_group_quant_fp8(x, 0),
        lambda: jit_kernel.per_token_group_quant_fp8(x, 96),
        lambda: jit_kernel.per_token_group_quant_fp8(x, 128, output_s=torch.empty(4, 3, device="cuda")),
        lambda: jit_kernel.per_token_group_quant_fp8(_cuda(4, 192), 128),
    ]
    return token_quant._GROUP_KERNELS[False], lambda: jit_kernel.per_token_group_quant_fp8(x, 128), bad


def _silu_group_case() -> tuple[dict, Callable[[], object], list[Callable[[], object]]]:
    x = _cuda(4, 512)
    bad = [
        lambda: jit_kernel.silu_and_mul_per_token_group_quant_fp8(_cuda(4, 257), 128),
        lambda: jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, 64, output_q=_cuda(4, 256)),
    ]
    return token_quant._GROUP_KERNELS[True], lambda: jit_kernel.silu_and_mul_per_token_group_quant_fp8(x, 128), bad


CASES = {
    "rmsnorm (functional)": _rmsnorm_functional_case,
    "per_token_quant_fp8": _per_token_case,
    "per_token_group_quant_fp8": _group_case,
    "silu_and_mul_per_token_group_quant_fp8": _silu_group_case,
    "rmsnorm": _rmsnorm_case,
    "fused_add_rmsnorm": _fused_add_case,
    "fused_inplace_qknorm": _qknorm_case,
    "qknorm_across_heads": _across_case,
    "per_tensor_quant_fp8": _quant_case,
    "scale": _scale_case,
    "silu_and_mul": _silu_case,
    "transfer_hicache_one_layer": _hicache_case,
}


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(CASES))
def test_bad_calls_raise_the_same_error_cold_and_armed(op: str) -> None:
    table, good, bad = CASES[op]()
    for call in bad:
        _same_error_cold_and_armed(table, good, call)


@pytest.mark.gpu
def test_armed_calls_of_site_keys_make_no_python_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launches whose key reads only their own arguments (ops/_site.py) look the kernel up in
    C++ once armed: a second call asks no kernel table, and computes what the first did."""
    from jit_kernel.ops._common import KernelTable

    x, w, r = _cuda(4, 256), _cuda(256), _cuda(4, 256)
    q, k, qw, kw = _cuda(4, 32, 128), _cuda(4, 8, 128), _cuda(128), _cuda(128)

    def in_place(op: Callable[..., object], *tensors: torch.Tensor) -> torch.Tensor:
        copies = [t.clone() for t in tensors]
        op(*copies)
        return torch.cat([c.flatten() for c in copies])

    calls = {
        "rmsnorm": lambda: jit_kernel.rmsnorm(x, w, out=torch.full_like(x, float("nan"))),
        "fused_add_rmsnorm": lambda: in_place(lambda a, b: jit_kernel.fused_add_rmsnorm(a, b, w), x, r),
        "fused_inplace_qknorm": lambda: in_place(lambda a, b: jit_kernel.fused_inplace_qknorm(a, b, qw, kw), q, k),
        "scale": lambda: jit_kernel.scale(x, 2.0, out=torch.full_like(x, float("nan"))),
    }
    first = {name: call() for name, call in calls.items()}
    looked_up: list[object] = []

    def lookup(table: KernelTable, key: object) -> object:
        looked_up.append(key)
        return dict.__getitem__(table, key)

    monkeypatch.setattr(KernelTable, "__getitem__", lookup)
    for name, call in calls.items():
        assert torch.equal(call(), first[name]), name
    assert looked_up == []


@pytest.mark.gpu
def test_forms_the_kernels_take_only_reshaped_are_served_once_armed() -> None:
    # rmsnorm: a 3-D input with out= after a 2-D call of the same width.
    x, w = _cuda(4, 256), _cuda(256)
    flat = jit_kernel.rmsnorm(x, w, out=torch.empty_like(x))
    out3 = torch.full((2, 2, 256), float("nan"), device="cuda", dtype=BF16)
    assert jit_kernel.rmsnorm(x.view(2, 2, 256), w, out=out3) is out3
    assert torch.equal(out3.view(4, 256), flat)
    # silu_and_mul: the same.
    g = _cuda(4, 512)
    flat = jit_kernel.silu_and_mul(g, out=torch.empty(4, 256, device="cuda", dtype=BF16))
    out3 = torch.full((2, 2, 256), float("nan"), device="cuda", dtype=BF16)
    assert jit_kernel.silu_and_mul(g.view(2, 2, 512), out=out3) is out3
    assert torch.equal(out3.view(4, 256), flat)
    # per_tensor_quant_fp8: a 0-d scale after a (1,) one.
    q1, s1 = torch.empty(4, 256, device="cuda", dtype=torch.float8_e4m3fn), torch.empty(1, device="cuda")
    jit_kernel.per_tensor_quant_fp8(x, q1, s1)
    q0, s0 = torch.empty_like(q1), torch.full((), float("nan"), device="cuda")
    jit_kernel.per_tensor_quant_fp8(x, q0, s0)
    assert torch.equal(q0.view(torch.uint8), q1.view(torch.uint8)) and torch.equal(s0.view(1), s1)
    # per_token / group quant: the functional forms (rows as they are) equal the reshaped path's outputs on
    # 3-D inputs, and column-major scales (allocated only reshaped) stay column-major.
    x3 = _cuda(2, 2, 256)
    for quantise in (jit_kernel.per_token_quant_fp8, lambda t: jit_kernel.per_token_group_quant_fp8(t, 128)):
        q2, s2 = quantise(x3.view(4, 256))
        q3, s3 = quantise(x3)
        assert torch.equal(q3.view(torch.uint8).view(4, 256), q2.view(torch.uint8))
        assert torch.equal(s3.reshape(4, -1), s2)
    _, s_col = jit_kernel.per_token_group_quant_fp8(x, 128, column_major_scales=True)
    assert s_col.stride() == (1, 4)
    # hicache: 3-D caches [slots, heads, 128] after 2-D caches [rows, 128] armed the key (bf16, 128).
    # The default element_dim is the last dimension, so both address rows of 128 elements.
    src = _cuda(64, 8, 128)
    idx_dst, idx_src = torch.randperm(512, device="cuda")[:16], torch.randperm(512, device="cuda")[:16]
    dst2 = [torch.zeros(512, 128, device="cuda", dtype=BF16) for _ in range(2)]
    jit_kernel.transfer_hicache_one_layer(*dst2, idx_dst, src.view(512, 128), src.view(512, 128), idx_src)
    dst3 = [torch.zeros(64, 8, 128, device="cuda", dtype=BF16) for _ in range(2)]
    jit_kernel.transfer_hicache_one_layer(*dst3, idx_dst, src, src, idx_src)
    for a, b in zip(dst2, dst3, strict=True):
        assert torch.equal(a, b.view(512, 128))
    assert torch.equal(dst2[0][idx_dst], src.view(512, 128)[idx_src])


# ---------------------------------------------------------------------------------------------
# The kernel tables, on any machine


def test_kernel_table_loads_each_key_once() -> None:
    """``table[key]`` loads a key's kernel once and keeps it; ``get`` and ``in`` load nothing."""
    from jit_kernel.ops._common import KernelTable

    loads: list[tuple[int, str]] = []

    class Loader:  # a Dispatcher's interface: the function of an export's config
        spec = families.ADD_CONSTANT_CUDA

        def function(self, export: str, config: tuple[int, str]) -> Callable[..., object]:
            loads.append(config)
            return lambda *args: config

    table = KernelTable(Loader(), "run", lambda dtype, d: (d, str(dtype)))  # type: ignore[arg-type]
    assert table.get((BF16, 256)) is None and (BF16, 256) not in table and not loads
    kernel = table[BF16, 256]
    assert loads == [(256, "torch.bfloat16")]
    assert table == {(BF16, 256): kernel} and table[BF16, 256] is kernel and len(loads) == 1
    table.clear()
    assert not table


def test_kernel_table_remembers_nothing_across_archs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the visible GPUs differ in arch, a loaded function serves only its own device: the
    table asks the dispatcher (which resolves per target) on every call, and keeps nothing."""
    from jit_kernel.engine import target
    from jit_kernel.ops._common import KernelTable

    loads: list[tuple[int, str]] = []

    class Loader:
        spec = families.ADD_CONSTANT_CUDA

        def function(self, export: str, config: tuple[int, str]) -> Callable[..., object]:
            loads.append(config)
            return lambda *args: config

    monkeypatch.setattr(target, "one_arch_for_all_devices", lambda: False)
    table = KernelTable(Loader(), "run", lambda dtype, d: (d, str(dtype)))  # type: ignore[arg-type]
    table[BF16, 256]
    table[BF16, 256]
    assert len(loads) == 2 and not table


def test_compile_switch_reads_as_torch_compiler_is_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops' switch (``dynamo_compiling() or compile_state._is_compiling_flag``) is
    ``torch.compiler.is_compiling()``: False eagerly, True while torch.export or torch.compile set
    the flag, and folded to True by TorchDynamo (one graph, no break, no recompile)."""
    from jit_kernel.ops._common import compile_state, dynamo_compiling, is_compiling

    assert is_compiling() is torch.compiler.is_compiling() is False
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    assert is_compiling() is torch.compiler.is_compiling() is True
    monkeypatch.undo()

    def switch(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if dynamo_compiling() or compile_state._is_compiling_flag else x - 1

    torch._dynamo.reset()
    compiled = torch.compile(switch, fullgraph=True, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert compiled(torch.zeros(1)).item() == 1 and compiled(torch.zeros(1)).item() == 1
    assert switch(torch.zeros(1)).item() == -1


# ---------------------------------------------------------------------------------------------
# The eager call compiled from the plan (ops/_eager.py), on any machine


class _Recording(dict):
    """A kernel table whose kernels record their arguments (``calls``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, tuple[object, ...]]] = []

    def __missing__(self, key: object) -> Callable[..., None]:
        def kernel(*args: object) -> None:
            if any(a == "bad type" for a in args):
                raise TypeError("Mismatched type on argument #1 when calling: `run(...)`. Expected `int`")
            self.calls.append((key, args))

        return kernel


_TABLE = _Recording()


def _scaled(x: torch.Tensor, factor: int, out: torch.Tensor | None = None) -> object:
    if factor == -1:
        raise ValueError("factor must be >= 0")  # the line the traceback names
    if out is None:
        out = torch.empty_like(x)
    return _TABLE, x.dtype, (out, factor, x), out


def _two_launches(x: torch.Tensor, y: torch.Tensor) -> object:
    return [(_TABLE, "x", (x,), None), (_TABLE, "y", (y,), y)]


def _named_args(x: torch.Tensor, y: torch.Tensor) -> object:
    args = (x, y)
    return _TABLE, "named", args, y


def _built_elsewhere(x: torch.Tensor, y: torch.Tensor) -> object:
    return _launch_of(x, y)


def _launch_of(x: torch.Tensor, y: torch.Tensor) -> object:
    return [(_TABLE, "first", (x, x.numel()), None), (_TABLE, "second", (y,), (x, y))]


def _declared(plan: Callable[..., object]) -> Callable[..., object]:
    from jit_kernel.ops._common import kernel_op

    _TABLE.calls.clear()
    return kernel_op(plan.__name__, out="out" if "out" in plan.__code__.co_varnames else None, register=False)(plan)


def test_eager_call_is_the_plan_body_with_its_launch_written_out() -> None:
    """The op's code is the plan's, from the plan's file (its lines kept); a launch written as a
    tuple of names is called directly, without the generic launcher."""
    op = _declared(_scaled)
    x, out = torch.zeros(3), torch.zeros(3)
    assert op(x, 2, out=out) is out
    assert _TABLE.calls == [(torch.float32, (out, 2, x))]
    allocated = op(x, 3)
    assert isinstance(allocated, torch.Tensor) and _TABLE.calls[-1][1][0] is allocated
    assert op.__code__.co_filename == __file__ and "launch__" not in op.__code__.co_freevars
    assert inspect.signature(op) == inspect.signature(_scaled).replace(return_annotation=inspect.Signature.empty)


def test_eager_call_error_names_the_plan_line() -> None:
    op = _declared(_scaled)
    with pytest.raises(ValueError, match="factor must be >= 0") as info:
        op(torch.zeros(3), -1)
    raised = info.traceback[-1]
    source_line = inspect.getsourcelines(_scaled)[1] + 2
    assert Path(str(raised.path)) == Path(__file__) and raised.lineno + 1 == source_line


def test_eager_call_failure_is_explained_with_the_arguments_as_passed() -> None:
    """A type the launcher rejects by position is named by the argument the call passed there,
    although the body rebound ``out`` before the launch."""
    op = _declared(_scaled)
    with pytest.raises(TypeError, match="_scaled: factor must be an int, got str"):
        op(torch.zeros(3), "bad type")


def test_eager_call_runs_lists_and_launches_built_elsewhere_in_order() -> None:
    x, y = torch.zeros(2), torch.ones(3)
    assert _declared(_two_launches)(x, y) is y
    assert _TABLE.calls == [("x", (x,)), ("y", (y,))]
    named = _declared(_named_args)
    assert named(x, y) is y and _TABLE.calls == [("named", (x, y))] and "launch__" not in named.__code__.co_freevars
    built = _declared(_built_elsewhere)
    assert built(x, y) == (x, y) and "launch__" in built.__code__.co_freevars
    assert _TABLE.calls == [("first", (x, 2)), ("second", (y,))]


def test_eager_call_keeps_the_plan_closure() -> None:
    def make(table: dict) -> Callable[..., object]:
        def plan(x: torch.Tensor) -> object:
            return helper(x)

        def helper(x: torch.Tensor) -> object:
            return table, "closure", (x,), x

        return _declared(plan)

    op = make(_TABLE)
    x = torch.zeros(1)
    assert op(x) is x and _TABLE.calls == [("closure", (x,))]


def test_eager_call_of_a_plan_without_source_calls_the_plan() -> None:
    scope: dict[str, object] = {"_TABLE": _TABLE}
    exec("def made(x, y=None):\n    return _TABLE, 'made', (x,), y\n", scope)
    op = _declared(scope["made"])  # type: ignore[arg-type]
    x = torch.zeros(1)
    assert op(x, y=x) is x and _TABLE.calls == [("made", (x,))]
    assert op.__code__.co_filename == "<kernel_op made>"


def test_eager_call_refuses_plans_using_its_reserved_names() -> None:
    def reserved__plan(x: torch.Tensor) -> object:
        launch__ = x
        return _TABLE, "k", (launch__,), None

    with pytest.raises(ValueError, match="names ending in '__' are reserved"):
        _declared(reserved__plan)


class _Serving(dict):
    """A kernel table whose kernel serves rows of a positive sum (True) and declines the others
    (False, writing nothing), recording each call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, ...]] = []

    def __missing__(self, key: object) -> Callable[..., bool]:
        def kernel(out: torch.Tensor, x: torch.Tensor) -> bool:
            self.calls.append((out, x))
            if x.device.type != "meta" and float(x.sum()) < 0:
                return False
            if out.data_ptr():
                out.copy_(x * 2)
            return True

        return kernel

    def get_kernel(self, key: object, run: object) -> Callable[..., bool]:
        return self[key]


_SERVING = _Serving()


def _fallback(x: torch.Tensor, out: torch.Tensor | None = None) -> object:
    return ("fallback", x, out)


def _doubled(x: torch.Tensor, out: torch.Tensor | None = None) -> object:
    if x.numel() == 0:
        return DECLINED
    if out is None:
        out = torch.empty_like(x)
    return _SERVING, "k", (out, x), out


def test_declined_calls_go_to_the_fallback_with_the_arguments_as_given() -> None:
    """A plan's ``return DECLINED`` and a launcher's False both call the fallback, with ``out`` as
    the call passed it (None for the functional form, although the plan allocated one)."""
    op = kernel_op("doubled", out="out", register=False, declined=_fallback)(_doubled)
    _SERVING.calls.clear()
    x = torch.ones(3)
    assert torch.equal(op(x), x * 2)
    out = torch.zeros(3)
    assert op(x, out=out) is out and torch.equal(out, x * 2)
    negative = -torch.ones(3)
    assert op(negative) == ("fallback", negative, None)
    assert op(negative, out=out) == ("fallback", negative, out)
    empty = torch.ones(0)
    assert op(empty) == ("fallback", empty, None)
    assert len(_SERVING.calls) == 4  # the empty input never reached the launcher
    # the generic path (fakes, the registered op) makes the same choice
    assert op.op.run(True, {"x": negative, "out": None}) == ("fallback", negative, None)
    assert op.op.run(True, {"x": empty, "out": None}) == ("fallback", empty, None)
    assert op.op.run(False, {"x": x, "out": None}) == ("fallback", x, None)  # sizes unknown


def test_serves_asks_the_rule_without_writing() -> None:
    op = kernel_op("doubled_serves", out="out", register=False, declined=_fallback)(_doubled)
    out = torch.zeros(3)
    assert op.op.serves(torch.ones(3), out=out) and torch.equal(out, torch.zeros(3))
    assert not op.op.serves(-torch.ones(3))
    assert not op.op.serves(torch.ones(0))


def test_a_plan_with_a_fallback_launches_as_written() -> None:
    def built(x: torch.Tensor) -> object:
        return _launch_of(x, x)

    with pytest.raises(ValueError, match="a plan with a fallback returns DECLINED or launches written as 4-tuples"):
        kernel_op("built", register=False, declined=_fallback)(built)
