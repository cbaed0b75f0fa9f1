"""jit_kernel.integrations.transformers' sampling filters for ``generate()``: JitKernelLogitsProcessor
and logits_processor(generation_config).

CPU tests: argument checks; the filters read from a GenerationConfig as generate() reads them; the
config copy leaves generate() no warper of its own to add; on CPU scores the processor (its torch
reference) equals transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper and
MinPLogitsWarper chain on constructed rows whose thresholds lie clear of rounding, and where the two
differ (ties at the top-p cut, temperature 0, invalid rows) it gives jit_kernel's semantics; a CPU
generate() with the processor draws the same tokens as generate() with transformers' warpers under
one seed. GPU tests: the processor on ``mask_logits`` against the torch reference on random rows,
and a sampled generate() of a tiny Llama on CUDA, reproducible under ``torch.manual_seed``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GenerationConfig, LlamaForCausalLM  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import jit_kernel  # noqa: E402
from jit_kernel.integrations import transformers as jt  # noqa: E402
from jit_kernel.integrations.transformers import sampling as jt_sampling  # noqa: E402
from test_integration_transformers import tiny_config  # noqa: E402

WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper)
VOCAB = 128


def tiny_llama(vocab: int = VOCAB, seed: int = 0) -> LlamaForCausalLM:
    """The integration tests' tiny Llama (2 layers, hidden 64), built from its config: no download."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config("llama", vocab_size=vocab)).eval()


