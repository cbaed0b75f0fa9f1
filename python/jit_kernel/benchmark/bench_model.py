"""Decode steps and a prefill of Hugging Face transformers models, unpatched and patched by
``jit_kernel.integrations.transformers.apply`` (and by the same integration with FlashInfer's ops,
where FlashInfer imports), in eager mode, replayed from a CUDA graph and under
``torch.compile(mode="reduce-overhead", fullgraph=True)`` (unpatched and jit_kernel); times are
medians of CUDA-event pairs around each call after warm-up, in microseconds. Eager decode steps are
bound by the host (transformers' Python and, in the fp8 model, the host side of each
``torch._scaled_mm``): they follow the machine's CPU more than the kernels, and the CUDA-graph and
compiled rows are the ones that compare kernels.

    python -m jit_kernel.benchmark.bench_model                       # the four models, 4 layers
    python -m jit_kernel.benchmark.bench_model --quick               # 1 layer, batch 1: a smoke test
    python -m jit_kernel.benchmark.bench_model --json-dir bench-json # + JSON results (report.py)
    python -m jit_kernel.benchmark.bench_model --attention           # + jit_kernel with each other
                                                                     #   one-token attention choice
    python -m jit_kernel.benchmark.bench_model --profile             # + where jit_kernel's graph step
                                                                     #   at batch 1 goes, by part

Models: Llama-3-8B-, Qwen3-8B- and Qwen3-30B-A3B-shaped configs written here (no download),
``--layers`` decoder layers (default 4), bf16, random weights, sdpa attention; and Qwen3-8B-FP8, the
Qwen3-8B shape with its decoder layers' linear layers as transformers' fine-grained fp8 ones
(:func:`fine_grained_fp8`), timed patched by jit_kernel (each norm and the group quant of its output
in one launch) against the same integration with the norm and the quant as two launches, and with
every fp8 GEMM on ``torch._scaled_mm`` (none on ``decode_linear_fp8``); the unpatched fp8 model
needs the ``kernels`` package's Hub kernel, and reads n/a where it cannot load.
The mixture of experts runs transformers' default experts implementation in every variant
(``grouped_mm`` on an H100; the tables name it); jit_kernel routes with ``topk_softmax``,
FlashInfer's variant keeps transformers' router (FlashInfer has no softmax top-k). A decode step is
one token per sequence at batch ``--batches`` (default 1, 8, 32) against a ``StaticCache`` of
``--context`` tokens (default 1024; the step attends to all of them through a 4D mask given to the
model, built once, so the mask is no part of the step); the prefill is ``--prefill`` tokens (default
1024) of one sequence, eager. Before the timings, a correctness check: logits of a 2 x 128-token
prompt from each variant against the unpatched bf16 model (the fp8 model: its two-launch variant;
cosine similarity, and whether they are equal bit for bit) and an fp32 copy (the fp8 model: its
dequantised weights in fp32; cosine similarity, and the argmax on the rows whose fp32 top-1 leads
its top-2 by more than half the row's standard deviation). Last, per model and variant, the
CUDA-graph decode step at batch 1 against its weights' read: the bytes of the weights a one-token
step reads (:func:`step_weight_bytes`) over the read bandwidth of a 2 GiB ``torch.sum`` measured in
the same run (``_tables.read_gbps``), and the step's time as a multiple of that.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import math
import re
import statistics
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from jit_kernel.benchmark import _tables, results

_T = TypeVar("_T")

MODELS = ("llama", "qwen3", "qwen3_moe", "qwen3_fp8")
# Models whose decoder layers' linear layers are transformers' fine-grained fp8 ones (FP8Linear),
# and the bf16 config they are quantised from.
FP8_MODELS = {"qwen3_fp8": "qwen3"}
# variant -> apply() keywords (None: the model as transformers builds it)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "unpatched": None,
    "jit_kernel": {"backend": "jit_kernel"},
    "flashinfer": {"backend": "flashinfer"},
    # --ablate: jit_kernel without the merged GEMMs (the model's own MLP, and q/k/v projections)
    "jit_kernel_unmerged": {"backend": "jit_kernel", "mlp": False, "qkv": False},
    # fp8 models: each norm before fp8 linear layers as our two launches (the norm, then the group quant)
    "jit_kernel_two_launch": {"backend": "jit_kernel_two_launch"},
    # --attention: jit_kernel with each one-token attention choice other than the default
    "jit_kernel_decode_attention": {"backend": "jit_kernel", "fields": {"one_token_attention": "decode_attention"}},
    "jit_kernel_sdpa_gqa": {"backend": "jit_kernel", "fields": {"one_token_attention": "sdpa_gqa"}},
    "jit_kernel_packed": {"backend": "jit_kernel", "fields": {"one_token_attention": "packed"}},
    # fp8 models: every fp8 linear layer on torch._scaled_mm, none on decode_linear_fp8
    "jit_kernel_scaled_mm": {"backend": "jit_kernel", "fields": {"fp8_decode_linear": None}},
}
# "fields": Backend fields the variant replaces in its backend (dataclasses.replace).
# The --attention variants, by choice.
ATTENTION_VARIANTS = {
    "decode_attention": "jit_kernel_decode_attention",
    "sdpa_gqa": "jit_kernel_sdpa_gqa",
    "packed": "jit_kernel_packed",
}
LABELS_VARIANT = {
    "unpatched": "unpatched",
    "jit_kernel": "jit_kernel",
    "flashinfer": "FlashInfer",
    "jit_kernel_unmerged": "jit_kernel, unmerged",
    "jit_kernel_two_launch": "jit_kernel, norm then quant",
    "jit_kernel_decode_attention": "jit_kernel, decode_attention",
    "jit_kernel_sdpa_gqa": "jit_kernel, SDPA enable_gqa",
    "jit_kernel_packed": "jit_kernel, SDPA packed heads",
    "jit_kernel_scaled_mm": "jit_kernel, fp8 GEMMs on _scaled_mm",
}
MODES = ("eager", "graph", "compile")
# Compiled: the unpatched model and jit_kernel's (each compile costs tens of seconds; FlashInfer's
# variant is timed eager and in a CUDA graph).
COMPILED_VARIANTS = ("unpatched", "jit_kernel")
DECISIVE_MARGIN = 0.5  # in standard deviations of the row's fp32 logits

# The shapes of meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-8B and Qwen/Qwen3-30B-A3B (their config.json
# values). Qwen3-30B-A3B: every layer a mixture of 128 experts (moe_intermediate 768), top-8
# renormalised. By these shapes, 4 of its 48 layers hold 6.2 GB in bf16 (4.8 GB of experts, 1.2 GB
# of embedding and head); three variants and the fp32 copy of the correctness check, 31 GB, fit on
# one H100, where all 48 layers (61 GB in bf16) would not fit twice.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "qwen3": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bos_token_id=151643,
        eos_token_id=151645,
    ),
}
LABELS = {"llama": "Llama-3-8B", "qwen3": "Qwen3-8B", "qwen3_moe": "Qwen3-30B-A3B", "qwen3_fp8": "Qwen3-8B-FP8"}


def default_one_token_attention() -> str:
    """The integration's one-token attention choice (``backends.ONE_TOKEN_ATTENTION``), read at run time."""
    from jit_kernel.integrations.transformers import backends

    return backends.ONE_TOKEN_ATTENTION


