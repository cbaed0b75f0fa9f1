"""jit_kernel.integrations.transformers: apply(model) on tiny models built from config objects (no
downloads), one per supported family.

CPU tests patch with the torch reference backend wrapped to count its calls (so a path that is not
taken fails), and compare with an unpatched copy: logits, every hidden state, state_dict, a
save/load round trip, greedy generate() with a dynamic and a static cache, torch.compile without a
graph break. GPU tests patch with jit_kernel's ops and compare bf16 logits with the unpatched model
and an fp32 copy, replay a captured CUDA graph and compile with Inductor.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from jit_kernel.integrations import transformers as jt  # noqa: E402
from jit_kernel.integrations.transformers import fp8 as jt_fp8  # noqa: E402

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")
VOCAB = 128


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """2 layers, hidden 64, 4 query heads and 2 kv heads of 16."""
    values: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
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


def tiny_model(model_type: str, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any) -> Any:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), dtype=dtype)
    with torch.no_grad():  # visible norm weights: a norm that is skipped or misapplied changes the output
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


class Counting:
    """The torch reference backend, counting each op's calls."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        base = jt.TORCH

        def count(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return fn(*args, **kwargs)

            return counted

        self.backend = dataclasses.replace(
            base,
            name="counting",
            rmsnorm=count("rmsnorm", base.rmsnorm),
            fused_add_rmsnorm=count("fused_add_rmsnorm", base.fused_add_rmsnorm),
            act_and_mul={k: count(f"act:{k}", f) for k, f in base.act_and_mul.items()},
            rope=count("rope", base.rope),
            qknorm_rope=count("qknorm_rope", base.qknorm_rope),
            topk_softmax=count("topk_softmax", base.topk_softmax),  # type: ignore[arg-type]
            group_quant=count("group_quant", base.group_quant),  # type: ignore[arg-type]
            rmsnorm_group_quant=count("rmsnorm_group_quant", base.rmsnorm_group_quant),  # type: ignore[arg-type]
            fused_add_rmsnorm_group_quant=count(
                "fused_add_rmsnorm_group_quant",
                base.fused_add_rmsnorm_group_quant,  # type: ignore[arg-type]
            ),
            silu_and_mul_group_quant=count("silu_and_mul_group_quant", base.silu_and_mul_group_quant),  # type: ignore[arg-type]
        )


def patched_pair(
    model_type: str, dtype: torch.dtype = torch.float32, config: dict[str, Any] | None = None, **options: Any
) -> tuple[Any, Any, Counting]:
    """(patched model, unpatched copy, the counting backend): ``config`` overrides the tiny config,
    ``options`` go to apply()."""
    model = tiny_model(model_type, dtype, **(config or {}))
    reference = copy.deepcopy(model)
    counting = Counting()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a supported tiny model patches without a warning
        report = jt.apply(model, backend=counting.backend, **options)
    assert report
    counting.calls.clear()  # apply() tries topk_softmax on the router's shape once
    return model, reference, counting


def ids(batch: int = 2, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def instance_forwards(model: torch.nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if "forward" in m.__dict__]


# ---------------------------------------------------------------------------------------------
# Left unchanged


@pytest.mark.parametrize("model_type", FAMILIES)
def test_model_on_cpu_is_left_unchanged_with_one_warning(model_type: str) -> None:
    model = tiny_model(model_type)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning) as record:
        report = jt.apply(model)  # the jit_kernel backend: CUDA only
    assert len(record) == 1
    assert "everything" in str(record[0].message) and "cpu" in str(record[0].message)
    assert not report and report.skipped
    assert instance_forwards(model) == []
    assert list(jt.patched_modules(model)) == []
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)


def test_unsupported_model_type_is_left_unchanged_with_one_warning() -> None:
    config = AutoConfig.for_model("gpt2", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    model = AutoModelForCausalLM.from_config(config).eval()
    with pytest.warns(UserWarning, match="model type 'gpt2' is not supported") as record:
        report = jt.apply(model, backend="torch")
    assert len(record) == 1 and not report
    assert instance_forwards(model) == []


def test_dynamic_rope_skips_rope_only_with_one_warning() -> None:
    model = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    reference = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="rope_type 'dynamic'") as record:
        report = jt.apply(model, backend="torch")
    assert len(record) == 1
    assert report.rope == report.qkv == 0 and report.mlp == 2 and report.fused_add_rmsnorm == 2
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_moe"])
def test_all_options_off_changes_nothing(model_type: str) -> None:
    model = tiny_model(model_type)
    off = dict(
        rmsnorm=False,
        fused_add_rmsnorm=False,
        mlp=False,
        qkv=False,
        rope=False,
        qk_norm=False,
        router=False,
        lm_head=False,
    )
    report = jt.apply(model, backend="torch", **off)
    assert not report and not report.skipped
    assert instance_forwards(model) == []


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="backend must be one of jit_kernel, flashinfer, torch"):
        jt.apply(tiny_model("llama"), backend="triton")


def test_apply_twice_changes_nothing_the_second_time() -> None:
    model, reference, counting = patched_pair("llama")
    weight = model.model.layers[0].mlp.gate_proj.weight
    assert not jt.apply(model, backend=counting.backend)
    assert model.model.layers[0].mlp.gate_proj.weight is weight
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Patched on the torch reference backend: same results as the unpatched model


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patched_forward_equals_unpatched(model_type: str) -> None:
    model, reference, counting = patched_pair(model_type)
    layers = 2
    with torch.no_grad():
        expected = reference(ids(), use_cache=False).logits
        got = model(ids(), use_cache=False).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    qk = model_type in ("qwen3", "qwen3_moe")
    assert counting.calls["qknorm_rope" if qk else "rope"] == layers
    assert counting.calls["rope" if qk else "qknorm_rope"] == 0
    assert counting.calls["act:silu"] == (0 if model_type == "qwen3_moe" else layers)
    assert counting.calls["topk_softmax"] == (layers if model_type == "qwen3_moe" else 0)
    # Layer 0 normalises its input; each layer hands the next norm (the last: the final norm) off.
    assert counting.calls["rmsnorm"] >= 1 and counting.calls["fused_add_rmsnorm"] >= layers