def prompt(batch: int = 2, length: int = 6, vocab: int = VOCAB, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def transformers_chain(temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None) -> Any:
    """The warpers transformers' _get_logits_processor adds for these values, in its order."""
    chain = LogitsProcessorList()
    if temperature is not None and temperature != 1.0:
        chain.append(TemperatureLogitsWarper(temperature))
    if top_k is not None and top_k != 0:
        chain.append(TopKLogitsWarper(top_k))
    if top_p is not None and top_p < 1.0:
        chain.append(TopPLogitsWarper(top_p))
    if min_p is not None:
        chain.append(MinPLogitsWarper(min_p))
    return chain


def built_processors(model: Any, config: GenerationConfig, custom: Any = None, **kwargs: Any) -> list[Any]:
    """The processors generate() runs for ``config`` (and ``kwargs``, as generate()'s arguments)."""
    prepared, _ = model._prepare_generation_config(config, **kwargs)
    return list(
        model._get_logits_processor(
            generation_config=prepared,
            input_ids_seq_length=6,
            encoder_input_ids=None,
            prefix_allowed_tokens_fn=None,
            logits_processor=custom,
            device="cpu",
            model_kwargs={},
        )
    )


# ---------------------------------------------------------------------------------------------
# Arguments

BAD = [
    ({"temperature": -1.0}, ValueError, r"temperature must be a finite float >= 0 \(0: greedy\), got -1\.0"),
    ({"temperature": math.nan}, ValueError, r"temperature must be a finite float >= 0"),
    ({"temperature": math.inf}, ValueError, r"temperature must be a finite float >= 0"),
    ({"temperature": "0.7"}, TypeError, r"temperature must be a float or None, got str"),
    ({"top_k": 0}, ValueError, r"top_k must be at least 1 \(None: off\), got 0"),
    ({"top_k": -5}, ValueError, r"top_k must be at least 1"),
    ({"top_k": 2.0}, TypeError, r"top_k must be an int or None, got float"),
    ({"top_k": True}, TypeError, r"top_k must be an int or None, got bool"),
    ({"top_p": 0.0}, ValueError, r"top_p must be in \(0, 1\] \(None: off\), got 0\.0"),
    ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_p": math.nan}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"top_p": False}, TypeError, r"top_p must be a float or None, got bool"),
    ({"min_p": -0.1}, ValueError, r"min_p must be in \[0, 1\] \(None: off\), got -0\.1"),
    ({"min_p": 1.01}, ValueError, r"min_p must be in \[0, 1\]"),
    ({"min_p": torch.tensor(0.1)}, TypeError, r"min_p must be a float or None, got Tensor"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD)
def test_processor_rejects_values_mask_logits_rejects(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=r"^JitKernelLogitsProcessor: " + match):
        jt.JitKernelLogitsProcessor(**kwargs)


def test_processor_accepts_the_ends_of_each_range() -> None:
    p = jt.JitKernelLogitsProcessor(temperature=0, top_k=1, top_p=1, min_p=1)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (0.0, 1, None, 1.0)  # top_p 1 keeps every token: off
    p = jt.JitKernelLogitsProcessor(temperature=2, top_p=0.5, min_p=0)
    assert (p.temperature, p.top_k, p.top_p, p.min_p) == (2.0, None, 0.5, None)  # min_p 0 keeps every token: off
    assert isinstance(p.temperature, float) and isinstance(p.top_p, float)
    assert repr(p) == "JitKernelLogitsProcessor(temperature=2.0, top_k=None, top_p=0.5, min_p=None)"
    assert isinstance(p, transformers.LogitsProcessor)
    assert p.supports_continuous_batching is False


def test_exported_from_the_package() -> None:
    assert jt.JitKernelLogitsProcessor is jt_sampling.JitKernelLogitsProcessor
    assert jt.logits_processor is jt_sampling.logits_processor
    assert {"JitKernelLogitsProcessor", "logits_processor"} <= set(jt.__all__)


# ---------------------------------------------------------------------------------------------
# Reading a GenerationConfig


def params(processors: Any) -> tuple[Any, ...]:
    (p,) = processors
    assert isinstance(p, jt.JitKernelLogitsProcessor)
    return p.temperature, p.top_k, p.top_p, p.min_p


def test_logits_processor_reads_the_filters_and_leaves_the_config_alone() -> None:
    source = GenerationConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, max_new_tokens=5)
    before = source.to_dict()
    processors, config = jt.logits_processor(source)
    assert isinstance(processors, LogitsProcessorList)
    assert params(processors) == (0.7, 20, 0.9, 0.05)
    assert source.to_dict() == before and config is not source
    assert (config.temperature, config.top_k, config.top_p, config.min_p) == (1.0, 0, 1.0, None)
    assert config.do_sample is True and config.max_new_tokens == 5


def test_unset_fields_take_transformers_defaults() -> None:
    # generate() fills unset fields with temperature 1, top_k 50, top_p 1 (min_p stays off).
    assert params(jt.logits_processor(GenerationConfig())[0]) == (1.0, 50, None, None)
    assert params(jt.logits_processor(GenerationConfig(top_k=0, top_p=1.0))[0]) == (1.0, None, None, None)


def test_overrides_are_set_on_the_copy_first() -> None:
    source = GenerationConfig(top_k=20)
    processors, config = jt.logits_processor(source, do_sample=True, top_p=0.8, temperature=0.5)
    assert params(processors) == (0.5, 20, 0.8, None)
    assert config.do_sample is True and source.do_sample is None and source.top_p is None
    with pytest.raises(ValueError, match=r"^logits_processor: not generation parameters: bogus, nope$"):
        jt.logits_processor(source, nope=1, bogus=2)


def test_logits_processor_rejects_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"^logits_processor: top_h \(=0\.4\) has no jit_kernel filter"):
        jt.logits_processor(GenerationConfig(do_sample=True, top_h=0.4))
    with pytest.raises(ValueError, match=r"^JitKernelLogitsProcessor: top_k must be at least 1"):
        jt.logits_processor(GenerationConfig(do_sample=True, top_k=-1))
    with pytest.raises(TypeError, match=r"^logits_processor: generation_config must be a transformers Generation"):
        jt.logits_processor({"top_k": 5})  # type: ignore[arg-type]


def test_config_copy_leaves_generate_no_warper_to_add() -> None:
    model = tiny_llama()
    full = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    # The model's own config (every field unset: top_k 50 by default) and one with all four filters.
    for source, overrides in ((model.generation_config, {"do_sample": True}), (GenerationConfig(**full), {})):
        theirs = built_processors(model, GenerationConfig(**{**source.to_dict(), **overrides}))
        assert any(isinstance(p, TopKLogitsWarper) for p in theirs)  # what the copy must turn off
        processors, config = jt.logits_processor(source, **overrides)
        ours = built_processors(model, config, processors)
        assert not any(isinstance(p, WARPERS) for p in ours), ours
        assert [type(p) for p in ours] == [jt.JitKernelLogitsProcessor]
        # The brief form: do_sample passed to generate() beside the config.
        processors, config = jt.logits_processor(source)
        ours = built_processors(model, config, processors, do_sample=True)
        assert [type(p) for p in ours] == [jt.JitKernelLogitsProcessor]


