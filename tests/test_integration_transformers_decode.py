"""jit_kernel.integrations.transformers at decode sizes: which linear op a patched model calls at which
row count and dtype, how a one-token step's attention runs (the backend's ``one_token_attention``:
``decode_attention`` over the StaticCache, SDPA with ``enable_gqa``, or the packed query heads), when
``decode_attention`` must not run (a mask whose visible keys are not the prefix of the cache, as
left padding gives), and bench_model's weights' read.

CPU tests run the torch reference backend (its ``decode_attention`` is the fp32 reference of the
op) with each choice forced, counting the ops called. GPU tests run jit_kernel's ops with each choice
forced and compare with the unpatched model at batch 1 and 4 on a StaticCache.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, StaticCache  # noqa: E402

from jit_kernel.integrations import transformers as jt  # noqa: E402
from jit_kernel.integrations.transformers import backends as jt_backends  # noqa: E402
from jit_kernel.integrations.transformers import forwards as jt_forwards  # noqa: E402
from jit_kernel.integrations.transformers.reference import _torch_decode_attention  # noqa: E402

CHOICES = jt_backends.ONE_TOKEN_ATTENTION_CHOICES
VOCAB = 128


def config_of(model_type: str = "llama", **overrides: Any) -> Any:
    """2 layers, hidden 128, 4 query heads and 2 KV heads of 64 (a head dim decode_attention takes)."""
    values: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    if model_type == "qwen3_moe":
        values.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    values.update(overrides)
    config = AutoConfig.for_model(model_type, **values)
    config._attn_implementation = "sdpa"
    return config


def model_of(model_type: str = "llama", dtype: torch.dtype = torch.float32, **overrides: Any) -> Any:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_of(model_type, **overrides), dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


class Recorder:
    """A backend (``base`` with ``one_token_attention=choice``) whose linear and decode_attention calls
    are counted, and the lengths each decode_attention call got kept."""

    def __init__(self, choice: str, base: jt.Backend = jt.TORCH) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.lengths: list[torch.Tensor] = []
        assert base.decode_attention is not None
        attend, linear = base.decode_attention, base.linear

        def counted_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            self.calls["linear"] += 1
            return linear(x, w, b)

        def counted_attention(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, scale: float
        ) -> Any:
            self.calls["decode_attention"] += 1
            self.lengths.append(lens.clone())
            assert lens.shape == (q.shape[0],) and lens.stride() == (1,)
            return attend(q, k, v, lens, scale)

        self.backend = dataclasses.replace(
            base, name=f"{base.name}_{choice}", one_token_attention=choice, linear=counted_linear,
            decode_attention=counted_attention,
        )  # fmt: skip


def cache_keyword(model: Any) -> str:
    from jit_kernel.benchmark.bench_model import cache_keyword as keyword

    return keyword(model)


def static_steps(
    model: Any, prompt: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, max_len: int = 64
) -> torch.Tensor:
    """Last-position logits (fp32) of a prefill of ``prompt`` on a StaticCache of ``max_len``, then of
    one-token steps feeding ``tokens [B, steps]`` (the same tokens for every model compared), the
    2D mask extended with attended tokens as generate extends it: ``[B, 1 + steps, vocab]``."""
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    keyword = cache_keyword(model)
    out = []
    with torch.inference_mode():
        logits = model(prompt, attention_mask=mask, use_cache=True, **{keyword: cache}).logits
        out.append(logits[:, -1].float())
        for i in range(tokens.shape[1]):
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            logits = model(tokens[:, i : i + 1], attention_mask=mask, use_cache=True, **{keyword: cache}).logits
            out.append(logits[:, -1].float())
    return torch.stack(out, dim=1)


def random_ids(batch: int, length: int, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_close_logits(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        return
    # bf16/fp16: each row's logits within a few rounding steps of the row's scale
    scale = expected.abs().amax(dim=-1, keepdim=True)
    assert ((got - expected).abs() <= 0.03 * scale + 1e-3).all(), (got - expected).abs().max()
    cosine = F.cosine_similarity(got.flatten(0, -2), expected.flatten(0, -2), dim=-1)
    assert cosine.min() > 0.999, cosine.min()


# ---------------------------------------------------------------------------------------------
# The choice: one constant, carried by every backend


def test_one_token_attention_is_one_constant_every_backend_carries() -> None:
    assert jt_backends.ONE_TOKEN_ATTENTION in CHOICES
    assert jt_backends.ONE_TOKEN_ATTENTION == "decode_attention"
    assert jt.TORCH.one_token_attention == jt_backends.ONE_TOKEN_ATTENTION
    assert jt_backends._jit_kernel_backend().one_token_attention == jt_backends.ONE_TOKEN_ATTENTION


def test_unknown_one_token_attention_names_the_choices() -> None:
    with pytest.raises(ValueError, match="one_token_attention must be one of decode_attention, sdpa_gqa, packed"):
        dataclasses.replace(jt.TORCH, one_token_attention="flash")


# ---------------------------------------------------------------------------------------------
# Linear layers: decode_linear at decode sizes, F.linear above, in jit_kernel's backend only


@pytest.mark.parametrize(
    ("shape", "dtype", "op"),
    [
        ((1, 64), torch.bfloat16, "decode_linear"),
        ((16, 64), torch.float16, "decode_linear"),
        ((4, 1, 64), torch.bfloat16, "decode_linear"),  # [batch, 1 token, hidden]: 4 rows
        ((2, 8, 64), torch.bfloat16, "decode_linear"),  # 16 rows
        ((17, 64), torch.bfloat16, "linear"),
        ((2, 9, 64), torch.bfloat16, "linear"),  # 18 rows: a prefill
        ((1, 64), torch.float32, "linear"),
        ((1, 64), torch.float64, "linear"),
    ],
)
def test_jit_kernel_linear_calls_decode_linear_up_to_16_rows_of_bf16_fp16(
    monkeypatch: Any, shape: tuple[int, ...], dtype: torch.dtype, op: str
) -> None:
    import jit_kernel

    called: list[str] = []

    def fake(name: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            called.append(name)
            return fn(*args, **kwargs)

        return run

    real_linear = F.linear
    monkeypatch.setattr(jit_kernel, "decode_linear", fake("decode_linear", lambda x, w, b=None: real_linear(x, w, b)))
    monkeypatch.setattr(jt_backends.F, "linear", fake("linear", real_linear))
    backend = jt_backends._jit_kernel_backend()
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(32, 64, dtype=dtype)
    b = torch.randn(32, dtype=dtype)
    out = backend.linear(x, w, b)
    assert called == [op]
    assert out.shape == (*shape[:-1], 32)


def test_decode_linear_itself_sends_shapes_it_does_not_serve_to_f_linear() -> None:
    """The rule of what the kernel serves is the op's (its launcher's, asked by decode_linear_serves):
    the backend hands it every decode-size call, and a call the kernel does not take (K not a
    multiple of 8 on CUDA fakes, any call on the CPU) runs F.linear inside the op."""
    import jit_kernel
    from _norm_helpers import fake_cuda
    from jit_kernel.ops.gemm import decode_linear_serves

    x, w = torch.randn(2, 12, dtype=torch.bfloat16), torch.randn(5, 12, dtype=torch.bfloat16)
    torch.testing.assert_close(jt_backends._jit_kernel_backend().linear(x, w, None), F.linear(x, w))
    with fake_cuda():
        bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
        assert not decode_linear_serves(torch.empty(2, 12, **bf16), torch.empty(5, 12, **bf16))
        assert decode_linear_serves(torch.empty(2, 16, **bf16), torch.empty(5, 16, **bf16))
        assert not decode_linear_serves(torch.empty(17, 16, **bf16), torch.empty(5, 16, **bf16))
    assert jit_kernel.decode_linear is not F.linear


def test_torch_and_flashinfer_backends_keep_f_linear(monkeypatch: Any) -> None:
    assert jt.TORCH.linear is F.linear
    package = types.ModuleType("flashinfer")
    modules = {name: types.ModuleType(f"flashinfer.{name}") for name in ("activation", "norm", "rope")}
    for name in ("silu_and_mul", "gelu_tanh_and_mul", "gelu_and_mul"):
        setattr(modules["activation"], name, lambda x: x)
    for name, module in modules.items():
        setattr(package, name, module)
        monkeypatch.setitem(sys.modules, f"flashinfer.{name}", module)
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    flashinfer = jt.get_backend("flashinfer")
    assert flashinfer.linear is F.linear and flashinfer.decode_attention is None


@pytest.mark.parametrize(("qkv", "per_layer"), [(True, 4), (False, 6)])
def test_every_linear_layer_and_the_head_run_the_backends_linear(qkv: bool, per_layer: int) -> None:
    model = model_of()
    reference = copy.deepcopy(model)
    recorder = Recorder("sdpa_gqa")
    report = jt.apply(model, backend=recorder.backend, qkv=qkv)
    assert report.lm_head == 1
    tokens = random_ids(2, 5, 1)
    with torch.no_grad():
        got = model(tokens, use_cache=False).logits
    assert recorder.calls["linear"] == 2 * per_layer + 1  # q/k/v (merged or not), o, gate/up, down; the head
    with torch.no_grad():
        torch.testing.assert_close(got, reference(tokens, use_cache=False).logits, rtol=1e-5, atol=1e-5)


def test_router_gemm_runs_the_backends_linear() -> None:
    model = model_of("qwen3_moe")
    recorder = Recorder("sdpa_gqa")
    report = jt.apply(model, backend=recorder.backend)
    assert report.router == 2
    recorder.calls.clear()
    with torch.no_grad():
        model(random_ids(1, 3, 1), use_cache=False)
    assert recorder.calls["linear"] == 2 * (2 + 1) + 1  # qkv and o, the router; the head


def test_tied_head_is_patched_and_lm_head_option_leaves_it() -> None:
    model = model_of(tie_word_embeddings=True)
    reference = copy.deepcopy(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    recorder = Recorder("sdpa_gqa")
    assert jt.apply(model, backend=recorder.backend).lm_head == 1
    assert "forward" in model.lm_head.__dict__
    tokens = random_ids(2, 4, 2)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).logits, reference(tokens).logits, rtol=1e-5, atol=1e-5)
    other = model_of()
    report = jt.apply(other, backend="torch", lm_head=False)
    assert report.lm_head == 0 and "forward" not in other.lm_head.__dict__
    assert ("lm_head", other.lm_head) not in list(jt.patched_modules(other))


# ---------------------------------------------------------------------------------------------
# One-token attention: each choice against the unpatched model on a StaticCache


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_cache_steps_match_unpatched_with_each_choice(choice: str, batch: int, dtype: torch.dtype) -> None:
    model = model_of(dtype=dtype)
    reference = copy.deepcopy(model)
    recorder = Recorder(choice)
    assert jt.apply(model, backend=recorder.backend)
    prompt, steps = random_ids(batch, 6, 3), random_ids(batch, 5, 4)
    mask = torch.ones_like(prompt)
    expected = static_steps(reference, prompt, mask, steps)
    recorder.lengths.clear()
    got = static_steps(model, prompt, mask, steps)
    assert_close_logits(got, expected, dtype)
    layers = model.config.num_hidden_layers
    kernel_runs = choice == "decode_attention" and dtype != torch.float32  # the op takes bf16 / fp16
    assert recorder.calls["decode_attention"] == (layers * steps.shape[1] if kernel_runs else 0)
    if kernel_runs:  # every sequence's length: the cache's one write position, after the step's write
        expected_lengths = [torch.full((batch,), 6 + 1 + i) for i in range(steps.shape[1]) for _ in range(layers)]
        assert all(torch.equal(a.cpu(), b) for a, b in zip(recorder.lengths, expected_lengths, strict=True))


@pytest.mark.parametrize("choice", CHOICES)
def test_greedy_generate_with_static_cache_matches_unpatched(choice: str) -> None:
    model = model_of(dtype=torch.bfloat16)
    reference = copy.deepcopy(model)
    recorder = Recorder(choice)
    assert jt.apply(model, backend=recorder.backend)
    prompt = random_ids(4, 6, 5)
    kwargs = dict(
        attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0,
        cache_implementation="static",
    )  # fmt: skip
    expected = reference.generate(prompt, output_logits=True, return_dict_in_generate=True, **kwargs)
    got = model.generate(prompt, **kwargs)
    assert_greedy_agrees(got, expected.sequences, expected.logits, prompt.shape[1])
    runs = recorder.calls["decode_attention"]
    assert runs == (2 * 5 if choice == "decode_attention" else 0)  # 5 one-token steps after the prefill


def assert_greedy_agrees(
    got: torch.Tensor, expected: torch.Tensor, logits: tuple[torch.Tensor, ...], prompt_len: int
) -> None:
    """``got``'s tokens are ``expected``'s up to the first step where they differ, and there the
    token ``got`` chose is, by the reference's own logits, within rounding of the reference's best."""
    assert got.shape == expected.shape
    for row in range(got.shape[0]):
        for step in range(got.shape[1] - prompt_len):
            a, b = int(got[row, prompt_len + step]), int(expected[row, prompt_len + step])
            if a == b:
                continue
            scores = logits[step][row].float()
            assert scores[a] >= scores.max() - 0.03 * scores.abs().max(), (row, step, a, b)
            break


def test_left_padding_never_runs_decode_attention() -> None:
    """Left padding: a padded sequence's visible keys start after its pads, no prefix of the cache.
    The prefill's mask says so, and every one-token step runs SDPA with the mask."""
    model = model_of(dtype=torch.bfloat16)
    reference = copy.deepcopy(model)
    recorder = Recorder("decode_attention")
    assert jt.apply(model, backend=recorder.backend)
    prompt, steps = random_ids(4, 6, 6), random_ids(4, 4, 7)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0
    mask[3, :5] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    got = static_steps(model, prompt, mask, steps)
    assert recorder.calls["decode_attention"] == 0
    assert_close_logits(got, static_steps(reference, prompt, mask, steps), torch.bfloat16)
    # The same batch without padding runs it.
    recorder.calls.clear()
    static_steps(model, random_ids(4, 6, 8), torch.ones(4, 6, dtype=torch.long), steps)
    assert recorder.calls["decode_attention"] == 2 * steps.shape[1]