@pytest.mark.parametrize("model_type", FAMILIES)
def test_bf16_patched_forward_is_close_to_unpatched(model_type: str) -> None:
    model, reference, _ = patched_pair(model_type, torch.bfloat16)
    with torch.no_grad():
        got = model(ids()).logits.float()
        expected = reference(ids()).logits.float()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), expected.flatten(), dim=0)
    assert cosine > 0.999, cosine


@pytest.mark.parametrize("model_type", FAMILIES)
def test_output_hidden_states_are_the_unpatched_models(model_type: str) -> None:
    model, reference, counting = patched_pair(model_type)
    with torch.no_grad():
        expected = reference(ids(), output_hidden_states=True)
        counting.calls.clear()
        got = model(ids(), output_hidden_states=True)
        recorded_fused = counting.calls["fused_add_rmsnorm"]
        counting.calls.clear()
        plain = model(ids())  # the capture hooks stay installed, collecting nothing
        plain_fused = counting.calls["fused_add_rmsnorm"]
    assert len(got.hidden_states) == len(expected.hidden_states) == 3
    for g, e in zip(got.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.logits, expected.logits, rtol=1e-5, atol=1e-5)
    # Recording: one fused add + norm per layer (the MLP's add with the next norm); not recording,
    # layer 1 also adds its attention output into its input, layer 0's output.
    assert recorded_fused == 2
    assert plain_fused == 3


def test_hidden_states_recorded_by_a_user_hook_are_not_overwritten() -> None:
    model, reference, _ = patched_pair("llama")
    seen: list[torch.Tensor] = []
    expected_seen: list[torch.Tensor] = []
    model.model.layers[0].register_forward_hook(lambda m, a, out: seen.append(out))
    reference.model.layers[0].register_forward_hook(lambda m, a, out: expected_seen.append(out))
    with torch.no_grad():
        model(ids())
        reference(ids())
    torch.testing.assert_close(seen[0], expected_seen[0], rtol=1e-5, atol=1e-5)


def test_inputs_embeds_are_not_overwritten() -> None:
    model, reference, _ = patched_pair("qwen3")
    embeds = reference.model.embed_tokens(ids()).detach()
    kept = embeds.clone()
    with torch.no_grad():
        got = model(inputs_embeds=embeds).logits
        expected = reference(inputs_embeds=kept.clone()).logits
    assert torch.equal(embeds, kept)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_state_dict_keys_and_values_are_unchanged(model_type: str) -> None:
    model, reference, _ = patched_pair(model_type)
    got, expected = model.state_dict(), reference.state_dict()
    assert list(got) == list(expected)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert [n for n, _ in model.named_buffers()] == [n for n, _ in reference.named_buffers()]


def test_save_pretrained_round_trip(tmp_path: Any) -> None:
    model, reference, _ = patched_pair("qwen3")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    for name, value in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids()).logits, reference(ids()).logits)


def test_load_state_dict_writes_through_to_the_merged_weights() -> None:
    model, _, _ = patched_pair("llama")
    other = tiny_model("llama", seed=5)
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, other(ids()).logits, rtol=1e-5, atol=1e-5)
    # assign=True replaces the parameters: the next eager call merges them again.
    third = tiny_model("llama", seed=6)
    model.load_state_dict(third.state_dict(), assign=True)
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, third(ids()).logits, rtol=1e-5, atol=1e-5)


def test_moving_the_model_merges_again() -> None:
    model, reference, _ = patched_pair("qwen2")
    model.to(torch.float64)
    reference.to(torch.float64)
    mlp = model.model.layers[0].mlp
    merged = mlp.__dict__[jt._PLAN].gate_up
    assert merged.weight.dtype == torch.float64 and merged.intact()
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_generate_with_dynamic_and_static_cache(model_type: str) -> None:
    model, reference, counting = patched_pair(model_type)
    prompt = ids(2, 5)
    mask = torch.ones_like(prompt)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    expected = reference.generate(prompt, **kwargs)
    counting.calls.clear()
    assert torch.equal(model.generate(prompt, **kwargs), expected)
    assert counting.calls["fused_add_rmsnorm"] > 0
    assert torch.equal(model.generate(prompt, cache_implementation="static", **kwargs), expected)