def test_copy_runs_after_transformers_other_processors() -> None:
    model = tiny_llama()
    processors, config = jt.logits_processor(model.generation_config, do_sample=True, repetition_penalty=1.2)
    ours = built_processors(model, config, processors)
    assert [type(p).__name__ for p in ours] == ["RepetitionPenaltyLogitsProcessor", "JitKernelLogitsProcessor"]


# ---------------------------------------------------------------------------------------------
# The filters on CPU scores, against transformers' warpers


def constructed_rows() -> torch.Tensor:
    """Rows of 64 logits evenly spaced, 0.2 to 0.35 apart by row (no two probabilities alike),
    shuffled and shifted; row 2 has two tokens tied at the 10th largest logit, row 3 has -inf entries
    (as a bad-words processor leaves them)."""
    g = torch.Generator().manual_seed(7)
    steps = torch.arange(64, dtype=torch.float32)
    rows = torch.stack(
        [
            (3.0 + shift - steps * gap)[torch.randperm(64, generator=g)]
            for gap, shift in ((0.25, 0.0), (0.2, -1.5), (0.35, 0.75), (0.3, 2.0))
        ]
    )
    order = rows[2].argsort(descending=True)
    rows[2, order[10]] = rows[2, order[9]]
    rows[3, order[:5]] = -math.inf
    return rows


def assert_clear(
    scores: torch.Tensor, temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None
) -> None:
    """The test's own check that no threshold is within rounding: top_p at least 1e-3 from every
    cumulative mass of the (temperature, top-k) distribution, log(min_p) at least 1e-3 from every
    log(p / max p) of the distribution top-p leaves."""
    if top_p is not None:
        masked = jt_sampling.torch_mask_logits(scores, temperature=temperature, top_k=top_k)
        q = torch.softmax(masked.double(), -1).sort(-1, descending=True).values
        assert float((q.cumsum(-1) - top_p).abs().min()) > 1e-3
    if min_p is not None:
        masked = jt_sampling.torch_mask_logits(scores, temperature=temperature, top_k=top_k, top_p=top_p).double()
        log_ratio = masked - masked.amax(-1, keepdim=True)
        assert float((log_ratio - math.log(min_p)).abs().min()) > 1e-3


CASES = [
    (None, None, None, None),
    (0.7, None, None, None),
    (None, 10, None, None),
    (None, None, 0.8, None),
    (None, None, None, 0.3),
    (1.3, 12, None, None),
    (0.6, None, 0.9, None),
    (None, 30, 0.55, None),
    (0.8, 25, 0.85, 0.1),
    (1.5, None, 0.9, 0.15),
    (0.5, 64, 0.92, 0.2),
    (2.0, 100, 0.35, 0.5),
]


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), CASES)
def test_cpu_processor_equals_transformers_warpers(
    temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None
) -> None:
    scores = constructed_rows()
    assert_clear(scores, temperature, top_k, top_p, min_p)
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    ours = jt.JitKernelLogitsProcessor(temperature, top_k, top_p, min_p)(ids, scores.clone())
    theirs = transformers_chain(temperature, top_k, top_p, min_p)(ids, scores.clone())
    assert ours.dtype == scores.dtype
    assert torch.equal(ours, theirs)
    assert bool((ours > -math.inf).sum(-1).ge(1).all())


def test_cpu_processor_runs_the_torch_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("mask_logits called on CPU scores")

    monkeypatch.setattr(jit_kernel, "mask_logits", refuse)
    scores = constructed_rows().to(torch.bfloat16)
    out = jt.JitKernelLogitsProcessor(temperature=0.5, top_k=8)(torch.zeros(4, 1, dtype=torch.long), scores)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, TopKLogitsWarper(8)(None, TemperatureLogitsWarper(0.5)(None, scores)))