def model_config(name: str, layers: int, **overrides: Any) -> Any:
    """The transformers config of ``name`` (one of :data:`MODELS`) with ``layers`` decoder layers."""
    from transformers import AutoConfig

    values = dict(CONFIGS[FP8_MODELS.get(name, name)])
    model_type = values.pop("model_type")
    rope_theta = values.pop("rope_theta")
    values.update(num_hidden_layers=layers, **overrides)
    config = AutoConfig.for_model(model_type, **values)
    # transformers 5 keeps rope_theta in rope_parameters
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope.update(rope_type=rope.get("rope_type", "default"), rope_theta=rope_theta)
    config.rope_parameters = rope
    config._attn_implementation = "sdpa"
    return config


def fine_grained_fp8(model: Any) -> Any:
    """``model`` with every ``nn.Linear`` of its decoder layers replaced, in place, by transformers'
    ``FP8Linear`` (128 x 128 weight blocks, dynamic activation scales), its weight quantised the way
    transformers' ``FineGrainedFP8Config`` quantises a checkpoint on load: per block ``scale =
    absmax / 448`` (1 for an all-zero block), ``weight_scale_inv = scale``, ``q = e4m3(clamp(w /
    scale))``. The embedding and the head stay as they are (the config's default)."""
    from torch import nn
    from transformers.integrations.finegrained_fp8 import FP8Linear

    block = 128
    for name, module in list(model.named_modules()):
        if type(module) is not nn.Linear or ".layers." not in f".{name}":
            continue
        weight = module.weight.detach()
        n, k = weight.shape
        with torch.device("meta"):
            fp8 = FP8Linear(k, n, block_size=(block, block), has_bias=module.bias is not None)
        blocks = weight.float().reshape(n // block, block, k // block, block)
        absmax = blocks.abs().amax(dim=(1, 3))
        scale = torch.where(absmax > 0, absmax / 448.0, torch.ones_like(absmax))
        q = (blocks / scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(n, k)
        fp8.weight = nn.Parameter(q, requires_grad=False)
        fp8.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
        if module.bias is not None:
            fp8.bias = nn.Parameter(module.bias.detach().clone(), requires_grad=False)
        model.set_submodule(name, fp8)
    return model


def dequantized_fp32(model: Any) -> Any:
    """A float32 copy of ``model`` whose fp8 linear layers are ``nn.Linear`` layers holding their
    dequantised weights: the exact model of the fp8 weights (only the activations' quantisation
    separates an fp8 run from it)."""
    from torch import nn

    import jit_kernel.integrations.transformers as jt

    copy_ = copy.deepcopy(model)
    for name, module in list(copy_.named_modules()):
        if type(module).__name__ != "FP8Linear":
            continue
        n, k = module.weight.shape
        linear = nn.Linear(k, n, bias=module.bias is not None, device=module.weight.device)
        with torch.no_grad():
            linear.weight.copy_(jt._dequantize(module.weight, module.weight_scale_inv, jt.FP8_BLOCK))
            if module.bias is not None:
                linear.bias.copy_(module.bias.float())
        copy_.set_submodule(name, linear)
    return copy_.float()


def two_launch_backend(backend: Any) -> Any:
    """``backend`` (an integration Backend) with its fused norm + fp8 group quant ops replaced by
    two of its launches each: the norm (``rmsnorm``, ``fused_add_rmsnorm``), then ``group_quant``
    of its output. The same results, bit for bit, where the fused ops equal that composition (as
    jit_kernel's do)."""

    def rmsnorm_group_quant(x: torch.Tensor, w: torch.Tensor, eps: float, q: torch.Tensor, s: torch.Tensor) -> Any:
        normed = backend.rmsnorm(x, w, eps)
        backend.group_quant(normed, q, s)
        return normed

    def fused_add_rmsnorm_group_quant(
        x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, q: torch.Tensor, s: torch.Tensor
    ) -> Any:
        backend.fused_add_rmsnorm(x, residual, w, eps)
        backend.group_quant(x, q, s)
        return x

    return dataclasses.replace(
        backend,
        name=f"{backend.name}_two_launch",
        rmsnorm_group_quant=rmsnorm_group_quant,
        fused_add_rmsnorm_group_quant=fused_add_rmsnorm_group_quant,
    )


def build_models(
    config: Any, device: str, variants: Sequence[str], fp8: bool = False
) -> tuple[dict[str, Any], Any, dict[str, str]]:
    """(bf16 model per variant that could be built, the fp32 copy, variant -> why it is missing).
    Random weights, the same in every variant. ``fp8``: the decoder layers' linear layers become
    transformers' fine-grained fp8 ones (:func:`fine_grained_fp8`), and the fp32 copy holds their
    dequantised weights. On a CPU the patched variants use the integration's torch reference
    backend (a check of the benchmark's own code, not a measurement)."""
    from transformers import AutoModelForCausalLM

    import jit_kernel.integrations.transformers as jt

    torch.manual_seed(0)
    with torch.device(device):
        fp32 = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    models: dict[str, Any] = {}
    missing: dict[str, str] = {}
    base = copy.deepcopy(fp32).to(torch.bfloat16)
    if fp8:
        base = fine_grained_fp8(base)
        fp32 = dequantized_fp32(base)
    for variant in variants:
        options = VARIANTS[variant]
        model = base if options is None else copy.deepcopy(base)
        if options is not None:
            backend = options["backend"] if device == "cuda" else "torch"
            if options["backend"] == "jit_kernel_two_launch":
                backend = two_launch_backend(jt.TORCH if device != "cuda" else jt.get_backend("jit_kernel"))
            options = dict(options)
            if "fields" in options:
                base_backend = jt.get_backend(backend) if isinstance(backend, str) else backend
                backend = dataclasses.replace(base_backend, **options.pop("fields"))
            options = {**options, "backend": backend}
            try:
                report = jt.apply(model, **options)
            except ImportError as error:
                missing[variant] = f"{variant} not importable ({error})"
                continue
            if not report:
                missing[variant] = f"apply() patched nothing: {report.skipped}"
                continue
        models[variant] = model
    return models, fp32, missing


def step_weight_bytes(model: Any) -> int:
    """The bytes of weights one decode step at batch 1 reads: every parameter once (a tied head and
    embedding once, as the head), less the input embedding (a step reads one row of it), with the
    experts of a mixture-of-experts layer at ``num_experts_per_tok / num_experts`` of their bytes
    (the experts one token is routed to). fp8 weights count one byte an element, their scales
    included."""
    config = model.config
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    skip = embedding.weight if embedding is not None else None
    if head is not None and getattr(head, "weight", None) is skip:
        skip = None  # tied: the head reads all of it
    experts = int(getattr(config, "num_experts", 0) or 0)
    routed = int(getattr(config, "num_experts_per_tok", 0) or 0)
    total = 0.0
    for name, p in model.named_parameters():  # each parameter once (tied ones under one name)
        if p is skip:
            continue
        nbytes = p.numel() * p.element_size()
        if experts and ".experts." in f".{name}":
            nbytes *= routed / experts
        total += nbytes
    return int(total)


def weights_read_header() -> list[str]:
    return ["model", "variant", "weights read MB", "read GB/s", "weights' read us", "step us", "step / read"]


def weights_read_row(model: str, variant: str, nbytes: int, gbps: float, step_us: float | None) -> list[object]:
    """A row of the weights' read table: the step's time as a multiple of ``nbytes`` read at ``gbps``."""
    read_us = nbytes / (gbps * 1e3) if gbps == gbps and gbps > 0 else None
    ratio = f"{step_us / read_us:.2f}x" if step_us and read_us else "n/a"
    gbps_cell = f"{gbps:.0f}" if read_us else "n/a"
    return [model, LABELS_VARIANT[variant], f"{nbytes / 1e6:.1f}", gbps_cell, _us(read_us), _us(step_us), ratio]


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def correctness(
    models: dict[str, Any],
    fp32: Any,
    device: str,
    batch: int = 2,
    length: int = 128,
    notes: list[str] | None = None,
    reference: str = "unpatched",
) -> list[list[object]]:
    """Per variant: cosine against the ``reference`` variant and against fp32, whether its logits
    equal the reference's bit for bit, and the argmax on the decisive rows of the fp32 logits (top-1
    ahead of top-2 by more than DECISIVE_MARGIN). A variant whose forward fails is removed from
    ``models``, the error in ``notes``."""
    vocab = fp32.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
    logits: dict[str, torch.Tensor] = {}
    with torch.inference_mode():
        exact = fp32(tokens, use_cache=False).logits.float()
        for name, model in list(models.items()):
            try:
                logits[name] = model(tokens, use_cache=False).logits.float()
            except Exception as error:  # e.g. transformers' fp8 layers without their Hub kernel
                del models[name]
                first = str(error).splitlines()[0] if str(error) else ""
                (notes if notes is not None else []).append(f"{name} does not run: {type(error).__name__}: {first}")
    top = exact.topk(2, dim=-1).values
    decisive = (top[..., 0] - top[..., 1]) > DECISIVE_MARGIN * exact.std(-1)
    expected = exact.argmax(-1)[decisive]
    rows: list[list[object]] = []
    for name, got in logits.items():
        agree = int((got.argmax(-1)[decisive] == expected).sum())
        base = logits.get(reference)
        vs_reference = _cosine(got, base) if base is not None else float("nan")
        equal = "n/a" if base is None else ("yes" if torch.equal(got, base) else "no")
        cosine_exact = f"{_cosine(got, exact):.6f}"
        rows.append([name, f"{vs_reference:.6f}", equal, cosine_exact, f"{agree}/{int(decisive.sum())}"])
    return rows


# ---------------------------------------------------------------------------------------------
# Timing


def median_us(fn: Callable[[], object], warmup: int, iters: int, before: Callable[[], None] | None = None) -> float:
    """Median over ``iters`` calls of the time between CUDA events recorded around each call."""
    for _ in range(warmup):
        fn()
    if before is not None:
        before()
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in pairs)


def cache_keyword(model: Any) -> str:
    """The forward's name for the cache: ``cache`` (transformers >= 5.18) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class DecodeStep:
    """One decode step of ``model`` at batch ``batch``: the inputs, a StaticCache of ``context``
    tokens holding ``context // 2`` of them (its write position is put back before every
    measurement), and a 4D mask over the cache."""

    def __init__(self, model: Any, batch: int, context: int, device: str) -> None:
        from transformers import StaticCache

        self.model, self.filled = model, context // 2
        self.cache = StaticCache(config=model.config, max_cache_len=context)
        vocab = model.config.vocab_size
        keyword = cache_keyword(model)
        prompt = torch.randint(0, vocab, (batch, 4), generator=torch.Generator().manual_seed(2)).to(device)
        with torch.inference_mode():
            model(prompt, **{keyword: self.cache})  # allocates the cache's tensors
        self.token = torch.randint(0, vocab, (batch, 1), generator=torch.Generator().manual_seed(3)).to(device)
        self.position = torch.full((batch, 1), self.filled, dtype=torch.long, device=device)
        visible = torch.arange(context, device=device) <= self.filled
        self.mask = visible.view(1, 1, 1, context).expand(batch, 1, 1, context).contiguous()
        self.kwargs = {keyword: self.cache, "attention_mask": self.mask, "position_ids": self.position}
        self.rewind()

    def rewind(self) -> None:
        with torch.inference_mode():  # the cache's tensors were made under inference mode
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(self.filled)

    def __call__(self, model: Any = None) -> Any:
        return (self.model if model is None else model)(self.token, use_cache=True, **self.kwargs)


def time_eager(step: DecodeStep, warmup: int, iters: int) -> float:
    with torch.inference_mode():
        step.rewind()
        return median_us(step, warmup, iters, step.rewind)


def capture_graph(step: DecodeStep) -> torch.cuda.CUDAGraph:
    """``step`` captured in a CUDA graph after three eager calls on a side stream."""
    with torch.inference_mode():
        step.rewind()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(stream)
        step.rewind()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    return graph


def time_graph(step: DecodeStep, warmup: int, iters: int) -> float:
    graph = capture_graph(step)
    with torch.inference_mode():
        return median_us(graph.replay, warmup, iters, step.rewind)


# --profile: the parts of a CUDA-graph step, in the order the table lists them.
PROFILE_PARTS = ("GEMMs", "attention", "our other ops", "other kernels", "gaps between kernels")
PROFILE_REPLAYS = 20
# cuBLAS / cuBLASLt kernel names (sm90_xmma_gemm_*, nvjet_*, cutlass kernels, gemv*, splitKreduce).
_CUBLAS = re.compile(r"gemm|gemv|nvjet|cutlass|xmma|splitk|cublas", re.IGNORECASE)
# cuDNN's and torch's SDPA kernels (cudnn_generated_*_sdpa_*, flash / memory-efficient fmha).
_TORCH_ATTENTION = re.compile(r"sdpa|fmha|flash|attention|cudnn", re.IGNORECASE)


def kernel_part(name: str) -> str:
    """The part of a decode step a CUDA kernel (or copy, or fill) belongs to, by its name: our
    kernels are in the ``jit_kernel::`` namespaces (``jit_kernel::gemm`` GEMMs,
    ``jit_kernel::attention`` attention), the others are cuBLAS's GEMMs, SDPA's attention or torch's."""
    if "jit_kernel::" in name:
        if "jit_kernel::gemm" in name:
            return "GEMMs"
        return "attention" if "jit_kernel::attention" in name else "our other ops"
    if _TORCH_ATTENTION.search(name):  # first: flash-decoding's "splitkv" is not cuBLAS's split-K
        return "attention"
    return "GEMMs" if _CUBLAS.search(name) else "other kernels"


