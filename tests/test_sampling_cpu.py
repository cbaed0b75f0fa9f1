"""The sampling family on the CPU: argument handling, the C++ launcher's checks on fake CUDA tensors
(nothing launches), the registered ops, FlashInfer's signatures, and Philox's known answers."""

from __future__ import annotations

import inspect
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import jit_kernel
from _norm_helpers import fake_cuda
from jit_kernel import sampling
from jit_kernel.engine.families import ALL_FAMILIES, SAMPLING

ROOT = Path(__file__).resolve().parents[1]


def _e(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


def _i64(*shape: int, device: str = "cuda") -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=torch.int64)


B, V = 4, 1000

SAMPLE_BAD = [
    ({"logits": [1.0, 2.0]}, TypeError, r"^sample: logits must be a torch\.Tensor, got list$"),
    ({"logits": lambda: _e(B, V, dtype=torch.int32)}, TypeError, r"sample: logits must be one of \(float16"),
    ({"logits": lambda: _e(V)}, ValueError, r"^sample: logits must have 2 dimensions \[batch, vocab\], got shape"),
    ({"logits": lambda: _e(B, V, device="cpu")}, ValueError, r"(?s)'logits'.*Device mismatch"),
    ({"logits": lambda: _e(V, B).t()}, ValueError, r"(?s)'logits'.*Stride mismatch"),
    ({"logits": lambda: _e(B, 0)}, ValueError, r"sampling: logits must have a vocabulary of 1 to 393216 .* got 0"),
    ({"logits": lambda: _e(B, 393217)}, ValueError, r"sampling: logits must have a vocabulary of 1 to 393216"),
    ({"top_k": 0}, ValueError, r"sampling: top_k must be at least 1, got 0"),
    ({"top_k": 2.5}, TypeError, r"^sample: top_k must be an int, got float$"),
    ({"top_k": True}, TypeError, r"^sample: top_k must be a CUDA tensor \[batch\], an int or None, got bool$"),
    ({"top_k": lambda: _e(B, dtype=torch.float32)}, TypeError, r"(?s)'top_k'.*Dtype mismatch"),
    ({"top_k": lambda: _e(B + 1, dtype=torch.int32)}, ValueError, r"(?s)'top_k'.*Size mismatch.*'batch'"),
    ({"top_p": 1.5}, ValueError, r"sampling: top_p must be in \(0, 1\], got 1\.5"),
    ({"top_p": 0.0}, ValueError, r"sampling: top_p must be in \(0, 1\], got 0"),
    ({"top_p": "0.9"}, TypeError, r"^sample: top_p must be a CUDA tensor \[batch\], a float or None, got str$"),
    ({"top_p": lambda: _e(B, dtype=torch.float16)}, TypeError, r"(?s)'top_p'.*Dtype mismatch: expected float32"),
    ({"top_p": lambda: _e(B, device="cpu")}, ValueError, r"(?s)'top_p'.*Device mismatch"),
    ({"min_p": 2.0}, ValueError, r"sampling: min_p must be in \[0, 1\], got 2"),
    ({"min_p": lambda: _e(2, B)}, ValueError, r"(?s)'min_p'.*Rank mismatch"),
    ({"temperature": -1.0}, ValueError, r"sampling: temperature must be a finite float >= 0, got -1"),
    ({"temperature": float("nan")}, ValueError, r"sampling: temperature must be a finite float >= 0"),
    ({"temperature": lambda: _e(B, dtype=torch.float64)}, TypeError, r"(?s)'temperature'.*Dtype mismatch"),
    ({"seed": lambda: _i64(B)}, ValueError, r"^sample: seed and offset must both be tensors or both be ints$"),
    ({"offset": lambda: _i64(B)}, ValueError, r"^sample: offset is given without seed"),
    ({"seed": 1, "offset": lambda: _i64(B)}, ValueError, r"^sample: seed and offset must both be tensors or both"),
    ({"seed": "1"}, TypeError, r"^sample: seed must be an int64 CUDA tensor, an int or None, got str$"),
    ({"seed": 1, "offset": 1.0}, TypeError, r"^sample: offset must be an int64 CUDA tensor, an int or None"),
    ({"seed": lambda: _e(B, dtype=torch.int32), "offset": lambda: _i64(B)}, TypeError,
     r"(?s)'seed'.*Dtype mismatch: expected int64"),
    ({"seed": lambda: _i64(B + 1), "offset": lambda: _i64(B)}, ValueError,
     r"sampling: seed must have one element per output row \(4\) or one for all rows, got 5"),
    # sample advances each request's offset, so it needs one per row
    ({"seed": lambda: _i64(1), "offset": lambda: _i64(1)}, ValueError,
     r"sampling: offset must have one element per output row \(4\), got 1"),
    ({"out": lambda: _e(B)}, TypeError, r"(?s)'out'.*Dtype mismatch: expected one of \[int32, int64\]"),
    ({"out": lambda: _e(B + 1, dtype=torch.int32)}, ValueError, r"(?s)'out'.*Size mismatch"),
    ({"enable_pdl": "yes"}, TypeError, r"^sample: enable_pdl must be a bool or None, got str$"),
]  # fmt: skip


