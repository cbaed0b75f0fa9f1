from __future__ import annotations

import torch

from jit_kernel import cache_once


def test_caches_per_argument_tuple_like_lru_cache() -> None:
    calls: list[tuple[object, ...]] = []

    @cache_once
    def compute(a: int, b: int = 0) -> int:
        calls.append((a, b))
        return a * 10 + b

    assert compute(1) == 10
    assert compute(1) == 10
    assert compute(1, b=2) == 12
    assert compute(1, b=2) == 12
    assert compute(2) == 20
    assert calls == [(1, 0), (1, 2), (2, 0)]
    assert compute.__name__ == "compute"


def test_works_inside_torch_compile_fullgraph() -> None:
    calls: list[int] = []

    @cache_once
    def factor(n: int) -> float:
        calls.append(n)
        return n * 0.5

    factor(3)  # warm, as a module loader would be before serving

    @torch.compile(fullgraph=True, backend="eager")
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * factor(3) + factor(4)

    x = torch.ones(4)
    torch.testing.assert_close(scaled(x), x * 1.5 + 2.0)
    torch.testing.assert_close(scaled(x + 1), (x + 1) * 1.5 + 2.0)
    assert factor(4) == 2.0
    assert calls.count(3) == 1
    assert calls.count(4) == 1