def short_kernel_name(name: str) -> str:
    """A kernel's demangled name without its return type, template arguments and parameters, and
    with at most its last two scopes: ``jit_kernel::gemm::decode_linear_kernel``."""
    name = re.sub(r"^void ", "", name)
    for pattern in (r"<[^<>]*>", r"\([^()]*\)"):
        while re.search(pattern, name):
            name = re.sub(pattern, "", name)
    return "::".join(name.split("::")[-2:]).strip()[:60]


def exclusive_times(kernels: Sequence[tuple[str, float, float]]) -> list[tuple[str, float]]:
    """Each kernel's ``(name, us)`` from its ``(name, start, end)`` on one stream, counted from the
    end of the kernels before it: a kernel launched with PDL starts while the previous one runs and
    waits for it, so its own span would count that kernel's time twice. The times add up to the
    stream's busy time."""
    out = []
    covered = -math.inf
    for name, start, end in sorted(kernels, key=lambda kernel: kernel[1]):
        out.append((name, max(0.0, end - max(start, covered))))
        covered = max(covered, end)
    return out


def profile_rows(step_us: float, kernels: Sequence[tuple[str, float, float]], replays: int) -> list[list[object]]:
    """The step's parts (:data:`PROFILE_PARTS`): each part's kernel time per step (``kernels``: the
    (name, start, end) in us of every kernel the profiler saw over ``replays`` steps, each counted
    by :func:`exclusive_times`), its share of ``step_us``, and its three largest kernels; the gaps
    are the step's time no kernel covers."""
    per_part: dict[str, dict[str, float]] = {part: {} for part in PROFILE_PARTS}
    for name, us in exclusive_times(kernels):
        names = per_part[kernel_part(name)]
        short = short_kernel_name(name)
        names[short] = names.get(short, 0.0) + us / replays
    rows: list[list[object]] = []
    busy = 0.0
    for part in PROFILE_PARTS[:-1]:
        total = sum(per_part[part].values())
        busy += total
        largest = sorted(per_part[part].items(), key=lambda item: -item[1])[:3]
        rows.append(
            [part, f"{total:.1f}", f"{100 * total / step_us:.1f}%", ", ".join(f"{n} {t:.1f}" for n, t in largest)]
        )
    gaps = step_us - busy
    rows.append([PROFILE_PARTS[-1], f"{gaps:.1f}", f"{100 * gaps / step_us:.1f}%", ""])
    rows.append(["step (CUDA-graph median)", f"{step_us:.1f}", "100.0%", ""])
    return rows