def _value(v):
    return v() if callable(v) else v


@pytest.mark.parametrize(("overrides", "error", "match"), SAMPLE_BAD)
def test_sample_bad_inputs(overrides, error: type[Exception], match: str) -> None:
    with fake_cuda():
        args = {"logits": _e(B, V)} | {name: _value(v) for name, v in overrides.items()}
        logits = args.pop("logits")
        with pytest.raises(error, match=match):
            jit_kernel.sample(logits, **args)


FLASHINFER_BAD = [
    (lambda: sampling.top_k_top_p_sampling_from_logits(_e(B, V), 5, 0.9, filter_apply_order="top_p_first"),
     ValueError, r"filter_apply_order must be 'top_k_first' or 'joint', got 'top_p_first'"),
    (lambda: sampling.top_k_sampling_from_probs(_e(B, V), 0), ValueError, r"sampling: top_k must be at least 1"),
    (lambda: sampling.top_p_sampling_from_probs(_e(B, V, dtype=torch.int64), 0.5), TypeError,
     r"top_p_sampling_from_probs: probs must be one of \(float16"),
    (lambda: sampling.sampling_from_probs(_e(B, V), indices=_e(3)), TypeError,
     r"(?s)'indices'.*Dtype mismatch: expected one of \[int32, int64\]"),
    (lambda: sampling.sampling_from_probs(_e(B, V), indices=[0, 1]), TypeError,
     r"sampling_from_probs: indices must be a torch\.Tensor or None, got list"),
    (lambda: sampling.top_k_renorm_probs(_e(B, V), _e(B + 2, dtype=torch.int32)), ValueError,
     r"(?s)'top_k'.*Size mismatch"),
    (lambda: sampling.top_p_renorm_probs(_e(B, V), 2.0), ValueError, r"sampling: top_p must be in \(0, 1\]"),
    (lambda: sampling.top_k_mask_logits(_e(B), 3), ValueError, r"top_k_mask_logits: logits must have 2 dimensions"),
    (lambda: jit_kernel.mask_logits(_e(B, V), out=_e(B, V, dtype=torch.bfloat16)), TypeError,
     r"(?s)'out'.*Dtype mismatch"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "match"), FLASHINFER_BAD)
def test_flashinfer_entry_points_bad_inputs(call, error: type[Exception], match: str) -> None:
    with fake_cuda(), pytest.raises(error, match=match):
        call()


def test_valid_fake_calls() -> None:
    """The launcher accepts what the ops document: every parameter form, dtype, output form."""
    with fake_cuda():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            logits = _e(B, V, dtype=dtype)
            ids = jit_kernel.sample(logits, seed=7)  # (without a seed, torch draws one on the device)
            assert ids.shape == (B,) and ids.dtype == torch.int32
            ids, logprobs = jit_kernel.sample(
                logits,
                temperature=_e(B),
                top_k=_e(B, dtype=torch.int64),
                top_p=_e(B),
                min_p=0.1,
                seed=_i64(B),
                offset=_i64(B),
                return_logprobs=True,
            )
            assert logprobs.shape == (B,) and logprobs.dtype == torch.float32
            out = _e(B, dtype=torch.int64)
            assert jit_kernel.sample(logits, temperature=0.0, top_k=_e(B, dtype=torch.int32), seed=3, out=out) is out
            assert jit_kernel.mask_logits(logits, temperature=0.7, top_p=0.9).dtype == dtype
            assert sampling.top_k_renorm_probs(logits, 5).shape == (B, V)
        wide = torch.empty_strided((B, V), (2 * V, 1), device="cuda")  # rows at a stride (fake slicing needs a GPU)
        assert jit_kernel.sample(wide, top_k=3, seed=1, offset=2).shape == (B,)
        samples, valid = sampling.top_k_top_p_sampling_from_probs(
            _e(2, V),
            _e(5, dtype=torch.int32),
            0.5,
            indices=_e(5, dtype=torch.int64),
            seed=0,
            offset=0,
            return_valid=True,
        )
        assert samples.shape == (5,) and samples.dtype == torch.int64 and valid.dtype == torch.bool
        seeds = _i64(1)
        assert sampling.sampling_from_logits(_e(B, V), seed=seeds, offset=_i64(1)).shape == (B,)
        assert jit_kernel.sample(_e(0, V), seed=0).shape == (0,)