def test_a_verdict_is_not_taken_while_compiling(monkeypatch: Any) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cache = types.SimpleNamespace()
    static = types.SimpleNamespace(cumulative_length=torch.tensor(3), keys=torch.zeros(1, 1, 8, 4))
    jt_forwards._note_prefix(cache, static, None, 4)
    assert not hasattr(cache, jt_forwards._PREFIX)


def test_the_verdict_is_taken_once_per_mask() -> None:
    cache = types.SimpleNamespace()
    static = types.SimpleNamespace(cumulative_length=torch.tensor(3), keys=torch.zeros(2, 1, 8, 4))
    prefix = (torch.arange(8) < 3).expand(2, 1, 3, 8)
    jt_forwards._note_prefix(cache, static, prefix, 3)
    assert getattr(cache, jt_forwards._PREFIX)[1] is True
    padded = prefix.clone()
    padded[1, 0, :, 0] = False
    jt_forwards._note_prefix(cache, static, padded, 1)  # a one-token step keeps the verdict it finds
    assert getattr(cache, jt_forwards._PREFIX)[1] is True
    jt_forwards._note_prefix(cache, static, padded, 3)  # a step of several tokens takes it again
    assert getattr(cache, jt_forwards._PREFIX)[1] is False


def _mask(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool).view(len(rows), 1, 1, -1)