def profile_graph(step: DecodeStep, replays: int = PROFILE_REPLAYS) -> list[list[object]]:
    """:func:`profile_rows` of ``step`` captured in a CUDA graph: its median over ``replays``
    replays, then torch.profiler's kernel records over ``replays`` more."""
    graph = capture_graph(step)
    with torch.inference_mode():
        step_us = median_us(graph.replay, 3, replays, step.rewind)
        step.rewind()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
    kernels = [
        (event.name, float(event.time_range.start), float(event.time_range.end))
        for event in profiler.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    return profile_rows(step_us, kernels, replays)


def time_compile(step: DecodeStep, compiled: Any, warmup: int, iters: int) -> float:
    def call() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        step(compiled)

    with torch.inference_mode():
        step.rewind()
        return median_us(call, warmup, iters, step.rewind)


def time_prefill(model: Any, tokens: int, context: int, device: str, warmup: int, iters: int) -> float:
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max(context, tokens))
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(4))
    ids = ids.to(device)
    keyword = cache_keyword(model)

    def rewind() -> None:
        for layer in cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(0)

    def call() -> None:
        rewind()
        model(ids, use_cache=True, **{keyword: cache})

    with torch.inference_mode():
        return median_us(call, warmup, iters)


# ---------------------------------------------------------------------------------------------
# The run


