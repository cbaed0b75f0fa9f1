"""The dispatcher: prebuilt first when it fits the GPU and the sources, JIT otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jit_kernel
from jit_helpers import fake_gpu, recorded_logs  # noqa: F401 (fake_gpu is a fixture)
from jit_kernel.engine import env, families, prebuilt
from jit_kernel.engine.dispatch import Dispatcher, JitDisabledError
from jit_kernel.engine.spec import IntRange, KernelSpec, OneOf, symbol_name
from jit_kernel.engine.target import Arch, parse_arch_list, runs_on

installed = pytest.mark.skipif(
    env.DATA_ROOT != env.PACKAGE_DIR, reason="needs the installed wheel (a source checkout has no prebuilt library)"
)


def _i32(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.int32)


@pytest.fixture
def host() -> Dispatcher:
    return Dispatcher(families.ADD_CONSTANT_HOST)


@pytest.fixture
def cuda_at(fake_gpu):  # noqa: F811 (a fixture from jit_helpers)
    """A CUDA dispatcher that believes the GPU has the given compute capability."""

    def make(capability: tuple[int, int]) -> Dispatcher:
        fake_gpu(capability)
        return Dispatcher(families.ADD_CONSTANT_CUDA)

    return make


@pytest.fixture
def strict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """JIT_KERNEL_DISABLE_JIT=1 over an empty JIT cache: strict mode loads what is cached, and this
    session may have compiled any config already (on disk and in the module memo)."""
    monkeypatch.setenv("JIT_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("jit_kernel.engine.jit._loaded", {})
    monkeypatch.setenv("JIT_KERNEL_DISABLE_JIT", "1")


def test_add_constant_cpu_results() -> None:
    for constant in (1, 2, 3, 5, -4):
        src = torch.randint(-1000, 1000, (37,), dtype=torch.int32)
        out = torch.full_like(src, 123456)
        assert jit_kernel.add_constant(src, constant, out=out) is out
        assert torch.equal(out, src + constant)
    grid = torch.randint(-1000, 1000, (3, 5), dtype=torch.int32)
    assert torch.equal(jit_kernel.add_constant(grid, 2), grid + 2)
    cube = torch.randint(-1000, 1000, (2, 3, 4), dtype=torch.int32)  # any rank, no flattening view
    assert torch.equal(jit_kernel.add_constant(cube, -7, out=torch.empty_like(cube)), cube - 7)
    scalar = torch.tensor(41, dtype=torch.int32)
    assert jit_kernel.add_constant(scalar, 1).item() == 42
    empty = torch.empty(0, dtype=torch.int32)
    assert jit_kernel.add_constant(empty, 1).numel() == 0


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: jit_kernel.add_constant(torch.zeros(4), 1), TypeError, "(?s)'src'.*expected int32"),
        (lambda: jit_kernel.add_constant([1, 2], 1), TypeError, "src must be a torch.Tensor"),
        (lambda: jit_kernel.add_constant(_i32(4), 1.5), TypeError, "constant must be an int"),
        (lambda: jit_kernel.add_constant(_i32(4), 2**31), ValueError, "constant must be an integer in"),
        (
            lambda: jit_kernel.add_constant(_i32(4, 4).t(), 1),
            ValueError,
            "(?s)'src'.*not contiguous",
        ),
        (lambda: jit_kernel.add_constant(_i32(4), 1, out=_i32(5)), ValueError, r"(?s)'out'.*Size mismatch"),
        (lambda: jit_kernel.add_constant(_i32(3, 5), 1, out=_i32(5, 3)), ValueError, r"(?s)'out'.*Size mismatch"),
        (lambda: jit_kernel.add_constant(_i32(4), 1, out=_i32(2, 2)), ValueError, r"(?s)'out'.*Rank mismatch"),
        (lambda: jit_kernel.add_constant(_i32(4, 4), 1, out=_i32(4, 4).t()), ValueError, "(?s)'out'.*not contig"),
    ],
)
def test_add_constant_bad_input_names_the_argument(call, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        call()


@installed
def test_prebuilt_config_takes_the_prebuilt_symbol(host: Dispatcher) -> None:
    with recorded_logs() as logs:
        host.function("run", (1,))
    assert host.decisions[(1,)] == "prebuilt"
    assert "add_constant_host<1>: prebuilt" in logs.messages
    assert logs.compiles() == []


def test_other_config_is_jit_compiled_and_says_why(host: Dispatcher) -> None:
    with recorded_logs() as logs:
        run = host.function("run", (17,))
    src = torch.arange(8, dtype=torch.int32)
    out = torch.empty_like(src)
    run(out, src)
    assert torch.equal(out, src + 17)
    assert host.decisions[(17,)].startswith("jit (")
    assert any(m.startswith("add_constant_host<17>: jit (") for m in logs.messages)
    with recorded_logs() as logs:
        assert host.function("run", (17,)) is run  # resolved once: a dict hit afterwards
    assert logs.messages == []


def test_disable_prebuilt_forces_jit(host: Dispatcher, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIT_KERNEL_DISABLE_PREBUILT", "1")
    host.function("run", (2,))
    assert host.decisions[(2,)] == "jit (prebuilt disabled by JIT_KERNEL_DISABLE_PREBUILT=1)"


def test_disable_jit_turns_a_miss_into_an_error(host: Dispatcher, strict: None) -> None:
    with pytest.raises(JitDisabledError, match=r"add_constant_host<12345>.*JIT_KERNEL_DISABLE_JIT=1"):
        host.function("run", (12345,))


def test_disable_jit_and_prebuilt_together_is_an_error(
    host: Dispatcher, monkeypatch: pytest.MonkeyPatch, strict: None
) -> None:
    monkeypatch.setenv("JIT_KERNEL_DISABLE_PREBUILT", "1")
    with pytest.raises(JitDisabledError, match=r"add_constant_host<1>.*DISABLE_PREBUILT"):
        host.function("run", (1,))


@installed
def test_prebuilt_for_another_arch_is_not_used(cuda_at, strict: None) -> None:
    manifest = prebuilt.manifest()
    assert manifest is not None
    entry = manifest.symbols[symbol_name(families.ADD_CONSTANT_CUDA, "run", (1,))]
    built = entry.machine_code[0]
    on_built_gpu = cuda_at((built.major, built.minor))
    on_built_gpu.function("run", (1,))
    assert on_built_gpu.decisions[(1,)] == "prebuilt"
    with pytest.raises(JitDisabledError, match=r"add_constant<1>.*no prebuilt for sm_120"):
        cuda_at((12, 0)).function("run", (1,))
    with pytest.raises(JitDisabledError, match=r"no prebuilt for sm_75"):
        cuda_at((7, 5)).function("run", (1,))


@installed
def test_prebuilt_from_other_sources_is_not_used(
    host: Dispatcher, monkeypatch: pytest.MonkeyPatch, strict: None
) -> None:
    monkeypatch.setattr(prebuilt, "current_digest", lambda spec, config: "edited-sources")
    with pytest.raises(JitDisabledError, match="another translation unit"):
        host.function("run", (3,))


@pytest.mark.parametrize(
    ("arch", "capability", "machine_code", "ptx"),
    [
        ("8.0", (8, 0), True, True),
        ("8.0", (8, 9), True, True),
        ("8.0", (9, 0), False, True),
        ("8.9", (8, 0), False, False),
        ("9.0a", (9, 0), True, True),
        ("9.0a", (10, 0), False, False),
        ("10.0a", (10, 3), False, False),
        ("12.0f", (12, 1), True, True),
        ("12.0f", (10, 0), False, False),
        ("12.0", (12, 0), True, True),
    ],
)
def test_arch_compatibility_rules(arch: str, capability: tuple[int, int], machine_code: bool, ptx: bool) -> None:
    parsed = Arch.parse(arch)
    assert parsed.machine_code_runs_on(capability) is machine_code
    assert parsed.ptx_runs_on(capability) is ptx
    assert runs_on([], [parsed], capability) is ptx


def test_arch_list_parsing() -> None:
    targets = parse_arch_list("8.0;8.9 9.0a,10.0a;12.0+PTX")
    assert [str(t.arch) for t in targets] == ["8.0", "8.9", "9.0a", "10.0a", "12.0"]
    assert [t.ptx for t in targets] == [False, False, False, False, True]
    assert targets[2].gencode() == "-gencode=arch=compute_90a,code=sm_90a"
    assert targets[4].gencode() == "-gencode=arch=compute_120,code=[sm_120,compute_120]"
    assert parse_arch_list("none") == [] == parse_arch_list("")
    with pytest.raises(ValueError, match="invalid CUDA arch"):
        parse_arch_list("sm_90")


def test_symbol_names_are_unique_c_identifiers() -> None:
    spec = KernelSpec(
        family="demo",
        sources=("x.cuh",),
        params=("a", "b", "c"),
        exports={"run": "K<{args}>::run"},
        domains={"a": IntRange(-16, 16), "b": OneOf((True, False)), "c": OneOf(("bf16_t", "fp16_t", "f"))},
    )
    configs = [(1, True, "bf16_t"), (-1, True, "bf16_t"), (1, False, "bf16_t"), (1, True, "fp16_t"), (11, True, "f")]
    names = [symbol_name(spec, "run", c) for c in configs]
    assert len(set(names)) == len(names)
    assert all(n.isidentifier() for n in names)
    assert names[0] == "demo__run__1_true_bf16_t"
    assert names[1] == "demo__run__m1_true_bf16_t"
    assert spec.describe((1, True, "bf16_t")) == "demo<1, true, bf16_t>"
    assert spec.wrapper("run", (1, True, "bf16_t")) == "K<1, true, bf16_t>::run"
    with pytest.raises(ValueError, match=r"demo takes 3 parameter\(s\) \(a, b, c\), got 1: 1"):
        spec.check_config((1,))


def test_every_family_spec_is_consistent() -> None:
    for spec in families.ALL_FAMILIES:
        assert spec.prebuilt, f"{spec.family} prebuilds nothing"
        for source in spec.sources:
            assert (env.CSRC_DIR / source).is_file(), source
        symbols = [symbol_name(spec, e, c) for c in spec.prebuilt for e in spec.exports]
        assert len(set(symbols)) == len(symbols)


@pytest.mark.gpu
@pytest.mark.parametrize("constant", [1, 3, 9])  # prebuilt, prebuilt, JIT
@pytest.mark.parametrize("size", [0, 1, 1000, 1_000_003])
def test_add_constant_cuda_results(constant: int, size: int) -> None:
    src = torch.randint(-(2**30), 2**30, (size,), dtype=torch.int32, device="cuda")
    out = torch.full_like(src, -123456)
    assert jit_kernel.add_constant(src, constant, out=out) is out
    torch.testing.assert_close(out, src + constant, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("constant", [2, 9])  # prebuilt, JIT
def test_add_constant_cuda_runs_on_the_current_stream(constant: int) -> None:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        src = torch.zeros(1 << 22, dtype=torch.int32, device="cuda")
        out = torch.empty_like(src)
        torch.cuda._sleep(50_000_000)  # a kernel on any other stream would run before the fill below
        src.fill_(5)
        jit_kernel.add_constant(src, constant, out=out)
    stream.synchronize()
    assert torch.equal(out, torch.full_like(src, 5 + constant))


@pytest.mark.gpu
@pytest.mark.multigpu
def test_add_constant_runs_on_its_tensors_device() -> None:
    """Inputs on cuda:1 while cuda:0 is current: the kernel runs on cuda:1, on cuda:1's current
    stream, and cuda:0 stays current afterwards."""
    torch.cuda.set_device(0)
    src = torch.randint(-1000, 1000, (1 << 20,), dtype=torch.int32, device="cuda:1")
    stream = torch.cuda.Stream(device="cuda:1")
    with torch.cuda.stream(stream):
        for constant in (1, 9):
            out = jit_kernel.add_constant(src, constant)
            assert out.device == torch.device("cuda:1")
            assert torch.equal(out, src + constant)
    assert torch.cuda.current_device() == 0


def test_decisions_are_per_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host whose GPUs differ in arch, one device's prebuilt-or-JIT decision does not serve the
    other: the dispatcher resolves each (export, config) once per target."""
    from jit_kernel.engine import target

    capabilities = {0: (9, 0), 1: (8, 0)}
    current = {"device": 0}
    monkeypatch.setattr(target, "_current_device", lambda: current["device"])
    monkeypatch.setattr(target, "device_properties", lambda index: (capabilities[index], 132, f"GPU {index}"))
    monkeypatch.setattr(target, "device_count", lambda: len(capabilities))
    monkeypatch.delenv("JIT_KERNEL_CUDA_ARCH", raising=False)
    target.clear()
    seen: list[str] = []

    def reason(spec: object, config: object, device: target.Target | None) -> str | None:
        assert device is not None
        seen.append(str(device.arch))
        return None if device.capability == (9, 0) else f"no prebuilt for {device.arch.sm}"

    class Library:
        def get_function(self, symbol: str) -> str:
            return f"prebuilt {symbol}"

    class Module:
        def get_function(self, symbol: str) -> str:
            return f"jit {symbol}"

    monkeypatch.setattr(prebuilt, "unusable_reason", reason)
    monkeypatch.setattr(prebuilt, "library", Library)
    monkeypatch.setattr(Dispatcher, "_jit_module", lambda self, config, why, device: Module())
    try:
        dispatcher = Dispatcher(families.ADD_CONSTANT_CUDA)
        assert dispatcher.function("run", (1,)).startswith("prebuilt ")
        current["device"] = 1
        assert dispatcher.function("run", (1,)).startswith("jit ")
        current["device"] = 0
        assert dispatcher.function("run", (1,)).startswith("prebuilt ")
        assert seen == ["9.0a", "8.0"]  # each target resolved once, then remembered
        assert not target.one_arch_for_all_devices()
    finally:
        target.clear()