@pytest.mark.parametrize(
    ("mask", "prefix"),
    [
        (None, True),
        (_mask([[1, 1, 1, 0, 0, 0]]), True),
        (_mask([[1, 1, 1, 0, 0, 0]] * 4), True),
        (_mask([[1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]]), False),  # left padding
        (_mask([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]), False),  # a shorter sequence
        (_mask([[1, 1, 0, 0, 0, 0]]), False),  # fewer keys than the cache holds
        (_mask([[1, 1, 1, 1, 0, 0]]), False),  # more
        (_mask([[1, 0, 1, 0, 0, 0]]), False),  # a hole
        (torch.zeros(1, 1, 1, 6), False),  # an additive float mask is not judged
        (torch.ones(1, 2, 1, 6, dtype=torch.bool), False),  # per-head masks are not judged
        (torch.ones(1, 1, 1, 5, dtype=torch.bool), False),  # not the cache's length
    ],
)
def test_prefix_mask(mask: torch.Tensor | None, prefix: bool) -> None:
    assert jt_forwards._prefix_mask(mask, torch.tensor(3), 6) is prefix


def test_prefix_mask_reads_the_last_query_row() -> None:
    causal = torch.tril(torch.ones(3, 6, dtype=torch.bool))  # 3 prefill tokens on an empty cache of 6
    assert jt_forwards._prefix_mask(causal.view(1, 1, 3, 6), torch.tensor(3), 6)
    assert not jt_forwards._prefix_mask(causal.view(1, 1, 3, 6), torch.tensor(2), 6)