def _ratio(base: float | None, other: float | None) -> str:
    if not base or not other:
        return "n/a"
    return f"{base / other:.2f}x"


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def time_header(variants: Sequence[str], baseline: str = "unpatched") -> list[str]:
    """Per variant its time, and for the others the ``baseline`` variant's time over theirs."""
    header = []
    for variant in variants:
        header.append(f"{LABELS_VARIANT[variant]} us")
        if variant != baseline:
            header.append(f"{LABELS_VARIANT[variant]} speedup")
    return header


def time_cells(variants: Sequence[str], times: dict[str, float | None], baseline: str = "unpatched") -> list[object]:
    base = times.get(baseline)
    cells: list[object] = []
    for variant in variants:
        cells.append(_us(times.get(variant)))
        if variant != baseline:
            cells.append(_ratio(base, times.get(variant)))
    return cells


def correctness_header(reference: str) -> list[str]:
    label = LABELS_VARIANT[reference]
    return ["variant", f"cosine vs {label}", f"= {label}", "cosine vs fp32", "argmax = fp32 on decisive rows"]


def _print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def _measure(label: str, fn: Callable[[], _T], notes: list[str]) -> _T | None:
    """``fn()``, or None with a note where it fails (a variant's failure is its own cell)."""
    results.check_stop()
    try:
        return fn()
    except KeyboardInterrupt:
        raise
    except Exception as error:
        if results.stop_requested():
            raise KeyboardInterrupt from error
        notes.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        traceback.print_exc()
        return None


