from __future__ import annotations

import pytest
import torch

from jit_kernel import CPPArgList, make_cpp_args


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (128, "128"),
        (-3, "-3"),
        (2**40, "1099511627776"),
        (0.5, "0.5"),
        (1e-06, "1e-06"),
        (2.0, "2.0"),
        (torch.float16, "fp16_t"),
        (torch.bfloat16, "bf16_t"),
        (torch.float32, "fp32_t"),
        (torch.float8_e4m3fn, "fp8_e4m3_t"),
        (torch.float8_e5m2, "fp8_e5m2_t"),
        (torch.int8, "int8_t"),
        (torch.int16, "int16_t"),
        (torch.int32, "int32_t"),
        (torch.int64, "int64_t"),
        (torch.uint8, "uint8_t"),
        (torch.uint16, "uint16_t"),
        (torch.uint32, "uint32_t"),
        (torch.uint64, "uint64_t"),
    ],
)
def test_conversion_table(value: object, expected: str) -> None:
    assert make_cpp_args(value) == [expected]  # type: ignore[arg-type]


def test_str_joins_with_comma_space() -> None:
    args = make_cpp_args(128, 4, True, torch.bfloat16)
    assert isinstance(args, CPPArgList)
    assert str(args) == "128, 4, true, bf16_t"
    assert f"Kernel<{args}>" == "Kernel<128, 4, true, bf16_t>"
    assert str(make_cpp_args()) == ""


@pytest.mark.parametrize(
    ("value", "type_name"),
    [("fp16_t", "str"), (None, "NoneType"), ([1], "list"), (1 + 2j, "complex")],
)
def test_unsupported_type_raises_type_error_naming_it(value: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=type_name):
        make_cpp_args(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64, torch.bool])
def test_unsupported_dtype_raises_type_error(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=str(dtype)):
        make_cpp_args(dtype)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_float_has_no_literal(value: float) -> None:
    with pytest.raises(ValueError, match="no C\\+\\+ literal"):
        make_cpp_args(value)