def _choice_case(choice: str, **changes: Any) -> str | None:
    module = types.SimpleNamespace(training=False, config=types.SimpleNamespace(_attn_implementation="sdpa"))
    plan = types.SimpleNamespace(q_heads=4, kv_heads=2, attention_kwargs={})
    query = torch.zeros(2, 4, 1, 64, dtype=torch.bfloat16)
    mask: torch.Tensor | None = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    cache = types.SimpleNamespace(**{jt_forwards._PREFIX: (None, True)})
    static: Any = object()
    values = {**dict(module=module, plan=plan, query=query, mask=mask, cache=cache, static=static), **changes}
    ops = dataclasses.replace(jt.TORCH, one_token_attention=choice)
    return jt_forwards._one_token_attention(values["module"], values["plan"], ops, values["query"],
                                            values["mask"], values["cache"], values["static"])  # fmt: skip


def test_one_token_attention_choices() -> None:
    assert _choice_case("decode_attention") == "decode_attention"
    assert _choice_case("packed") == "packed"
    # SDPA's enable_gqa with a mask falls back to torch's math kernel on CUDA: the model's own sdpa
    # function (None) runs a masked step, enable_gqa an unmasked one.
    assert _choice_case("sdpa_gqa") is None
    assert _choice_case("sdpa_gqa", mask=None) == "sdpa_gqa"
    for choice in CHOICES:
        assert _choice_case(choice, mask=None) == choice
        assert _choice_case(choice, query=torch.zeros(2, 4, 3, 64, dtype=torch.bfloat16)) is None  # a prefill
        training = types.SimpleNamespace(training=True, config=types.SimpleNamespace(_attn_implementation="sdpa"))
        assert _choice_case(choice, module=training) is None
        eager = types.SimpleNamespace(training=False, config=types.SimpleNamespace(_attn_implementation="eager"))
        assert _choice_case(choice, module=eager) is None