def test_autograd_on_runs_the_models_own_forwards() -> None:
    model, reference, counting = patched_pair("qwen3")
    got = model(ids()).logits  # autograd on: no kernels, gradients flow
    got.sum().backward()
    assert sum(counting.calls.values()) == 0
    assert model.model.layers[0].mlp.gate_proj.weight.grad is not None
    torch.testing.assert_close(got.detach(), reference(ids()).logits.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "rope",
    [
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
)
def test_scaled_rope_equals_unpatched(rope: dict[str, Any]) -> None:
    model = tiny_model("llama", rope_parameters={"rope_theta": 500000.0, **rope})
    reference = copy.deepcopy(model)
    counting = Counting()
    jt.apply(model, backend=counting.backend)
    positions = torch.arange(100, 107)[None].expand(2, -1)  # beyond the original context
    with torch.no_grad():
        got = model(ids(), position_ids=positions).logits
        expected = reference(ids(), position_ids=positions).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert counting.calls["rope"] == 2


def test_partial_rotary_rotates_the_leading_dims_only() -> None:
    """A rotary dim below head_dim: the integration's table has the model's frequencies and the
    rotation leaves the trailing elements of every head alone."""
    model = tiny_model(
        "llama",
        rope_parameters={"rope_type": "linear", "factor": 1.0, "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )
    rotary = model.model.rotary_emb
    assert rotary.inv_freq.numel() == 4  # rotary dim 8 of head_dim 16
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def rope(positions, q, k, head_dim, cache, is_neox=True):  # type: ignore[no-untyped-def]
        before = q.clone()
        jt.TORCH.rope(positions, q, k, head_dim, cache, is_neox)
        seen.append((before, q.clone(), positions.clone()))

    jt.apply(model, backend=dataclasses.replace(jt.TORCH, rope=rope))
    with torch.no_grad():
        model(ids(1, 5))
    before, after, positions = seen[0]
    assert torch.equal(after[..., 8:], before[..., 8:])
    freqs = positions[:, None].float() * rotary.inv_freq.float()[None]
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
    a, b = before[..., :4], before[..., 4:8]
    torch.testing.assert_close(after[..., :4], a * cos - b * sin)
    torch.testing.assert_close(after[..., 4:8], b * cos + a * sin)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe"])
def test_compile_fullgraph_has_no_graph_break(model_type: str) -> None:
    model, reference, _ = patched_pair(model_type)
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(ids(), use_cache=False)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(
            compiled(ids(), use_cache=False).logits, reference(ids(), use_cache=False).logits, rtol=1e-5, atol=1e-5
        )
    torch._dynamo.reset()


def test_compiled_output_hidden_states_are_the_unpatched_models() -> None:
    model, reference, _ = patched_pair("qwen3")
    torch._dynamo.reset()
    with torch.no_grad():
        model(ids(), output_hidden_states=True)  # transformers installs its capture hooks eagerly
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        got = compiled(ids(), output_hidden_states=True, use_cache=False)
        expected = reference(ids(), output_hidden_states=True, use_cache=False)
        plain = compiled(ids(), use_cache=False)
    for g, e in zip(got.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plain.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# The mixture-of-experts router


def router_outputs(model: Any) -> list[tuple[torch.Tensor, ...]]:
    """Each router's (input, first output, weights, ids), recorded by forward hooks in the next
    forward (the hooks stay: call on copies)."""
    seen: list[tuple[torch.Tensor, ...]] = []
    for layer in model.model.layers:
        if hasattr(layer.mlp, "experts"):
            layer.mlp.gate.register_forward_hook(lambda m, args, out: seen.append((args[0].clone(), *out)))
    return seen


def assert_router_outputs_equal(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> None:
    """The same first output and ids (dtypes included); weights of the same dtype, equal to within
    one rounding of fp32 values to that dtype. Among experts whose logits tie (common with bf16
    logits), torch.topk's choice is unspecified (ours: the lowest index): there the ids must pick
    logits of the same values, in the same order."""
    assert [t.dtype for t in got] == [t.dtype for t in expected]
    assert torch.equal(got[0], expected[0]) and got[2].dtype == torch.int64
    logits = expected[0].float()
    chosen, reference = logits.gather(1, got[2]), logits.gather(1, expected[2])
    assert torch.equal(chosen, reference)
    unique = (logits.unsqueeze(1) == reference.unsqueeze(2)).sum(-1) == 1
    assert torch.equal(got[2][unique], expected[2][unique])
    # fp32: the kernel's expf and division against torch's, within 1e-6; a lower precision: the
    # fp32 values rounded to it, one unit apart at most.
    rtol = max(torch.finfo(expected[1].dtype).eps, 1e-6)
    torch.testing.assert_close(got[1].float(), expected[1].float(), rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_router_is_patched_on_qwen3_moe_only(model_type: str) -> None:
    model, _, _ = patched_pair(model_type)
    report = jt.apply(model, backend="torch")  # applied already: the first report is the one to read
    assert not report
    routers = [name for name, _ in jt.patched_modules(model) if name.endswith(".mlp.gate")]
    assert routers == (["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"] if model_type == "qwen3_moe" else [])
    first = jt.apply(tiny_model(model_type), backend="torch")
    assert first.router == (2 if model_type == "qwen3_moe" else 0)


def test_router_dense_layers_of_a_moe_model_get_the_mlp_part() -> None:
    model, reference, counting = patched_pair("qwen3_moe", config=dict(mlp_only_layers=[0]))
    assert hasattr(model.model.layers[0].mlp, "gate_proj") and hasattr(model.model.layers[1].mlp, "experts")
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits, rtol=1e-5, atol=1e-5)
    assert counting.calls["topk_softmax"] == 1 and counting.calls["act:silu"] == 1


def test_router_option_switches_it_off() -> None:
    model = tiny_model("qwen3_moe")
    report = jt.apply(model, router=False, backend="torch")
    assert report.router == 0 and report.qk_norm == 2 and not report.skipped
    names = [name for name, _ in jt.patched_modules(model)]
    assert not any(name.endswith(".gate") for name in names) and "model.layers.0.self_attn" in names


ROUTER_ONLY = dict(
    rmsnorm=False, fused_add_rmsnorm=False, mlp=False, qkv=False, rope=False, qk_norm=False, lm_head=False
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_router_returns_what_transformers_router_returns(dtype: torch.dtype, norm_topk_prob: bool) -> None:
    """Only the router patched, on the torch reference op: every output of the model is the
    unpatched model's, bit for bit, the router logits it collects and its auxiliary loss included."""
    config = dict(num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm_topk_prob, output_router_logits=True)
    model, reference, counting = patched_pair("qwen3_moe", dtype, config=config, **ROUTER_ONLY)
    assert [name for name, _ in jt.patched_modules(model)] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    got, expected = router_outputs(model), router_outputs(reference)
    with torch.no_grad():
        out, ref = model(ids()), reference(ids())
    assert counting.calls["topk_softmax"] == 2 and len(got) == len(expected) == 2
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g[0], e[0])
        assert_router_outputs_equal(g[1:], e[1:])
    assert torch.equal(out.logits, ref.logits) and torch.equal(out.aux_loss, ref.aux_loss)
    for g, e in zip(out.router_logits, ref.router_logits, strict=True):
        assert torch.equal(g, e)
    # Row counts the layers never see: one token, and an odd count.
    gate, reference_gate = model.model.layers[0].mlp.gate, reference.model.layers[0].mlp.gate
    for rows in (1, 37):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).to(dtype)
        with torch.no_grad():
            assert_router_outputs_equal(gate(x), reference_gate(x))


def test_router_with_autograd_on_runs_its_own_forward() -> None:
    model, reference, counting = patched_pair("qwen3_moe")
    gate = model.model.layers[0].mlp.gate
    x = torch.randn(5, 64)
    got = gate(x)
    assert counting.calls["topk_softmax"] == 0 and got[0].requires_grad
    with torch.no_grad():
        assert_router_outputs_equal([t.detach() for t in got], reference.model.layers[0].mlp.gate(x))


def _router_returning_probabilities(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A router as some transformers 5 releases wrote it: the fp32 softmax returned in place of
    the logits, and the routing weights in its dtype."""
    probs = torch.nn.functional.softmax(
        torch.nn.functional.linear(hidden_states, self.weight), dim=-1, dtype=torch.float
    )
    weights, ids = torch.topk(probs, self.top_k, dim=-1)
    if self.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return probs, weights.to(probs.dtype), ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_router_that_returns_probabilities_keeps_returning_them(monkeypatch: Any, dtype: torch.dtype) -> None:
    router_cls = type(tiny_model("qwen3_moe").model.layers[0].mlp.gate)
    monkeypatch.setattr(router_cls, "forward", _router_returning_probabilities)
    model, reference, counting = patched_pair("qwen3_moe", dtype, config=dict(norm_topk_prob=True))
    x = torch.randn(6, 64).to(dtype)
    with torch.no_grad():
        got, expected = model.model.layers[1].mlp.gate(x), reference.model.layers[1].mlp.gate(x)
    assert got[0].dtype == got[1].dtype == torch.float32
    assert_router_outputs_equal(got, expected)
    assert counting.calls["topk_softmax"] == 1


def test_router_with_other_routing_is_skipped_with_one_warning(monkeypatch: Any) -> None:
    def sigmoid_router(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = torch.nn.functional.linear(hidden_states, self.weight)
        weights, ids = torch.topk(logits.sigmoid(), self.top_k, dim=-1)
        return logits, weights.to(logits.dtype), ids

    model = tiny_model("qwen3_moe")
    monkeypatch.setattr(type(model.model.layers[0].mlp.gate), "forward", sigmoid_router)
    reference = copy.deepcopy(model)
    with pytest.warns(
        UserWarning, match="router: 2 of 2 layers .*not the softmax top-2 with norm_topk_prob=False"
    ) as record:
        report = jt.apply(model, backend="torch")
    assert len(record) == 1 and report.router == 0 and report.qk_norm == 2
    assert "forward" not in model.model.layers[0].mlp.gate.__dict__
    with torch.no_grad():
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits, rtol=1e-5, atol=1e-5)


def test_router_shape_the_op_rejects_is_skipped_with_its_message() -> None:
    def rejecting(logits: torch.Tensor, topk: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"topk_softmax: at most 2 experts, got {logits.shape[-1]}")

    model = tiny_model("qwen3_moe")
    with pytest.warns(UserWarning, match="router: 2 of 2 layers .*at most 2 experts, got 4"):
        report = jt.apply(model, backend=dataclasses.replace(jt.TORCH, topk_softmax=rejecting))
    assert report.router == 0 and report.rope == 2


def test_backend_without_topk_softmax_leaves_the_router() -> None:
    model = tiny_model("qwen3_moe")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = jt.apply(model, backend=dataclasses.replace(jt.TORCH, topk_softmax=None))
    assert report.router == 0 and report.rope == 2 and not report.skipped
    assert "forward" not in model.model.layers[0].mlp.gate.__dict__


def test_kernel_mapping_is_a_valid_kernels_layer() -> None:
    kernels = pytest.importorskip("kernels")
    norm_cls = type(tiny_model("llama").model.norm)
    if not hasattr(norm_cls, "kernel_layer_name"):  # transformers' decorator is inactive for this kernels
        kernels.replace_kernel_forward_from_hub(norm_cls, "RMSNorm")
    model = tiny_model("llama")
    reference = copy.deepcopy(model)
    with kernels.use_kernel_mapping(jt.kernel_mapping("cpu")):
        kernels.kernelize(model, mode=kernels.Mode.INFERENCE, device="cpu")
    assert "forward" in model.model.norm.__dict__
    with torch.no_grad():  # the CPU falls back to the torch reference ops
        torch.testing.assert_close(model(ids()).logits, reference(ids()).logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Fine-grained fp8 linear layers (transformers' FP8Linear)

# Every linear layer's in_features a multiple of 512 (FP8_IN_ALIGN): hidden 512, intermediate 1024,
# 4 query heads of 128.
FP8_SHAPE = dict(hidden_size=512, intermediate_size=1024, head_dim=128)


def fp8_model(model_type: str = "llama", dtype: torch.dtype = torch.bfloat16, **overrides: Any) -> Any:
    """A tiny model whose decoder layers' linear layers are transformers' FP8Linear."""
    from jit_kernel.benchmark.bench_model import fine_grained_fp8

    return fine_grained_fp8(tiny_model(model_type, dtype, **{**FP8_SHAPE, **overrides}))


def fp8_reference(model: Any) -> Any:
    """``model`` in fp32 with its fp8 weights dequantised, every activation before an fp8 linear
    layer quantised and dequantised by 1 x 128 groups (the computation the patched model runs,
    in transformers' own forwards)."""
    from jit_kernel.benchmark.bench_model import dequantized_fp32

    reference = dequantized_fp32(model)

    def quantize_input(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        x = args[0]
        rows = x.reshape(-1, x.shape[-1]).to(model.dtype)
        q = torch.empty_like(rows, dtype=torch.float8_e4m3fn)
        s = rows.new_empty((rows.shape[0], rows.shape[1] // 128), dtype=torch.float32)
        jt.TORCH.group_quant(rows, q, s)  # type: ignore[misc]
        return (jt._dequantize(q, s, 1).view(x.shape),)

    for name, module in reference.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            module.register_forward_pre_hook(quantize_input)
    return reference


def test_fine_grained_fp8_quantises_as_transformers_does() -> None:
    from transformers.integrations.finegrained_fp8 import FP8Linear

    model = tiny_model("llama", torch.bfloat16, **FP8_SHAPE)
    weight = model.model.layers[0].mlp.down_proj.weight.detach().float().clone()
    fp8 = fp8_model("llama")
    layer = fp8.model.layers[0]
    assert all(type(getattr(layer.self_attn, p)) is FP8Linear for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert type(fp8.lm_head) is torch.nn.Linear
    down = layer.mlp.down_proj
    assert down.weight.dtype == torch.float8_e4m3fn and down.weight_scale_inv.shape == (4, 8)
    dequantized = jt._dequantize(down.weight, down.weight_scale_inv, 128)
    # e4m3 keeps 3 mantissa bits: each element within half an ulp (1/16 relative) of its block's max
    block_max = down.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1) * 448
    assert ((dequantized - weight).abs() <= block_max / 16 + 1e-12).all()


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_fp8_layers_run_on_group_quant_fed_by_the_norms(model_type: str) -> None:
    model = fp8_model(model_type)
    reference = fp8_reference(model)
    counting = Counting()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = jt.apply(model, backend=counting.backend)
    counting.calls.clear()  # apply() checks the fp8 GEMM of each weight shape once
    assert report.fp8 == 2 * 7 and report.rope == 2 and report.fused_add_rmsnorm == 2
    assert report.mlp == 2 and report.qkv == 2  # q/k/v and gate/up as one fp8 GEMM each
    assert not caught and not report.skipped
    with torch.inference_mode():
        got = model(ids()).logits
        expected = reference(ids()).logits
    # Per forward of 2 layers: the first layer's two norms without a residual to add (its input is
    # the embedding), the next two with it; only o_proj quantises its own input, down_proj's is the
    # activation's output quantised in the same op.
    assert counting.calls["rmsnorm_group_quant"] == 2
    assert counting.calls["fused_add_rmsnorm_group_quant"] == 2
    assert counting.calls["group_quant"] == 2
    assert counting.calls["silu_and_mul_group_quant"] == 2
    assert counting.calls["rmsnorm"] == 0 and counting.calls["fused_add_rmsnorm"] == 1  # the final norm
    # bf16 activations against the fp32 reference's: a group's rounding can move a value across
    # an fp8 step, so not bit for bit
    assert cosine(got, expected) > 0.995


def test_fp8_decode_sizes_run_the_backends_fp8_decode_linear() -> None:
    """Up to 16 rows (1 x 7 tokens), every fp8 GEMM of a layer (q/k/v, o, gate/up, down) runs the
    backend's fp8_decode_linear, here jit_kernel.decode_linear_fp8 (its float32 reference on the
    CPU); 2 x 7 tokens still do, 3 x 7 do not; the logits equal those of the backend without it."""
    import jit_kernel

    model = fp8_model("qwen3")
    reference = copy.deepcopy(model)
    rows: list[int] = []

    def fp8_decode_linear(q: torch.Tensor, *args: Any) -> torch.Tensor:
        rows.append(q.shape[0])
        return jit_kernel.decode_linear_fp8(q, *args)

    jt.apply(model, backend=dataclasses.replace(jt.TORCH, name="fp8-decode", fp8_decode_linear=fp8_decode_linear))
    jt.apply(reference, backend="torch")
    assert jt.TORCH.fp8_decode_linear is None
    for batch, calls in ((1, 2 * 4), (2, 2 * 4), (3, 0)):
        rows.clear()
        with torch.inference_mode():
            got = model(ids(batch)).logits
            expected = reference(ids(batch)).logits
        assert len(rows) == calls and all(r == 7 * batch for r in rows)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_fp8_fused_norm_quant_equals_norm_then_quant() -> None:
    """The layers' norm + quant in one op, against the linear layers quantising their own inputs
    after the model's own residual adds and norms: the same logits."""
    model = fp8_model("qwen3")
    unfused = copy.deepcopy(model)
    jt.apply(model, backend="torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = jt.apply(unfused, backend="torch", fused_add_rmsnorm=False)
    assert report.fp8 == 14 and report.fused_add_rmsnorm == 0
    with torch.inference_mode():
        torch.testing.assert_close(model(ids()).logits, unfused(ids()).logits, rtol=0, atol=0)


def test_fp8_merged_gemms_equal_the_layers_own() -> None:
    """q/k/v and gate/up as one fp8 GEMM each, the MLP's activation quantised in one op: the
    products of the separate layers (the activation rounded once: close, not bit for bit)."""
    model = fp8_model("qwen3")
    separate = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert jt.apply(model, backend="torch").qkv == 2
        report = jt.apply(separate, backend="torch", qkv=False, mlp=False)
    assert report.qkv == 0 and report.mlp == 0 and report.fp8 == 14
    layer = model.model.layers[0]
    assert layer.mlp.gate_proj.weight_scale_inv.data_ptr() + 4 * 8 * 4 == layer.mlp.up_proj.weight_scale_inv.data_ptr()
    with torch.inference_mode():
        assert cosine(model(ids()).logits, separate(ids()).logits) > 0.999


def test_fp8_merged_gemms_follow_a_load_state_dict() -> None:
    model = fp8_model("llama")
    other = fp8_model("llama", seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jt.apply(model, backend="torch")
        jt.apply(other, backend="torch")
    model.load_state_dict(other.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(model(ids()).logits, other(ids()).logits, rtol=0, atol=0)


def test_fp8_layers_whose_gemm_gives_wrong_products_are_left(monkeypatch: Any) -> None:
    """apply() checks the fp8 GEMM once per weight shape against the dequantised product."""
    model = fp8_model("llama")
    gemm = jt_fp8._fp8_gemm

    def wrong_for_k_1024(activation: Any, weight: torch.Tensor, *args: Any) -> torch.Tensor:
        out = gemm(activation, weight, *args)
        return out * 1.1 if weight.shape[1] == 1024 else out

    monkeypatch.setattr(jt_fp8, "_fp8_gemm", wrong_for_k_1024)  # the module whose GEMM check calls it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = jt.apply(model, backend="torch")
    assert report.fp8 == 12  # each layer's down_proj (in_features 1024) left
    message = str(caught[0].message)
    assert "fp8: 2 of 14 fp8 linear layers (model.layers.0.mlp.down_proj: torch._scaled_mm's products on" in message
    assert "forward" not in model.model.layers[0].mlp.down_proj.__dict__


def test_fp8_biases_are_added() -> None:
    """Qwen2's q/k/v projections have biases: the fp8 GEMM adds them."""
    model = fp8_model("qwen2")
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    reference = fp8_reference(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jt.apply(model, backend="torch").fp8 == 14
    with torch.inference_mode():
        assert cosine(model(ids()).logits, reference(ids()).logits) > 0.995


def test_fp8_generate_and_hidden_states() -> None:
    model = fp8_model("llama")
    reference = fp8_reference(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jt.apply(model, backend="torch")
    prompt = ids(2, 5)
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        got = model(ids(), output_hidden_states=True)
        expected = reference(ids(), output_hidden_states=True)
        for g, e in zip(got.hidden_states, expected.hidden_states, strict=True):
            assert cosine(g, e) > 0.995
        assert model.generate(prompt, **kwargs).shape == (2, 11)


def test_fp8_state_dict_is_unchanged() -> None:
    model = fp8_model("qwen3")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jt.apply(model, backend="torch")
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k].view(torch.uint8), v.view(torch.uint8)) for k, v in before.items())


def test_fp8_compile_fullgraph_has_no_graph_break() -> None:
    model = fp8_model("qwen3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jt.apply(model, backend="torch")
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(ids(), use_cache=False)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        eager = model(ids(), use_cache=False).logits
        torch.testing.assert_close(compiled(ids(), use_cache=False).logits, eager, rtol=0, atol=0)
    torch._dynamo.reset()


def test_fp8_option_off_and_backend_without_group_quant_leave_the_layers() -> None:
    model = fp8_model("llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = jt.apply(model, backend="torch", fp8=False)
    assert report.fp8 == 0 and "forward" not in model.model.layers[0].self_attn.q_proj.__dict__
    assert not any("fp8:" in str(w.message) for w in caught)
    model = fp8_model("llama")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = jt.apply(model, backend=dataclasses.replace(jt.TORCH, name="plain", group_quant=None))
    assert report.fp8 == 0
    assert "fp8: the plain backend has no fp8 group quantisation" in str(caught[0].message)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda m: setattr(m, "block_size", (64, 64)), "weight blocks (64, 64)"),
        (lambda m: setattr(m, "activation_scale", torch.nn.Parameter(torch.ones(()))), "static activation"),
        (lambda m: setattr(m, "weight_scale_inv", torch.nn.Parameter(m.weight_scale_inv.double())), "float64"),
        (lambda m: setattr(m, "weight", torch.nn.Parameter(m.weight[:, :384], requires_grad=False)), "512 x 384"),
    ],
)
def test_fp8_layer_it_cannot_run_is_left_with_its_reason(change: Callable[[Any], None], reason: str) -> None:
    model = fp8_model("llama")
    change(model.model.layers[1].self_attn.o_proj)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = jt.apply(model, backend="torch")
    assert report.fp8 == 13
    message = str(caught[0].message)
    assert "fp8: 1 of 14 fp8 linear layers (model.layers.1.self_attn.o_proj: " in message and reason in message
    # its attention layer then stays transformers' (its projections are not all patched)
    assert report.rope == 0 and "rope, qkv, qk_norm: " in message


# ---------------------------------------------------------------------------------------------
# GPU: jit_kernel's ops


def gpu_config(model_type: str, layers: int = 2, **overrides: Any) -> Any:
    """Small, with the head layout of the 8B models (head_dim 128, 4:1 GQA)."""
    moe = (
        {"moe_intermediate_size": 256, "num_experts": 8, "num_experts_per_tok": 2} if model_type == "qwen3_moe" else {}
    )
    shape: dict[str, Any] = dict(
        vocab_size=2048,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=4096,
    )
    return tiny_config(model_type, **{**shape, **moe, **overrides})


def gpu_models(model_type: str) -> tuple[Any, Any, Any]:
    """(patched bf16, unpatched bf16, unpatched fp32), the same weights."""
    torch.manual_seed(0)
    fp32 = AutoModelForCausalLM.from_config(gpu_config(model_type), dtype=torch.float32)
    with torch.no_grad():
        for name, p in fp32.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    fp32 = fp32.cuda().eval()
    unpatched = copy.deepcopy(fp32).to(torch.bfloat16)
    patched = copy.deepcopy(unpatched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jt.apply(patched)
    return patched, unpatched, fp32


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def decisive_rows(reference: torch.Tensor, margin: float = 0.5) -> torch.Tensor:
    """Rows (positions) whose top-1 logit leads the top-2 by more than ``margin`` standard
    deviations of the row."""
    reference = reference.float()
    top = reference.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]) > margin * reference.std(-1)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", FAMILIES)
def test_gpu_logits_against_unpatched_and_fp32(model_type: str) -> None:
    patched, unpatched, fp32 = gpu_models(model_type)
    tokens = torch.randint(3, 2048, (4, 64), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.inference_mode():
        exact = fp32(tokens).logits
        got = patched(tokens).logits
        base = unpatched(tokens).logits
    # Top-2 routing of the mixture of experts can flip on a near tie, for either bf16 model.
    slack, floor = (1e-3, 0.995) if model_type == "qwen3_moe" else (1e-4, 0.999)
    assert cosine(got, base) > floor
    # At least as close to the fp32 model as the unpatched bf16 model is (to within noise).
    assert cosine(got, exact) >= cosine(base, exact) - slack
    rows = decisive_rows(exact)
    assert rows.sum() > 0
    agree = (got.argmax(-1)[rows] == exact.argmax(-1)[rows]).float().mean().item()
    assert agree >= (0.95 if model_type == "qwen3_moe" else 1.0), agree


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_gpu_generate_fp32_matches_unpatched(model_type: str) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(gpu_config(model_type), dtype=torch.float32).cuda().eval()
    reference = copy.deepcopy(model)
    assert jt.apply(model)
    prompt = torch.randint(3, 2048, (2, 12), generator=torch.Generator().manual_seed(1)).cuda()
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = reference.generate(prompt, **kwargs)
    assert torch.equal(model.generate(prompt, **kwargs), expected)
    assert torch.equal(model.generate(prompt, cache_implementation="static", **kwargs), expected)


def assert_decode_step_replays(model: Any, batch: int) -> None:
    """The benchmark's decode step (StaticCache, 4D mask) captured in a CUDA graph: its replay (into
    poisoned logits) gives the eager step's logits."""
    from jit_kernel.benchmark.bench_model import DecodeStep

    step = DecodeStep(model, batch, 64, "cuda")
    with torch.inference_mode():
        step.rewind()
        expected = step().logits.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        step.rewind()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step().logits
        out.fill_(float("nan"))
        step.rewind()
        graph.replay()
        torch.cuda.synchronize()
    torch.testing.assert_close(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe"])
def test_gpu_decode_step_replays_in_a_cuda_graph(model_type: str) -> None:
    patched, _, _ = gpu_models(model_type)
    assert_decode_step_replays(patched, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_gpu_compile_fullgraph_inductor(model_type: str) -> None:
    patched, unpatched, _ = gpu_models(model_type)
    tokens = torch.randint(3, 2048, (2, 32), generator=torch.Generator().manual_seed(4)).cuda()
    torch._dynamo.reset()
    with torch.inference_mode():
        explanation = torch._dynamo.explain(patched)(tokens, use_cache=False)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(patched, fullgraph=True)
        got = compiled(tokens, use_cache=False).logits
        eager = patched(tokens, use_cache=False).logits
        base = unpatched(tokens, use_cache=False).logits
    assert cosine(got, eager) > 0.9999
    assert cosine(got, base) > 0.999
    torch._dynamo.reset()


def gpu_fp8_models(model_type: str) -> tuple[Any, Any, Any]:
    """(jit_kernel-patched, patched with the norm and the group quant as two launches, the fp32
    reference of :func:`fp8_reference`), one fp8 model of :func:`gpu_config`'s shape."""
    from jit_kernel.benchmark.bench_model import fine_grained_fp8, two_launch_backend

    torch.manual_seed(0)
    # intermediate 3072: torch._scaled_mm's blockwise GEMM takes in_features in multiples of 512
    model = AutoModelForCausalLM.from_config(gpu_config(model_type, intermediate_size=3072), dtype=torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model = fine_grained_fp8(model.cuda().eval())
    two_launch = copy.deepcopy(model)
    reference = fp8_reference(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jt.apply(model).fp8 == 14
        assert jt.apply(two_launch, backend=two_launch_backend(jt.get_backend("jit_kernel"))).fp8 == 14
    return model, two_launch, reference


@pytest.mark.gpu
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_gpu_fp8_logits_equal_two_launches_and_match_the_reference(model_type: str) -> None:
    model, two_launch, reference = gpu_fp8_models(model_type)
    # 1 to 9 tokens: torch._scaled_mm's row padding; 64: a prefill
    for batch, length in ((1, 1), (3, 1), (4, 1), (5, 1), (9, 1), (2, 64)):
        tokens = torch.randint(3, 2048, (batch, length), generator=torch.Generator().manual_seed(batch)).cuda()
        with torch.inference_mode():
            got = model(tokens, use_cache=False).logits
            torch.testing.assert_close(got, two_launch(tokens, use_cache=False).logits, rtol=0, atol=0)
            # bf16 activations against the reference's fp32 ones, each a possible fp8 step apart
            assert cosine(got, reference(tokens, use_cache=False).logits) > 0.995, (batch, length)


@pytest.mark.gpu
def test_gpu_fp8_decode_step_replays_in_a_cuda_graph_and_compiles() -> None:
    model, _, _ = gpu_fp8_models("qwen3")
    assert_decode_step_replays(model, 3)  # 3 rows: the GEMM's padding to 4
    with torch.inference_mode():
        torch._dynamo.reset()
        tokens = torch.randint(3, 2048, (2, 32), generator=torch.Generator().manual_seed(4)).cuda()
        explanation = torch._dynamo.explain(model)(tokens, use_cache=False)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        compiled = torch.compile(model, fullgraph=True)
        # Inductor's own bf16 arithmetic around the kernels, a quantisation step apart in places
        assert cosine(compiled(tokens, use_cache=False).logits, model(tokens, use_cache=False).logits) > 0.999
    torch._dynamo.reset()


# Qwen3-30B-A3B's routing: 128 experts, top-8, renormalised.
MOE_ROUTING = dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, moe_intermediate_size=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_router_equals_transformers_eager_and_compiled(dtype: torch.dtype) -> None:
    """Only the router patched: on each router's inputs in the unpatched model, jit_kernel's router
    returns the same logits and expert ids as transformers' (eager and under
    torch.compile(fullgraph=True)), the weights within 1e-6 before their cast; the logits equal the
    unpatched model's to within that."""
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(gpu_config("qwen3_moe", **MOE_ROUTING), dtype=dtype).cuda().eval()
    model = copy.deepcopy(reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jt.apply(model, **ROUTER_ONLY).router == 2
    recorded = router_outputs(reference)
    tokens = torch.randint(3, 2048, (4, 64), generator=torch.Generator().manual_seed(0)).cuda()
    torch._dynamo.reset()
    with torch.inference_mode():
        expected = reference(tokens, use_cache=False).logits
        got = model(tokens, use_cache=False).logits
        assert len(recorded) == 2
        pairs = zip(model.model.layers, reference.model.layers, list(recorded), strict=True)
        for layer, reference_layer, (x, *outputs) in pairs:
            gate = layer.mlp.gate
            assert_router_outputs_equal(gate(x), outputs)
            assert_router_outputs_equal(torch.compile(gate, fullgraph=True)(x), outputs)
            one = x[:1]  # a decode token (its own GEMM: compared with the router's own forward on it)
            assert_router_outputs_equal(gate(one), reference_layer.mlp.gate.forward(one))
    torch._dynamo.reset()
    if dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:  # a weight may round to the next bf16 value
        assert cosine(got, expected) > 0.99999
        assert torch.equal(got.argmax(-1)[decisive_rows(expected)], expected.argmax(-1)[decisive_rows(expected)])


@pytest.mark.gpu
def test_gpu_moe_compile_fullgraph_routes_through_topk_softmax() -> None:
    """Every part patched: one graph, with jit_kernel's topk_softmax in it, and the compiled
    logits those of the eager patched model."""
    torch.manual_seed(0)
    config = gpu_config("qwen3_moe", **MOE_ROUTING)
    unpatched = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    patched = copy.deepcopy(unpatched)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert jt.apply(patched).router == 2
    tokens = torch.randint(3, 2048, (2, 32), generator=torch.Generator().manual_seed(4)).cuda()
    torch._dynamo.reset()
    with torch.inference_mode():
        explanation = torch._dynamo.explain(patched)(tokens, use_cache=False)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        targets = [str(node.target) for graph in explanation.graphs for node in graph.graph.nodes]
        assert sum("jit_kernel.topk_softmax" in t for t in targets) == 2, targets
        compiled = torch.compile(patched, fullgraph=True)
        got = compiled(tokens, use_cache=False).logits
        eager = patched(tokens, use_cache=False).logits
        base = unpatched(tokens, use_cache=False).logits
    # A routing near-tie may flip between the compiled and eager kernels' roundings (as between
    # any two bf16 models).
    assert cosine(got, eager) > 0.999
    assert cosine(got, base) > 0.995
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# The benchmark's CPU-side parts


def test_bench_model_arguments() -> None:
    from jit_kernel.benchmark import bench_model

    args = bench_model.parse_args([])
    assert (args.models, args.layers, args.batches, args.context, args.prefill) == (
        ["llama", "qwen3", "qwen3_moe", "qwen3_fp8"],
        4,
        [1, 8, 32],
        1024,
        1024,
    )
    assert args.modes == ["eager", "graph", "compile"]
    quick = bench_model.parse_args(["--quick", "--models", "qwen3", "--json-dir", "out"])
    assert (quick.layers, quick.batches, quick.models, quick.json_dir) == (1, [1], ["qwen3"], "out")
    for bad in (["--models", "gpt2"], ["--modes", "jit"], ["--batches", "0"], ["--context", "64"]):
        with pytest.raises(SystemExit):
            bench_model.parse_args(bad)


def test_bench_model_profile_parts_by_kernel_name() -> None:
    """--profile's table: each kernel in its part by name (ours by namespace, cuBLAS's and SDPA's by
    their libraries' names), the three largest per part, the gaps as the step's uncovered time."""
    from jit_kernel.benchmark import bench_model

    part = bench_model.kernel_part
    decode_linear = "void jit_kernel::gemm::decode_linear_kernel<1, __nv_bfloat16, 4>(jit_kernel::gemm::Params)"
    assert part(decode_linear) == "GEMMs"
    assert part("void jit_kernel::attention::decode_kernel<128, 4>(jit_kernel::attention::DecodeParams)") == "attention"
    assert part("void jit_kernel::norm::row_kernel<__nv_bfloat16, 4096, true, 1>(jit_kernel::norm::Params)") == (
        "our other ops"
    )
    assert part("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1") == "GEMMs"
    assert part("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT") == "GEMMs"
    assert part("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)") == "GEMMs"
    assert part("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1") == "attention"
    assert part("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>(...)") == "attention"
    assert part("void at::native::index_copy_kernel_impl<at::native::OpaqueType<2> >(...)") == "other kernels"
    assert part("Memcpy DtoD (Device -> Device)") == "other kernels"
    assert bench_model.short_kernel_name(decode_linear) == "gemm::decode_linear_kernel"

    # (name, start, end): a PDL kernel's span starting inside its predecessor's counts from that one's end
    assert bench_model.exclusive_times([("b", 5.0, 12.0), ("a", 0.0, 10.0), ("c", 11.0, 11.5), ("d", 20.0, 21.0)]) == [
        ("a", 10.0),
        ("b", 2.0),
        ("c", 0.0),
        ("d", 1.0),
    ]
    spans = [
        (decode_linear, 300.0),  # 20 replays: 15 us a step
        ("nvjet_tst_64x8", 200.0),
        ("void jit_kernel::attention::decode_kernel<128>(p)", 40.0),
        ("void jit_kernel::norm::row_kernel<4096>(p)", 20.0),
        ("void jit_kernel::rope::apply<1>(p)", 10.0),
        ("void at::native::fill<float>(x)", 10.0),
    ]
    kernels, clock = [], 0.0
    for name, us in spans:  # back to back, each (but the first) launched 1 us before the previous one ends
        start = max(0.0, clock - 1.0)
        kernels.append((name, start, clock + us))
        clock += us
    rows = bench_model.profile_rows(40.0, kernels, replays=20)
    assert [row[0] for row in rows] == [*bench_model.PROFILE_PARTS, "step (CUDA-graph median)"]
    by_part = {row[0]: row[1:] for row in rows}
    assert by_part["GEMMs"] == ["25.0", "62.5%", "gemm::decode_linear_kernel 15.0, nvjet_tst_64x8 10.0"]
    assert by_part["attention"][:2] == ["2.0", "5.0%"]
    assert by_part["our other ops"] == ["1.5", "3.8%", "norm::row_kernel 1.0, rope::apply 0.5"]
    assert by_part["other kernels"][:2] == ["0.5", "1.2%"]
    assert by_part["gaps between kernels"][:2] == ["11.0", "27.5%"]
    assert bench_model.parse_args(["--profile"]).profile and not bench_model.parse_args([]).profile


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_bench_model_configs_have_the_8b_shapes(name: str) -> None:
    from jit_kernel.benchmark import bench_model

    config = bench_model.model_config(name, 4)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        4096,
        32,
        8,
        128,
    )
    assert config.num_hidden_layers == 4
    assert config.intermediate_size == {"llama": 14336, "qwen3": 12288}[name]
    assert config.rope_parameters["rope_theta"] == {"llama": 500000.0, "qwen3": 1000000.0}[name]


def test_bench_model_moe_config_has_the_30b_a3b_shape() -> None:
    from jit_kernel.benchmark import bench_model

    config = bench_model.model_config("qwen3_moe", 4)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        2048,
        32,
        4,
        128,
    )
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (128, 8, 768)
    assert config.norm_topk_prob is True and config.num_hidden_layers == 4 and not config.mlp_only_layers
    assert config.rope_parameters["rope_theta"] == 1000000.0


@pytest.mark.parametrize("name", ["llama", "qwen3", "qwen3_moe"])
def test_bench_model_builds_and_checks_tiny_models_on_cpu(name: str) -> None:
    from jit_kernel.benchmark import bench_model

    shape = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if name == "qwen3_moe":
        shape.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    config = bench_model.model_config(name, 2, head_dim=16, **shape)
    models, fp32, missing = bench_model.build_models(config, "cpu", ["unpatched", "jit_kernel"])
    assert not missing and list(models) == ["unpatched", "jit_kernel"]
    patched = [module_name for module_name, _ in jt.patched_modules(models["jit_kernel"])]
    assert patched and not list(jt.patched_modules(models["unpatched"]))
    assert ("model.layers.1.mlp.gate" in patched) == (name == "qwen3_moe")
    rows = bench_model.correctness(models, fp32, "cpu")
    assert [row[0] for row in rows] == ["unpatched", "jit_kernel"]
    assert float(rows[1][1]) > 0.999 and float(rows[1][3]) > 0.999


def test_bench_model_fp8_variants_build_and_agree_on_cpu() -> None:
    from jit_kernel.benchmark import bench_model

    shape = dict(vocab_size=256, hidden_size=512, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2)
    config = bench_model.model_config("qwen3_fp8", 2, head_dim=128, **shape)
    variants = ["jit_kernel_two_launch", "jit_kernel"]
    models, fp32, missing = bench_model.build_models(config, "cpu", variants, fp8=True)
    assert not missing and list(models) == variants
    assert type(fp32.model.layers[0].mlp.up_proj) is torch.nn.Linear  # dequantised
    assert all(jt.patched_modules(m) for m in models.values())
    rows = bench_model.correctness(models, fp32, "cpu", reference="jit_kernel_two_launch")
    assert [row[2] for row in rows] == ["yes", "yes"] and float(rows[1][3]) > 0.99