def test_registered_ops_declare_what_they_write() -> None:
    draw = torch.ops.jit_kernel.sample.default._schema
    filtered = torch.ops.jit_kernel.sampling_filter.default._schema
    assert [a.name for a in draw.arguments if a.alias_info and a.alias_info.is_write] == ["out", "logprobs", "offset"]
    assert [a.name for a in filtered.arguments if a.alias_info and a.alias_info.is_write] == ["out"]


# FlashInfer 0.7.2's signatures (flashinfer/sampling.py): code written for them runs unchanged.
_DRAW = "deterministic=True, generator=None, check_nan=False, seed=None, offset=None"
_ORDER = "indices=None, filter_apply_order='top_k_first'"
FLASHINFER_SIGNATURES = {
    "sampling_from_logits": f"logits, indices=None, {_DRAW}",
    "sampling_from_probs": f"probs, indices=None, {_DRAW}, return_valid=False",
    "top_p_sampling_from_probs": f"probs, top_p, indices=None, {_DRAW}, return_valid=False",
    "top_k_sampling_from_probs": f"probs, top_k, indices=None, {_DRAW}, return_valid=False",
    "min_p_sampling_from_probs": f"probs, min_p, indices=None, {_DRAW}, return_valid=False",
    "top_k_top_p_sampling_from_logits": f"logits, top_k, top_p, {_ORDER}, {_DRAW}",
    "top_k_top_p_sampling_from_probs": f"probs, top_k, top_p, {_ORDER}, {_DRAW}, return_valid=False",
    "top_p_renorm_probs": "probs, top_p, is_deterministic=False",
    "top_k_renorm_probs": "probs, top_k, is_deterministic=False",
    "top_k_mask_logits": "logits, top_k",
}


@pytest.mark.parametrize("name", sorted(FLASHINFER_SIGNATURES))
def test_flashinfer_signatures(name: str) -> None:
    def plain(parameter: inspect.Parameter) -> str:
        if parameter.default is inspect.Parameter.empty:
            return parameter.name
        return f"{parameter.name}={parameter.default!r}"

    for function in (getattr(sampling, name), getattr(jit_kernel, name)):
        signature = ", ".join(plain(p) for p in inspect.signature(function).parameters.values())
        assert signature == FLASHINFER_SIGNATURES[name]


def test_sampling_module_mirrors_flashinfer() -> None:
    """``from jit_kernel import sampling`` stands in for ``from flashinfer import sampling``."""
    for name in (*FLASHINFER_SIGNATURES, "chain_speculative_sampling", "sample", "mask_logits"):
        assert callable(getattr(sampling, name)), name
        assert getattr(jit_kernel, name) is not None


def test_family_spec() -> None:
    assert SAMPLING in ALL_FAMILIES
    assert {config[0] for config in SAMPLING.prebuilt} == {"fp32_t", "bf16_t", "fp16_t"}


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="no nvcc")
def test_philox_known_answers(tmp_path: Path) -> None:
    """Philox4x32-10 (include/sgl_kernel/philox.cuh, host side) against Random123's known-answer
    vectors, and draw()'s counter layout (offset in the low words, the stream index in the high)."""
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "kat.cu"
    source.write_text(
        "#include <sgl_kernel/philox.cuh>\n#include <cstdio>\n"
        "using namespace device::philox;\n"
        'static void show(Words w) { std::printf("%08x %08x %08x %08x\\n", w.x, w.y, w.z, w.w); }\n'
        "int main() {\n"
        "  show(philox4x32_10({0, 0, 0, 0}, 0, 0));\n"
        "  show(philox4x32_10({~0u, ~0u, ~0u, ~0u}, ~0u, ~0u));\n"
        "  show(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u));\n"
        "  show(draw(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull));\n"
        '  std::printf("%.9g\\n", uniform01(~0u));\n'
        "}\n"
    )
    binary = tmp_path / "kat"
    subprocess.run(
        [nvcc, "-std=c++17", f"-I{ROOT / 'include'}", "-o", str(binary), str(source)], check=True, capture_output=True
    )
    lines = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.split("\n")
    words = [[int(word, 16) for word in line.split()] for line in lines[:4]]
    assert words == [
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ]
    assert lines[4] == "0.99999994"