@pytest.mark.parametrize(("mask", "fallback"), [(torch.ones(2, 1, 1, 8, dtype=torch.bool), None), (None, "sdpa_gqa")])
def test_decode_attention_falls_back_to_sdpa_where_it_cannot_serve(mask: Any, fallback: str | None) -> None:
    """As sdpa_gqa: with the mask, the model's own SDPA function (None); without, enable_gqa."""
    assert _choice_case("decode_attention", mask=mask, static=None) == fallback  # not a StaticLayer
    assert _choice_case("decode_attention", mask=mask, query=torch.zeros(2, 4, 1, 64)) == fallback  # fp32
    half_96 = torch.zeros(2, 4, 1, 96, dtype=torch.float16)
    assert _choice_case("decode_attention", mask=mask, query=half_96) == fallback
    windowed = types.SimpleNamespace(q_heads=4, kv_heads=2, attention_kwargs={"sliding_window": 4})
    assert _choice_case("decode_attention", mask=mask, plan=windowed) == fallback
    assert _choice_case("decode_attention", mask=mask, cache=types.SimpleNamespace()) == fallback  # no verdict
    not_prefix = types.SimpleNamespace(**{jt_forwards._PREFIX: (None, False)})
    assert _choice_case("decode_attention", mask=mask, cache=not_prefix) == fallback  # left padding, say
    no_op = dataclasses.replace(jt.TORCH, one_token_attention="decode_attention", decode_attention=None)
    assert no_op.decode_attention is None  # such a backend never looks for the cache layer (sdpa_gqa)