def run_model(
    name: str,
    args: argparse.Namespace,
    tables: list[results.Json],
    notes: list[str],
    gbps: float = float("nan"),
    read_rows: list[list[object]] | None = None,
) -> None:
    """Measure model ``name``; its rows of the weights' read table (at ``gbps``) go to ``read_rows``."""
    device = "cuda"
    started = time.perf_counter()
    config = model_config(name, args.layers)
    fp8 = name in FP8_MODELS
    if fp8:  # FlashInfer's backend has no group quant: its variant would be transformers' fp8 layers
        variants = ["unpatched", "jit_kernel_two_launch", "jit_kernel_scaled_mm", "jit_kernel"]
        baseline = "jit_kernel_two_launch"
    else:
        variants, baseline = ["unpatched", "jit_kernel"] + ([] if args.no_flashinfer else ["flashinfer"]), "unpatched"
    variants += ["jit_kernel_unmerged"] if args.ablate else []
    if args.attention and not fp8:
        default = default_one_token_attention()
        variants += [v for choice, v in ATTENTION_VARIANTS.items() if choice != default]
    models, fp32, missing = build_models(config, device, variants, fp8=fp8)
    variants = [v for v in variants if v not in missing]
    notes.extend(f"{LABELS[name]}: {why}" for why in missing.values())
    precision = "bf16 activations, fp8 linear layers (128 x 128 blocks)" if fp8 else "bf16"
    label = f"{LABELS[name]}-shaped, {args.layers} layer{'s' if args.layers != 1 else ''}, {precision}"
    experts = getattr(next(iter(models.values())).config, "_experts_implementation", None)
    if getattr(config, "num_experts", 0) and experts:
        label += f", experts: {experts}"

    model_notes: list[str] = []
    rows = correctness(models, fp32, device, notes=model_notes, reference=baseline)
    notes.extend(f"{LABELS[name]}: {note}" for note in model_notes)
    variants = [v for v in variants if v in models]
    del fp32
    torch.cuda.empty_cache()
    exact = "its dequantised weights in fp32" if fp8 else "an fp32 copy"
    title = f"correctness, {label}: logits of 2 x 128 tokens (fp32: {exact})"
    header = correctness_header(baseline)
    _print_table(title, header, rows)
    tables.append(results.cells_table(f"{name}_correctness", title, header, rows))

    weight_bytes = {variant: step_weight_bytes(model) for variant, model in models.items()}
    graph_b1: dict[str, float | None] = {}
    decode_rows: list[list[object]] = []
    compiled = {}
    for mode in args.modes:
        for batch in args.batches:
            times: dict[str, float | None] = {}
            for variant, model in models.items():
                if mode == "compile" and variant not in COMPILED_VARIANTS:
                    continue
                tag = f"{LABELS[name]} {variant} {mode} b{batch}"
                step = DecodeStep(model, batch, args.context, device)
                if mode == "eager":
                    times[variant] = _measure(tag, lambda s=step: time_eager(s, args.warmup, args.iters), notes)
                elif mode == "graph":
                    times[variant] = _measure(tag, lambda s=step: time_graph(s, args.warmup, args.iters), notes)
                else:
                    if variant not in compiled:
                        compiled[variant] = torch.compile(model, mode="reduce-overhead", fullgraph=True)
                    times[variant] = _measure(
                        tag, lambda s=step, c=compiled[variant]: time_compile(s, c, args.warmup, args.iters), notes
                    )
                del step
            if mode == "graph" and batch == 1:
                graph_b1 = times
            row = [mode, batch, *time_cells(variants, times, baseline)]
            decode_rows.append(row)
            print(f"  [{time.perf_counter() - started:6.1f} s] {name} {mode} b{batch}: " + ", ".join(map(str, row[2:])))
    title = f"decode step, {label}, StaticCache of {args.context} tokens"
    header = ["mode", "batch", *time_header(variants, baseline)]
    _print_table(title, header, decode_rows)
    tables.append(results.cells_table(f"{name}_decode", title, header, decode_rows))

    if args.profile and "jit_kernel" in models:
        step = DecodeStep(models["jit_kernel"], 1, args.context, device)
        profile = _measure(f"{LABELS[name]} jit_kernel profile", lambda: profile_graph(step), notes)
        del step
        if profile is not None:
            title = (
                f"where a decode step goes, {label}, jit_kernel, batch 1, CUDA graph: kernel time per step "
                f"by part, each kernel from the end of the one before it (torch.profiler over {PROFILE_REPLAYS} "
                "replays)"
            )
            header = ["part", "us per step", "share of the step", "largest kernels (us per step)"]
            _print_table(title, header, profile)
            tables.append(results.cells_table(f"{name}_profile", title, header, profile))

    if args.prefill > 0:
        times = {
            variant: _measure(
                f"{LABELS[name]} {variant} prefill",
                lambda m=model: time_prefill(m, args.prefill, args.context, device, 2, args.prefill_iters),
                notes,
            )
            for variant, model in models.items()
        }
        prefill_row = [args.prefill, *time_cells(variants, times, baseline)]
        header = ["tokens", *time_header(variants, baseline)]
        title = f"prefill, eager, {label}, one sequence"
        _print_table(title, header, [prefill_row])
        tables.append(results.cells_table(f"{name}_prefill", title, header, [prefill_row]))
    if read_rows is not None:
        read_rows.extend(
            weights_read_row(LABELS[name], variant, weight_bytes[variant], gbps, graph_b1.get(variant))
            for variant in variants
        )
    print(f"  [{time.perf_counter() - started:6.1f} s] {name} done")
    del models, compiled
    torch._dynamo.reset()
    torch.cuda.empty_cache()


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    parser.add_argument("--batches", type=_int_list, default=[1, 8, 32], help="decode batch sizes (default 1,8,32)")
    parser.add_argument("--context", type=int, default=1024, help="StaticCache length of a decode step")
    parser.add_argument("--prefill", type=int, default=1024, help="prefill tokens (0: no prefill)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager, graph, compile")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50, help="timed calls per cell (median)")
    parser.add_argument("--prefill-iters", type=int, default=10)
    parser.add_argument("--no-flashinfer", action="store_true", help="leave FlashInfer out even where it imports")
    parser.add_argument(
        "--ablate", action="store_true", help="also time jit_kernel without the merged gate/up and q/k/v GEMMs"
    )
    parser.add_argument(
        "--attention",
        action="store_true",
        help="also time jit_kernel with each one-token attention choice other than the default "
        "(decode_attention, SDPA enable_gqa, SDPA packed heads)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile jit_kernel's CUDA-graph step at batch 1: kernel time by part (GEMMs, attention, ...)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: 1 layer, batch 1, prefill 128")
    parser.add_argument("--json-dir", metavar="DIR", help="write the tables as DIR/bench_model.json")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    for model in args.models:
        if model not in MODELS:
            parser.error(f"--models: unknown model {model!r}; known: {', '.join(MODELS)}")
    for mode in args.modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r}; known: {', '.join(MODES)}")
    if args.quick:
        args.layers, args.batches, args.prefill, args.warmup, args.iters = 1, [1], 128, 3, 10
    if args.layers < 1 or not args.batches or min(args.batches) < 1:
        parser.error("--layers and --batches must be positive")
    if args.context < 2 or args.warmup + args.iters >= args.context // 2:
        parser.error("--context must exceed 2 * (warmup + iters): each decode call writes one cache slot")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_model needs a CUDA GPU")
    json_dir = results.resolve_json_dir(args.json_dir)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    tables: list[results.Json] = []
    notes: list[str] = []
    read_rows: list[list[object]] = []
    complete = True
    with results.stoppable():
        try:
            gbps = _tables.read_gbps(_tables.Measurements())
            for name in args.models:
                run_model(name, args, tables, notes, gbps, read_rows)
        except KeyboardInterrupt:
            complete = False
            print("\ninterrupted: the tables above hold what was measured before the stop")
    if read_rows:
        if "graph" not in args.modes or 1 not in args.batches:
            notes.append(
                "the weights' read table needs --modes with graph and --batches with 1: its step times are n/a"
            )
        title = (
            "decode step at batch 1 (CUDA graph) against its weights' read: the bytes of the weights a "
            f"one-token step reads over the read bandwidth ({_tables.READ_NOTE})"
        )
        _print_table(title, weights_read_header(), read_rows)
        tables.append(results.cells_table("weights_read", title, weights_read_header(), read_rows))
    for note in notes:
        print(f"note: {note}")
    if json_dir:
        doc = results.document(
            "bench_model",
            results.first_paragraph(__doc__),
            results.command_line("bench_model", argv),
            tables,
            complete=complete,
            notes=notes,
        )
        print(f"results: {results.write(json_dir, doc)}")
    if not complete:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