# Where jit_kernel's semantics are not transformers'.


def test_top_p_keeps_every_token_tied_at_the_cut() -> None:
    # p = (0.4, 0.2, 0.2, 0.1, 0.1): top_p 0.7 is reached inside the tied pair, so both are kept;
    # transformers keeps whichever of the pair its sort puts on the kept side, or both.
    scores = torch.tensor([[0.4, 0.2, 0.2, 0.1, 0.1]]).log()
    out = jt.JitKernelLogitsProcessor(top_p=0.7)(None, scores)
    assert (out > -math.inf).tolist() == [[True, True, True, False, False]]
    # The same with a tie at the k-th largest logit (transformers keeps ties there too).
    out = jt.JitKernelLogitsProcessor(top_k=4)(None, scores)
    assert (out > -math.inf).tolist() == [[True, True, True, True, True]]


def test_temperature_zero_keeps_the_argmax_only() -> None:
    # transformers' temperature warper rejects 0; mask_logits takes it as greedy: the raw argmax logit
    # (the lowest index among ties), -inf elsewhere, whatever the other filters.
    scores = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, -1.0, 0.25, 0.5]])
    out = jt.JitKernelLogitsProcessor(temperature=0.0, top_k=3, top_p=0.5)(None, scores)
    inf = -math.inf
    assert out.tolist() == [[inf, 3.0, inf, inf], [0.5, inf, inf, inf]]
    with pytest.raises(ValueError):
        TemperatureLogitsWarper(0.0)


def test_invalid_rows_come_back_nan() -> None:
    inf = math.inf
    scores = torch.tensor([[1.0, math.nan, 0.0], [1.0, inf, 0.0], [-inf, -inf, -inf], [1.0, 2.0, -inf]])
    out = jt.JitKernelLogitsProcessor(temperature=0.5, top_p=0.9)(None, scores)
    assert bool(out[:3].isnan().all())
    assert out[3].tolist() == [2.0, 4.0, -inf]


# ---------------------------------------------------------------------------------------------
# generate() on the CPU


def sampling_config(**values: Any) -> GenerationConfig:
    return GenerationConfig(do_sample=True, max_new_tokens=10, pad_token_id=0, eos_token_id=1, **values)


@pytest.mark.parametrize(
    "values",
    [dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05), dict(top_p=0.8), dict(temperature=1.4, min_p=0.2)],
)
def test_cpu_generate_draws_what_transformers_warpers_draw(values: dict[str, Any]) -> None:
    model = tiny_llama()
    with torch.no_grad():  # sharper rows than a random init gives, so the filters drop tokens
        model.lm_head.weight.mul_(10.0)
    ids = prompt()
    mask = torch.ones_like(ids)
    source = sampling_config(**values)
    torch.manual_seed(123)
    expected = model.generate(ids, generation_config=source, attention_mask=mask)
    processors, config = jt.logits_processor(source)
    torch.manual_seed(123)
    got = model.generate(ids, generation_config=config, logits_processor=processors, attention_mask=mask)
    assert got.shape[1] > ids.shape[1]
    assert torch.equal(got, expected)
    # The rows are sharp enough that the draws tell: with no filters, or with the filters applied
    # twice (the processor beside the source config's own warpers), the tokens are not the same.
    torch.manual_seed(123)
    assert not torch.equal(model.generate(ids, generation_config=sampling_config(), attention_mask=mask), expected)
    torch.manual_seed(123)
    twice = model.generate(ids, generation_config=source, logits_processor=processors, attention_mask=mask)
    assert not torch.equal(twice, expected)


# ---------------------------------------------------------------------------------------------
# GPU: mask_logits