def test_packed_needs_grouped_heads_and_a_mask_shared_by_the_heads() -> None:
    mha = types.SimpleNamespace(q_heads=4, kv_heads=4, attention_kwargs={})
    assert _choice_case("packed", plan=mha) is None
    assert _choice_case("packed", mask=torch.ones(2, 4, 1, 8, dtype=torch.bool)) is None
    assert _choice_case("packed", mask=None) == "packed"


def test_decode_attention_reference_attends_to_each_sequences_prefix() -> None:
    torch.manual_seed(0)
    b, hq, hkv, max_len, d = 3, 4, 2, 10, 8
    q = torch.randn(b, hq, d)
    k, v = torch.randn(b, hkv, max_len, d), torch.randn(b, hkv, max_len, d)
    lens = torch.tensor([1, 7, 0])
    out = _torch_decode_attention(q, k, v, lens, 0.3)
    for i in range(b):
        n = int(lens[i])
        keys = k[i].repeat_interleave(hq // hkv, 0)[:, :n]
        values = v[i].repeat_interleave(hq // hkv, 0)[:, :n]
        if n == 0:
            assert torch.equal(out[i], torch.zeros(hq, d))
            continue
        expected = torch.softmax((q[i, :, None] @ keys.transpose(1, 2)) * 0.3, -1) @ values
        torch.testing.assert_close(out[i], expected[:, 0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# bench_model: the weights a step reads


def test_step_weight_bytes_counts_what_a_one_token_step_reads() -> None:
    from jit_kernel.benchmark.bench_model import step_weight_bytes

    model = model_of(dtype=torch.bfloat16)
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.model.embed_tokens.weight
    assert step_weight_bytes(model) == every - embedding.numel() * 2
    tied = model_of(dtype=torch.bfloat16, tie_word_embeddings=True)
    assert step_weight_bytes(tied) == sum(p.numel() * p.element_size() for p in tied.parameters())
    patched = copy.deepcopy(model)
    jt.apply(patched, backend="torch")  # merged weights: the same parameters, the same bytes
    assert step_weight_bytes(patched) == step_weight_bytes(model)
    moe = model_of("qwen3_moe", dtype=torch.bfloat16)
    experts = sum(p.numel() * 2 for n, p in moe.named_parameters() if ".experts." in n)
    assert experts > 0
    others = sum(p.numel() * 2 for n, p in moe.named_parameters() if ".experts." not in n)
    assert step_weight_bytes(moe) == int(others - moe.model.embed_tokens.weight.numel() * 2 + experts * 2 / 4)


def test_weights_read_row() -> None:
    from jit_kernel.benchmark import bench_model

    row = bench_model.weights_read_row("Llama-3-8B", "jit_kernel", 4_000_000_000, 4000.0, 1100.0)
    assert row == ["Llama-3-8B", "jit_kernel", "4000.0", "4000", "1000.0", "1100.0", "1.10x"]
    assert len(row) == len(bench_model.weights_read_header())
    missing = bench_model.weights_read_row("Llama-3-8B", "unpatched", 1000, float("nan"), None)
    assert missing[3:] == ["n/a", "n/a", "n/a", "n/a"]


# ---------------------------------------------------------------------------------------------
# GPU: jit_kernel's ops


def gpu_model(dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Any:
    """The head layout of the 8B models (head_dim 128, 4:1 GQA), 2 layers."""
    shape: dict[str, Any] = dict(
        vocab_size=2048,
        hidden_size=1024,
        intermediate_size=2816,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
    )
    return model_of("llama", dtype, **{**shape, **overrides}).cuda()


def gpu_recorder(monkeypatch: Any, choice: str) -> tuple[Recorder, collections.Counter[str]]:
    """jit_kernel's backend with ``choice`` (its calls counted), and a count of the decode_linear calls."""
    import jit_kernel

    kernels: collections.Counter[str] = collections.Counter()
    real = jit_kernel.decode_linear

    def decode_linear(*args: Any, **kwargs: Any) -> torch.Tensor:
        kernels["decode_linear"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(jit_kernel, "decode_linear", decode_linear)
    return Recorder(choice, jt.get_backend("jit_kernel")), kernels


@pytest.mark.gpu
@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_static_cache_logits_and_greedy_generate_match_unpatched(monkeypatch: Any, choice: str, batch: int) -> None:
    model = gpu_model()
    reference = copy.deepcopy(model)
    recorder, kernels = gpu_recorder(monkeypatch, choice)
    assert jt.apply(model, backend=recorder.backend)
    prompt, steps = random_ids(batch, 12, 10, 2048).cuda(), random_ids(batch, 6, 11, 2048).cuda()
    mask = torch.ones_like(prompt)
    expected = static_steps(reference, prompt, mask, steps, max_len=128)
    recorder.calls.clear()
    kernels.clear()
    got = static_steps(model, prompt, mask, steps, max_len=128)
    assert_close_logits(got, expected, torch.bfloat16)
    # qkv, o, gate/up and down of each layer, and the head, at every step of up to 16 rows: each
    # one-token step, and the prefill at batch 1 (12 rows)
    per_step = 2 * 4 + 1
    assert kernels["decode_linear"] == per_step * (6 + (batch * 12 <= 16))
    assert recorder.calls["decode_attention"] == (2 * 6 if choice == "decode_attention" else 0)
    kwargs = dict(
        attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0, cache_implementation="static"
    )  # fmt: skip
    reference_run = reference.generate(prompt, output_logits=True, return_dict_in_generate=True, **kwargs)
    assert_greedy_agrees(model.generate(prompt, **kwargs), reference_run.sequences, reference_run.logits, 12)


@pytest.mark.gpu
def test_gpu_left_padding_runs_sdpa_with_the_mask(monkeypatch: Any) -> None:
    model = gpu_model()
    reference = copy.deepcopy(model)
    recorder, _ = gpu_recorder(monkeypatch, "decode_attention")
    assert jt.apply(model, backend=recorder.backend)
    prompt, steps = random_ids(4, 12, 12, 2048).cuda(), random_ids(4, 6, 13, 2048).cuda()
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    mask[2, :7] = 0
    prompt = prompt.masked_fill(mask == 0, 0)
    got = static_steps(model, prompt, mask, steps, max_len=128)
    assert recorder.calls["decode_attention"] == 0
    assert_close_logits(got, static_steps(reference, prompt, mask, steps, max_len=128), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("batch", [1, 4])
def test_gpu_decode_step_replays_in_a_cuda_graph_with_each_choice(monkeypatch: Any, choice: str, batch: int) -> None:
    """bench_model's decode step (StaticCache, 4D mask) captured in a CUDA graph: its replay (into
    poisoned logits) gives the eager step's logits, with the choice's op captured."""
    from jit_kernel.benchmark.bench_model import DecodeStep

    model = gpu_model()
    reference = copy.deepcopy(model)
    recorder, _ = gpu_recorder(monkeypatch, choice)
    assert jt.apply(model, backend=recorder.backend)
    step, reference_step = DecodeStep(model, batch, 256, "cuda"), DecodeStep(reference, batch, 256, "cuda")
    with torch.inference_mode():
        reference_step.rewind()
        expected = reference_step().logits.float()
        step.rewind()
        eager = step().logits.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        step.rewind()
        recorder.calls.clear()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step().logits
        out.fill_(float("nan"))
        step.rewind()
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
    assert_close_logits(eager.float(), expected, torch.bfloat16)
    assert recorder.calls["decode_attention"] == (2 if choice == "decode_attention" else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 16, 17, 64])
def test_gpu_jit_kernel_linear_equals_f_linear(rows: int) -> None:
    backend = jt.get_backend("jit_kernel")
    x = torch.randn(rows, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3072, 1024, device="cuda", dtype=torch.bfloat16) / 32
    b = torch.randn(3072, device="cuda", dtype=torch.bfloat16)
    expected = F.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(backend.linear(x, w, b).double(), expected, rtol=2e-2, atol=2e-2)


def test_bench_model_attention_variants_build_with_their_choice_on_cpu() -> None:
    from jit_kernel.benchmark import bench_model

    assert set(bench_model.ATTENTION_VARIANTS) == set(CHOICES)
    args = bench_model.parse_args(["--attention"])
    assert args.attention and not bench_model.parse_args([]).attention
    shape = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    config = bench_model.model_config("llama", 2, head_dim=64, **shape)
    variants = ["unpatched", "jit_kernel", *bench_model.ATTENTION_VARIANTS.values()]
    models, fp32, missing = bench_model.build_models(config, "cpu", variants)
    assert not missing and list(models) == variants
    for choice, variant in bench_model.ATTENTION_VARIANTS.items():
        plan = models[variant].model.layers[0].self_attn.__dict__[jt._PLAN]
        assert plan.backend.one_token_attention == choice
    rows = bench_model.correctness(models, fp32, "cpu")
    assert all(float(row[1]) > 0.999 for row in rows)


def test_sdpa_gqa_runs_enable_gqa_without_a_mask_and_the_models_sdpa_with_one(monkeypatch: Any) -> None:
    """A DynamicCache step without padding has no mask: the patched layer calls SDPA with
    enable_gqa itself. A StaticCache step has one: transformers' own sdpa function runs it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    calls: collections.Counter[int] = collections.Counter()
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def counted(module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls[query.shape[2]] += 1  # by query length
        return sdpa(module, query, *args, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", counted)
    model = model_of()
    reference = copy.deepcopy(model)
    assert jt.apply(model, backend=Recorder("sdpa_gqa").backend)
    prompt = random_ids(2, 5, 9)
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = reference.generate(prompt, **kwargs)
    calls.clear()
    assert torch.equal(model.generate(prompt, **kwargs), expected)
    assert calls[1] == 0 and calls[5] == 2  # the prefill's two layers only
    calls.clear()
    assert torch.equal(model.generate(prompt, cache_implementation="static", **kwargs), expected)
    assert calls[1] == 2 * 3  # three one-token steps, masked
