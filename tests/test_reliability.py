"""Newcomer mistakes and damaged installs get one clear error (or a safe fallback), never a
traceback or a signal. Everything here runs without a GPU; CUDA-looking
inputs are fake tensors, which reach every check that comes before a kernel launch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import tvm_ffi
from torch._subclasses.fake_tensor import FakeTensorMode

import jit_kernel
from jit_kernel import cli
from jit_kernel.engine import aot, families
from jit_kernel.engine.dispatch import Dispatcher, jit_module
from jit_kernel.engine.spec import ConfigError, symbol_name
from jit_kernel.engine.unit import TranslationUnit
from jit_kernel.ops import _common
from jit_kernel.version import __version__

# ---------------------------------------------------------------------------------------------
# python -m jit_kernel: argument mistakes exit 2 with argparse's one-line format.


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["warm", "nosuchfamily"], "unknown kernel family or op 'nosuchfamily'; families: add_constant_host, "),
        (
            ["warm", "add_constant_host", "--config", "1,2,3"],
            "add_constant_host takes 1 parameter(s) (constant), got 3",
        ),
        (["list", "nosuchfamily"], "unknown kernel family or op 'nosuchfamily'"),
        (
            ["warm", "rmsnorm", "--config", "hidden=4096,dtype=bf16"],
            "dtype=bf16 is not allowed; dtype must be one of bf16_t",
        ),
        (
            ["warm", "rmsnorm", "--config", "hidden=-5,dtype=bf16_t"],
            "hidden=-5 is not allowed; hidden must be one of 0, 1024",
        ),
        (["warm", "add_constant_host", "--config", "constant=abc"], "constant must be an integer in [-2147483648"),
        (["warm", "hicache", "--config", "100,1,1024"], "element_size=100 is not allowed"),
        (["warm", "rmsnorm", "--config", "unknown=1"], "missing ['hidden', 'dtype'], unknown ['unknown']"),
        (["warm", "rmsnorm", "--arch", "sm90"], "invalid CUDA arch --arch='sm90'"),
    ],
)
def test_cli_argument_mistakes_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_cli_without_arguments_writes_clangd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the seed's ``python -m sglang.jit_kernel``, for the arch the one rule gives (here the
    variable: a machine without a GPU names it; see test_first_use for the message without one)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", "8.0")
    assert cli.main([]) == 0
    text = (tmp_path / ".clangd").read_text()
    assert "-xcuda" in text and f"-isystem{jit_kernel.engine.env.INCLUDE_DIR}" in text


# ---------------------------------------------------------------------------------------------
# Config domains: checked before any compiler runs.


@pytest.mark.parametrize(
    ("spec", "config", "message"),
    [
        (families.RMSNORM, (-5, "bf16_t"), "hidden=-5 is not allowed"),
        (families.RMSNORM, (4096, "bf16"), "dtype=bf16 is not allowed; dtype must be one of bf16_t, fp16_t, fp32_t"),
        (families.QKNORM, (96, "bf16_t"), "head_dim=96 is not allowed; head_dim must be one of 0, 64, 128, 256"),
        (families.ADD_CONSTANT_HOST, (True,), "constant=true is not allowed"),
        (families.ADD_CONSTANT_HOST, (2**31,), "constant=2147483648 is not allowed"),
        (families.HICACHE, (1152, 3, 1024), "unroll=3 is not allowed; unroll must be one of 1, 2, 4, 8, 16, 32"),
        (
            families.HICACHE,
            (1152, 1, 1000),
            "num_threads=1000 is not allowed; num_threads must be an integer in [32, 1024] that is a multiple of 32",
        ),
        (families.SCALE, (), "scale takes 1 parameter(s) (dtype), got 0"),
    ],
)
def test_config_outside_its_domain_is_rejected_before_compiling(spec, config, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=re.escape(message)):
        Dispatcher(spec).function(next(iter(spec.exports)), config)


def test_every_family_declares_every_parameter_domain_and_its_grid_fits() -> None:
    for spec in families.ALL_FAMILIES:
        assert set(spec.domains) == set(spec.params), spec.family
        for config in spec.prebuilt:
            spec.check_config(config)


# ---------------------------------------------------------------------------------------------
# Wrong argument kinds, for every op: a non-tensor out, meta tensors, sparse tensors.


def _cuda(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="cuda")


def test_a_non_tensor_out_is_a_type_error_naming_it_for_every_op() -> None:
    x = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"add_constant: out must be a torch\.Tensor, got list"):
        jit_kernel.add_constant(x, 1, out=[0, 0, 0, 0])  # type: ignore[arg-type]
    with FakeTensorMode():
        h, w = _cuda(4, 4096), _cuda(4096)
        cases: list[tuple[Callable[[], object], str]] = [
            (lambda: jit_kernel.scale(h, 2.0, out=[0]), "scale: out must be a torch.Tensor, got list"),
            (lambda: jit_kernel.rmsnorm(h, w, out=[0]), "rmsnorm: out must be a torch.Tensor, got list"),
            (
                lambda: jit_kernel.per_tensor_quant_fp8(h, output_q=[0]),
                "per_tensor_quant_fp8: output_q must be a torch.Tensor, got list",
            ),
            (
                lambda: jit_kernel.per_tensor_quant_fp8(h, output_s=3.0),
                "per_tensor_quant_fp8: output_s must be a torch.Tensor, got float",
            ),
        ]
        for call, message in cases:
            with pytest.raises(TypeError, match=re.escape(message)):
                call()


def _every_op(make: Callable[[], torch.Tensor]) -> list[tuple[str, Callable[[], object]]]:
    """One call per public op, with the bad tensor ``make()`` in its first tensor argument."""
    good_w = torch.empty(8, dtype=torch.bfloat16)
    index = torch.zeros(2, dtype=torch.int64)
    return [
        ("add_constant", lambda: jit_kernel.add_constant(make(), 1)),
        ("scale", lambda: jit_kernel.scale(make(), 2.0)),
        ("rmsnorm", lambda: jit_kernel.rmsnorm(make(), good_w)),
        ("fused_add_rmsnorm", lambda: jit_kernel.fused_add_rmsnorm(make(), make(), good_w)),
        ("fused_inplace_qknorm", lambda: jit_kernel.fused_inplace_qknorm(make(), make(), good_w, good_w)),
        ("qknorm_across_heads", lambda: jit_kernel.qknorm_across_heads(make(), make(), good_w, good_w)),
        ("per_tensor_quant_fp8", lambda: jit_kernel.per_tensor_quant_fp8(make())),
        (
            "transfer_hicache_one_layer",
            lambda: jit_kernel.transfer_hicache_one_layer(make(), make(), index, make(), make(), index),
        ),
        ("stream_wait_value", lambda: jit_kernel.stream_wait_value(make(), 1)),
    ]


_BAD_TENSORS: dict[str, tuple[Callable[[], torch.Tensor], str]] = {
    "meta": (lambda: torch.empty(2, 8, dtype=torch.int32, device="meta"), "is on the meta device"),
    "sparse_coo": (lambda: torch.zeros(2, 8, dtype=torch.int32).to_sparse(), r"is a sparse tensor \(sparse_coo\)"),
    "sparse_csr": (lambda: torch.zeros(2, 8, dtype=torch.int32).to_sparse_csr(), r"is a sparse tensor \(sparse_csr\)"),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("kind", list(_BAD_TENSORS))
def test_meta_and_sparse_tensors_are_named_for_every_op(kind: str) -> None:
    make, message = _BAD_TENSORS[kind]
    for op, call in _every_op(make):
        with pytest.raises(ValueError, match=message) as raised:
            call()
        assert str(raised.value).startswith(op), (op, str(raised.value))


# ---------------------------------------------------------------------------------------------
# torch.compile's fake implementations reject what the real op rejects, with the same message.


def _fake_cases() -> list[tuple[str, Callable[[], object], Callable[[], object]]]:
    x, w_bad = _cuda(4, 4096), _cuda(100)
    q3 = _cuda(4, 32, 128)
    return [
        (
            "rmsnorm",
            lambda: torch.ops.jit_kernel.rmsnorm(x, w_bad, 1e-6),
            lambda: jit_kernel.rmsnorm(x, w_bad, 1e-6),
        ),
        (
            "rmsnorm_out",
            lambda: torch.ops.jit_kernel.rmsnorm_out(_cuda(4, 8), x, _cuda(4096), 1e-6),
            lambda: jit_kernel.rmsnorm(x, _cuda(4096), 1e-6, out=_cuda(4, 8)),
        ),
        (
            "fused_add_rmsnorm",
            lambda: torch.ops.jit_kernel.fused_add_rmsnorm(x, x, w_bad, 1e-6),
            lambda: jit_kernel.fused_add_rmsnorm(x, x, w_bad, 1e-6),
        ),
        (
            "fused_inplace_qknorm",
            lambda: torch.ops.jit_kernel.fused_inplace_qknorm(q3, q3, w_bad, w_bad, 1e-6),
            lambda: jit_kernel.fused_inplace_qknorm(q3, q3, w_bad, w_bad, 1e-6),
        ),
        (
            "qknorm_across_heads",
            lambda: torch.ops.jit_kernel.qknorm_across_heads(x, x, w_bad, w_bad, 1e-6),
            lambda: jit_kernel.qknorm_across_heads(x, x, w_bad, w_bad, 1e-6),
        ),
        (
            "scale",
            lambda: torch.ops.jit_kernel.scale(_cuda(4, dtype=torch.int32), 2.0),
            lambda: jit_kernel.scale(_cuda(4, dtype=torch.int32), 2.0),
        ),
        (
            "per_tensor_quant_fp8",
            lambda: torch.ops.jit_kernel.per_tensor_quant_fp8(x, _cuda(4, 4096), _cuda(1, dtype=torch.float32), False),
            lambda: jit_kernel.per_tensor_quant_fp8(x, _cuda(4, 4096), _cuda(1, dtype=torch.float32)),
        ),
    ]


@pytest.mark.parametrize("index", range(7))  # len(_fake_cases()): built inside FakeTensorMode only
def test_fake_implementations_reject_what_the_op_rejects(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():  # the launchers' checks run on the CPU: kernels built for sm_90
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", os.environ.get("JIT_KERNEL_CUDA_ARCH", "9.0"))
    with FakeTensorMode():
        cases = _fake_cases()
        assert len(cases) == 7
        name, fake_call, eager_call = cases[index]
        with pytest.raises((ValueError, TypeError)) as from_eager:
            eager_call()
        with pytest.raises((ValueError, TypeError)) as from_fake:
            fake_call()
    assert type(from_fake.value) is type(from_eager.value), name
    assert str(from_fake.value) == str(from_eager.value), name


def test_fake_implementation_accepts_a_valid_call_and_shapes_its_output() -> None:
    with FakeTensorMode():
        out = torch.ops.jit_kernel.rmsnorm(_cuda(4, 4096), _cuda(4096), 1e-6)
    assert out.shape == (4, 4096) and out.dtype == torch.bfloat16


def _valid_fake_calls() -> list[Callable[[], object]]:
    x, w, q3, w128 = _cuda(4, 4096), _cuda(4096), _cuda(4, 32, 128), _cuda(128)
    return [
        lambda: torch.ops.jit_kernel.rmsnorm(x, w, 1e-6),
        lambda: torch.ops.jit_kernel.rmsnorm_out(_cuda(4, 4096), x, w, 1e-6),
        lambda: torch.ops.jit_kernel.rmsnorm(_cuda(3, 100), _cuda(100), 1e-6),  # the generic kernel
        lambda: torch.ops.jit_kernel.fused_add_rmsnorm(x, _cuda(4, 4096), w, 1e-6),
        lambda: torch.ops.jit_kernel.fused_inplace_qknorm(q3, _cuda(4, 8, 128), w128, w128, 1e-6),
        lambda: torch.ops.jit_kernel.qknorm_across_heads(x, _cuda(4, 1024), w, _cuda(1024), 1e-6),
        lambda: torch.ops.jit_kernel.scale(x, 2.0),
        lambda: torch.ops.jit_kernel.scale_out(_cuda(4, 4096), x, 2.0),
        lambda: torch.ops.jit_kernel.per_tensor_quant_fp8(
            x, _cuda(4, 4096, dtype=torch.float8_e4m3fn), _cuda(1, dtype=torch.float32), False
        ),
        lambda: torch.ops.jit_kernel.per_tensor_quant_fp8(
            _cuda(1 << 20), _cuda(1 << 20, dtype=torch.float8_e4m3fn), _cuda(1, dtype=torch.float32), False
        ),  # the cooperative path's sizes
        lambda: torch.ops.jit_kernel.per_tensor_quant_fp8(
            x, _cuda(4, 4096, dtype=torch.float8_e4m3fn), _cuda(1, dtype=torch.float32), True
        ),
        # The decoder-layer families.
        lambda: torch.ops.jit_kernel.silu_and_mul(_cuda(4, 2 * 4096)),
        lambda: torch.ops.jit_kernel.apply_rope_with_cos_sin_cache_inplace(
            _cuda(4, dtype=torch.int64), _cuda(4, 32 * 128), _cuda(4, 8 * 128), 128, _cuda(64, 128, dtype=torch.float32)
        ),
        lambda: torch.ops.jit_kernel.fused_qknorm_rope(
            _cuda(4, 32, 128), _cuda(4, 8, 128), w128, w128, _cuda(4, dtype=torch.int32), _cuda(64, 128)
        ),
        lambda: torch.ops.jit_kernel.per_token_quant_fp8(
            x, _cuda(4, 4096, dtype=torch.float8_e4m3fn), _cuda(4, 1, dtype=torch.float32), False
        ),
        lambda: torch.ops.jit_kernel.per_token_group_quant_fp8(
            x, _cuda(4, 4096, dtype=torch.float8_e4m3fn), _cuda(4, 32, dtype=torch.float32), 128, 1e-10, False
        ),
        lambda: torch.ops.jit_kernel.silu_and_mul_per_token_group_quant_fp8(
            _cuda(4, 2 * 4096),
            _cuda(4, 4096, dtype=torch.float8_e4m3fn),
            _cuda(4, 32, dtype=torch.float32),
            128,
            1e-10,
            False,
        ),
        lambda: torch.ops.jit_kernel.store_kv_cache(
            _cuda(4, 8, 128), _cuda(4, 8, 128), _cuda(64, 8, 128), _cuda(64, 8, 128), _cuda(4, dtype=torch.int64)
        ),
        lambda: torch.ops.jit_kernel.set_mla_kv_buffer(
            _cuda(64, 1, 576), _cuda(4, dtype=torch.int32), _cuda(4, 1, 512), _cuda(4, 1, 64)
        ),
    ]


@pytest.mark.parametrize("index", range(19))  # len(_valid_fake_calls())
def test_fake_implementation_runs_the_launchers_checks_and_launches_nothing(
    index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A valid call in fake mode reaches its launcher, which returns on tensors without data before
    any CUDA call: on this CPU machine any CUDA call would fail, on a GPU it would fault."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", os.environ.get("JIT_KERNEL_CUDA_ARCH", "9.0"))
    calls: list[str] = []
    real = _common.KernelTable.get_kernel

    def recording(self: _common.KernelTable, key: object, run: bool) -> object:
        calls.append(f"{self._export}:{run!r}")
        return real(self, key, run)

    monkeypatch.setattr(_common.KernelTable, "get_kernel", recording)
    with FakeTensorMode():
        valid_calls = _valid_fake_calls()
        assert len(valid_calls) == 19
        valid_calls[index]()
    assert calls and all(call.endswith(":CHECK_ONLY") for call in calls), calls


# ---------------------------------------------------------------------------------------------
# A damaged install: a truncated or corrupt prebuilt library, an unreadable manifest.

_USE_PREBUILT = """
import sys
from pathlib import Path
import torch
import jit_kernel.engine.prebuilt as prebuilt
prebuilt.LIBRARY_DIR = Path(sys.argv[1])
from jit_kernel.ops import add_constant as op
x = torch.arange(-4, 60, dtype=torch.int32)
assert torch.equal(op.add_constant(x, 1), x + 1)
print("decision:", op._HOST.decisions[(1,)])
"""


@pytest.fixture(scope="module")
def prebuilt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prebuilt folder of our own: add_constant_host<1> compiled by the JIT path, with a sealed
    manifest, so that damaging it touches nothing installed."""
    spec = families.ADD_CONSTANT_HOST
    jit_module(spec, (1,))
    cache_root = Path(os.environ["JIT_KERNEL_CACHE_DIR"])
    built = next(cache_root.glob("jit_kernel_add_constant_host_1-*/*.so"))
    folder = tmp_path_factory.mktemp("prebuilt")
    library = folder / "libjit_kernel_prebuilt.so"
    library.write_bytes(built.read_bytes())
    symbol = symbol_name(spec, "run", (1,))
    generated = {
        "format": 1,
        "library": library.name,
        "jit_kernel_version": __version__,
        "cuda_version": None,
        "tvm_ffi_version": tvm_ffi.__version__,
        "symbols": {
            symbol: {
                "family": spec.family,
                "export": "run",
                "config": [1],
                "target": "host",
                "machine_code": [],
                "ptx": [],
                "unit_digest": TranslationUnit.for_config(spec, (1,)).digest(),
                "cuda_version": None,
                "tvm_ffi_version": tvm_ffi.__version__,
            }
        },
    }
    (folder / "generated.json").write_text(json.dumps(generated))
    sealed = aot.seal(folder / "generated.json", library, folder / "prebuilt_manifest.json")
    assert sealed["library_size"] == library.stat().st_size
    assert sealed["library_sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    return folder


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    for name in ("libjit_kernel_prebuilt.so", "prebuilt_manifest.json"):
        (target / name).write_bytes((source / name).read_bytes())
    return target


def _run(script: str, *args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JIT_KERNEL_CACHE_DIR": str(cache)}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def _damage(folder: Path, how: str) -> str:
    """Damage a copy of the prebuilt folder; returns the file the warning must name."""
    library, manifest = folder / "libjit_kernel_prebuilt.so", folder / "prebuilt_manifest.json"
    if how == "truncated":
        data = library.read_bytes()
        library.write_bytes(data[: len(data) // 2])
        return str(library)
    if how == "corrupt_same_size":
        data = bytearray(library.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(64)
        library.write_bytes(bytes(data))
        return str(library)
    if how == "missing_library":
        library.unlink()
        return str(library)
    if how == "corrupt_manifest":
        manifest.write_text(manifest.read_text()[:100])
        return str(manifest)
    raise AssertionError(how)


@pytest.mark.slow
def test_intact_prebuilt_is_used(prebuilt_dir: Path, tmp_path: Path) -> None:
    done = _run(
        _USE_PREBUILT, str(_copy(prebuilt_dir, tmp_path / "lib")), cache=Path(os.environ["JIT_KERNEL_CACHE_DIR"])
    )
    assert done.returncode == 0, done.stderr
    assert "decision: prebuilt" in done.stdout
    assert "WARNING" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "corrupt_same_size", "missing_library", "corrupt_manifest"])
def test_damaged_prebuilt_warns_once_and_falls_back_to_jit(prebuilt_dir: Path, tmp_path: Path, how: str) -> None:
    folder = _copy(prebuilt_dir, tmp_path / "lib")
    named = _damage(folder, how)
    done = _run(_USE_PREBUILT, str(folder), cache=Path(os.environ["JIT_KERNEL_CACHE_DIR"]))
    assert done.returncode == 0, f"exit {done.returncode} (a signal is negative):\n{done.stderr}"
    assert "decision: jit (prebuilt" in done.stdout, done.stdout
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, done.stderr
    assert named in warnings[0] and "reinstall jit-kernel" in warnings[0], warnings[0]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_doctor_reports_a_damaged_install_and_how_to_repair_it(prebuilt_dir: Path, tmp_path: Path) -> None:
    folder = _copy(prebuilt_dir, tmp_path / "lib")
    named = _damage(folder, "truncated")
    script = (
        "import sys\nfrom pathlib import Path\nimport jit_kernel.engine.prebuilt as prebuilt\n"
        "prebuilt.LIBRARY_DIR = Path(sys.argv[1])\nfrom jit_kernel.cli import main\nsys.exit(main(['doctor']))\n"
    )
    done = _run(script, str(folder), cache=Path(os.environ["JIT_KERNEL_CACHE_DIR"]))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"prebuilt       DAMAGED: prebuilt library {named} has" in done.stdout
    assert "reinstall jit-kernel" in done.stderr and "unhealthy" in done.stderr
    assert "Traceback" not in done.stderr


def _compile_without_running(fn: Callable[..., object]) -> Callable[..., object]:
    """torch.compile's tracing (dynamo, whose FakeTensors throw on any data access), with a backend
    that hands the graph back: called on FakeTensors, it runs the ops' fake implementations."""
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, example_inputs: gm, fullgraph=True)


def test_torch_compile_tracing_runs_the_launchers_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        monkeypatch.setenv("JIT_KERNEL_CUDA_ARCH", os.environ.get("JIT_KERNEL_CUDA_ARCH", "9.0"))
    with FakeTensorMode(allow_non_fake_inputs=True):
        x, w = _cuda(4, 4096), _cuda(4096)
        assert _compile_without_running(lambda x, w: jit_kernel.rmsnorm(x, w))(x, w).shape == (4, 4096)
        with pytest.raises(Exception) as raised:  # dynamo wraps the op's ValueError
            _compile_without_running(lambda x, w: jit_kernel.rmsnorm(x, w))(x, _cuda(100))
    assert "Tensor match failed for 'weight'" in str(raised.value), str(raised.value)