def random_rows(rows: int, vocab: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal logits (sd 2), some ties from the dtype's rounding; row 1 has -inf entries."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g) * 2.0).to(dtype)
    x[1, ::3] = -math.inf
    return x


def picked(x: torch.Tensor, temperature: float | None, top_k: int | None, top_p: bool, min_p: bool) -> Any:
    """(top_p, min_p) for the row ``x [1, V]``: values clear of the rounding of the kernel's
    fixed-point masses (tests/test_sampling.py's pickers), near 0.8 and 0.05."""
    from test_sampling import safe_min_p, safe_top_p

    p = m = None
    if top_p:
        w = torch.softmax(jt_sampling.torch_mask_logits(x, temperature=temperature, top_k=top_k).double(), -1)
        p = float(safe_top_p(w, 0.8))
    if min_p:
        masked = jt_sampling.torch_mask_logits(x, temperature=temperature, top_k=top_k, top_p=p)
        m = float(safe_min_p(torch.softmax(masked.double(), -1), 0.05))
    return p, m


GPU_CASES = [
    (None, None, False, False),
    (0.5, None, False, False),
    (None, 40, False, False),
    (2.0, 200, False, False),
    (None, None, True, False),
    (0.5, None, False, True),
    (2.0, 50, True, False),
    (0.5, 500, True, True),
    (None, 10_000, True, True),
    (0.0, 20, True, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1000, 32000, 151936])
@pytest.mark.parametrize(("temperature", "top_k", "top_p", "min_p"), GPU_CASES)
def test_gpu_processor_matches_the_torch_reference(
    temperature: float | None, top_k: int | None, top_p: bool, min_p: bool, vocab: int, dtype: torch.dtype
) -> None:
    # Temperatures are powers of two, so logits / temperature is exact whichever way it is computed.
    x = random_rows(4, vocab, dtype, seed=vocab)
    for row in range(x.shape[0]):
        xr = x[row : row + 1]
        p, m = picked(xr, temperature, top_k, top_p, min_p)
        processor = jt.JitKernelLogitsProcessor(temperature, top_k, p, m)
        got = processor(None, xr.cuda())
        expected = jt_sampling.torch_mask_logits(xr, temperature=temperature, top_k=top_k, top_p=p, min_p=m)
        assert got.dtype == dtype and got.is_cuda
        kept = got.cpu() > -math.inf
        assert torch.equal(kept, expected > -math.inf), (row, int((kept != (expected > -math.inf)).sum()))
        assert torch.equal(got.cpu(), expected), row


@pytest.mark.gpu
def test_gpu_processor_batch_and_invalid_rows() -> None:
    x = random_rows(6, 4096, torch.float32, seed=3)
    x[4, 7] = math.nan
    x[5] = -math.inf
    processor = jt.JitKernelLogitsProcessor(temperature=0.5, top_k=64)
    got = processor(None, x.cuda())
    expected = jt_sampling.torch_mask_logits(x, temperature=0.5, top_k=64)
    assert torch.equal(got[:4].cpu(), expected[:4])
    assert bool(got[4:].isnan().all()) and bool(expected[4:].isnan().all())


# ---------------------------------------------------------------------------------------------
# GPU: generate()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_generate_samples_through_mask_logits_reproducibly(dtype: torch.dtype, monkeypatch: Any) -> None:
    calls = []
    launch = jit_kernel.mask_logits

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(args[0].shape)
        return launch(*args, **kwargs)

    monkeypatch.setattr(jit_kernel, "mask_logits", counted)
    vocab = 2048
    model = tiny_llama(vocab).to(dtype).cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    ids = prompt(batch=3, length=8, vocab=vocab).cuda()
    processors, config = jt.logits_processor(
        model.generation_config,
        do_sample=True,
        temperature=0.8,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        max_new_tokens=12,
        min_new_tokens=12,  # no early eos: every row draws 12 tokens
        pad_token_id=0,
    )
    kwargs = dict(generation_config=config, logits_processor=processors, attention_mask=torch.ones_like(ids))
    outs = []
    for _ in range(2):
        torch.manual_seed(2024)
        with torch.inference_mode():
            outs.append(model.generate(ids, **kwargs))
    first, second = outs
    assert first.shape == (3, 8 + 12)
    assert torch.equal(first[:, :8], ids)
    new = first[:, 8:]
    assert bool(((new >= 0) & (new < vocab)).all())
    assert torch.equal(first, second)
    assert len(calls) == 2 * 12 and all(shape == (3, vocab) for shape in calls)
    torch.manual_seed(2025)
    with torch.inference_mode():
        other = model.generate(ids, **kwargs)
    assert not torch.equal(other, first)  # the draw follows torch's generator
