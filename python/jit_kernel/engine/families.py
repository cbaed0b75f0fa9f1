"""Every kernel family, and the grid of configurations the wheel prebuilds: the one obvious place.

CMake reads this module at configure time (``python -m jit_kernel.engine.aot``) to generate the
prebuilt library's translation units; the ops read it at run time to dispatch. A config missing
from a grid still works: it is JIT-compiled on first use and cached.

Keep this module free of torch imports (the build environment has no torch).
"""

from __future__ import annotations

from jit_kernel.engine.spec import IntRange, KernelSpec, OneOf

INT32 = IntRange(-(2**31), 2**31 - 1)
FLOAT_DTYPES = OneOf(("bf16_t", "fp16_t", "fp32_t"))

# The self-test family: runs on the CPU (host loop) and on CUDA, so that both dispatcher paths
# are exercised everywhere. Constants 1, 2 and 3 are prebuilt; any other compiles on first use.
ADD_CONSTANT_HOST = KernelSpec(
    family="add_constant_host",
    sources=("add_constant.h",),
    params=("constant",),
    exports={"run": "jit_kernel::add_constant::run_host<{args}>"},
    domains={"constant": INT32},
    prebuilt=((1,), (2,), (3,)),
    target="host",
)

# launch_site: the kernel lookup of an op's eager call, keyed in C++ by the launch's own
# arguments (csrc/launch_site.h; python/jit_kernel/ops/_eager.py uses it). Host code, no parameters.
LAUNCH_SITE = KernelSpec(
    family="launch_site",
    sources=("launch_site.h",),
    params=(),
    domains={},
    exports={"make": "jit_kernel::launch_site::make"},
    prebuilt=((),),
    target="host",
)

ADD_CONSTANT_CUDA = KernelSpec(
    family="add_constant",
    sources=("add_constant.cuh",),
    params=("constant",),
    exports={"run": "jit_kernel::add_constant::run_cuda<{args}>"},
    domains={"constant": INT32},
    prebuilt=((1,), (2,), (3,)),
)

# hicache: KV-cache row transfers (csrc/hicache.cuh). Config = (element_size, unroll, num_threads);
# one translation unit holds all four exports for int32 and int64 indices, and the block quota
# is a run-time argument, so a quota sweep compiles nothing. The grid: common row sizes
# (head_dim 128 x 1..16 heads in bf16, DeepSeek MLA 576 x bf16 = 1152 and fp8 = 576), each with
# its default unroll and 1024 threads per block.
HICACHE_NUM_THREADS = 1024
HICACHE_ROW_SIZES = (256, 512, 576, 1024, 1152, 2048, 4096)
HICACHE_UNROLLS = (1, 2, 4, 8, 16, 32)  # rows per warp: divides the 32 lanes


def hicache_default_unroll(element_size: int) -> int:
    """Rows per warp: small rows share a warp (4 rows of 8 lanes), large rows get all 32 lanes."""
    if element_size <= 512:
        return 4
    if element_size <= 1024:
        return 2
    return 1


HICACHE = KernelSpec(
    family="hicache",
    sources=("hicache.cuh",),
    params=("element_size", "unroll", "num_threads"),
    domains={
        "element_size": IntRange(16, 1 << 20, step=16),
        "unroll": OneOf(HICACHE_UNROLLS),
        "num_threads": IntRange(32, 1024, step=32),
    },
    exports={
        "run_one": "jit_kernel::hicache::HiCache<{args}>::run_one",
        "run_one_mla": "jit_kernel::hicache::HiCache<{args}>::run_one_mla",
        "run_all": "jit_kernel::hicache::HiCache<{args}>::run_all",
        "run_all_mla": "jit_kernel::hicache::HiCache<{args}>::run_all_mla",
    },
    prebuilt=tuple((size, hicache_default_unroll(size), HICACHE_NUM_THREADS) for size in HICACHE_ROW_SIZES),
)

# hicache_tma: the same transfers through the bulk-copy engine (csrc/hicache_tma.cuh, sm_90+), for
# rows that come in page-aligned runs. Config = (element_size, stage_rows): rows per shared-memory
# stage, the largest power of two up to 128 whose rows fit 32 KiB (hicache_tma_stage_rows; the C++
# template asserts the same value). The ops take it when the caller's page size is a multiple of
# stage_rows, so that a page fills whole stages and each stage moves in one bulk copy.
HICACHE_TMA_STAGE_BYTES = 32 * 1024
HICACHE_TMA_MAX_ROWS = 128
HICACHE_TMA_ROWS = tuple(1 << i for i in range(8))  # 1 .. 128


def hicache_tma_stage_rows(element_size: int) -> int:
    """Rows per bulk-copy stage for rows of ``element_size`` bytes; 0 when the row is not a positive
    multiple of 16 bytes or one row does not fit a stage (such rows take the register kernel)."""
    if element_size <= 0 or element_size % 16 or element_size > HICACHE_TMA_STAGE_BYTES:
        return 0
    rows = 1
    while rows * 2 <= HICACHE_TMA_MAX_ROWS and rows * 2 * element_size <= HICACHE_TMA_STAGE_BYTES:
        rows *= 2
    return rows


HICACHE_TMA = KernelSpec(
    family="hicache_tma",
    sources=("hicache_tma.cuh",),
    params=("element_size", "stage_rows"),
    domains={
        "element_size": IntRange(16, HICACHE_TMA_STAGE_BYTES, step=16),
        "stage_rows": OneOf(HICACHE_TMA_ROWS),
    },
    exports={
        "run_one": "jit_kernel::hicache::HiCacheTma<{args}>::run_one",
        "run_one_mla": "jit_kernel::hicache::HiCacheTma<{args}>::run_one_mla",
    },
    prebuilt=tuple((size, hicache_tma_stage_rows(size)) for size in HICACHE_ROW_SIZES),
)

# hicache_pages: whole-page transfers between the device pools and pinned host pages
# (csrc/hicache_pages.cuh): write-back from layer-first device pools to page-first and page-unified
# host layouts (direct stores through the host pages' device alias; a staging buffer and copy-engine
# copies on request), and load-back from page-unified host pages. Row sizes are run-time values: one
# config serves every shape.
HICACHE_PAGES = KernelSpec(
    family="hicache_pages",
    sources=("hicache_pages.cuh",),
    params=(),
    domains={},
    exports={
        "lf_pf": "jit_kernel::hicache_pages::run_lf_pf",
        "lf_pf_mla": "jit_kernel::hicache_pages::run_lf_pf_mla",
        "pu_write": "jit_kernel::hicache_pages::run_pu_write",
        "pu_write_mla": "jit_kernel::hicache_pages::run_pu_write_mla",
        "pu_load": "jit_kernel::hicache_pages::run_pu_load",
        "pu_load_mla": "jit_kernel::hicache_pages::run_pu_load_mla",
    },
    prebuilt=((),),
)

# stream_wait: a stream waits for a device flag, through the driver's stream memory operations
# (csrc/stream_wait.cuh). No template parameters.
STREAM_WAIT = KernelSpec(
    family="stream_wait",
    sources=("stream_wait.cuh",),
    params=(),
    domains={},
    exports={
        "wait": "jit_kernel::stream_wait::wait",
        "write": "jit_kernel::stream_wait::write",
        "wait_bounded": "jit_kernel::stream_wait::wait_bounded",
        "uses_driver_ops": "jit_kernel::stream_wait::uses_driver_ops",
    },
    prebuilt=((),),
)

# Norms (csrc/norm/). Config = (hidden or head_dim, dtype); GENERIC_WIDTH (0) is the generic kernel
# that takes D at run time (any D, strided or misaligned rows, fp32), which the domains' notes tell
# users. A specialised config also falls back to the generic kernel inside, for rows that are not
# aligned 16-byte vectors.
GENERIC_WIDTH = 0


def generic_width_note(uses: str) -> dict[int, str]:
    """The note on a width parameter's value 0, for its domain (``OneOf(..., notes=...)``)."""
    return {GENERIC_WIDTH: f"the generic kernel, which takes the width at run time; the ops use it for {uses}"}


_NORM_GENERIC = generic_width_note("every width without a specialised kernel, and for fp32")
NORM_HIDDEN_SIZES = (1024, 2048, 4096, 5120, 7168, 8192, 16384)
RMSNORM = KernelSpec(
    family="rmsnorm",
    sources=("norm/rmsnorm.cuh",),
    params=("hidden", "dtype"),
    # Other sizes are the ones the op specialises (any other D runs the generic kernel).
    domains={"hidden": OneOf((GENERIC_WIDTH, *NORM_HIDDEN_SIZES), _NORM_GENERIC), "dtype": FLOAT_DTYPES},
    # fused_add_cast: fused_add in SGLang's cast_x_before_out_mul=True rounding, a second export of
    # every config rather than a config parameter (the existing symbols keep their names). Each
    # 16-bit translation unit compiles its fused kernels once more (what that adds to a unit's
    # compile: docs/design/engine.md); fp32 reuses fused_add's.
    exports={
        "rmsnorm": "jit_kernel::norm::RMSNorm<{args}>::rmsnorm",
        "fused_add": "jit_kernel::norm::RMSNorm<{args}>::fused_add",
        "fused_add_cast": "jit_kernel::norm::RMSNorm<{args}>::fused_add_cast",
        "across_heads": "jit_kernel::norm::RMSNorm<{args}>::across_heads",
    },
    prebuilt=tuple((h, t) for h in NORM_HIDDEN_SIZES for t in ("bf16_t", "fp16_t"))
    + tuple((GENERIC_WIDTH, t) for t in ("bf16_t", "fp16_t", "fp32_t")),
)
QKNORM_HEAD_DIMS = (64, 128, 256)
QKNORM = KernelSpec(
    family="qknorm",
    sources=("norm/qknorm.cuh",),
    params=("head_dim", "dtype"),
    domains={"head_dim": OneOf((GENERIC_WIDTH, *QKNORM_HEAD_DIMS), _NORM_GENERIC), "dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::norm::QKNorm<{args}>::run"},
    prebuilt=tuple((d, t) for d in QKNORM_HEAD_DIMS for t in ("bf16_t", "fp16_t"))
    + tuple((GENERIC_WIDTH, t) for t in ("bf16_t", "fp16_t", "fp32_t")),
)
PER_TENSOR_QUANT_FP8 = KernelSpec(
    family="per_tensor_quant_fp8",
    sources=("quant/per_tensor_fp8.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "dynamic": "jit_kernel::quant::PerTensorQuantFp8<{args}>::dynamic",
        "static": "jit_kernel::quant::PerTensorQuantFp8<{args}>::static_scale",
        "absmax": "jit_kernel::quant::PerTensorQuantFp8<{args}>::absmax",
    },
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)
SCALE = KernelSpec(
    family="scale",
    sources=("scale.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::scale::run<{args}>"},
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)

# Rotary embedding with a cos/sin cache (csrc/rope/rope.cuh). Config = dtype only: head size,
# rotary dim, NeoX/GPT-J, position and cache dtypes are run-time values (no reduction over a head,
# so a compile-time head size would save one division per thread); one unit holds the vector and
# scalar kernels of both styles.
ROPE = KernelSpec(
    family="rope",
    sources=("rope/rope.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::rope::Rope<{args}>::run"},
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)
# Per-head RMSNorm + rope, fused (csrc/rope/qknorm_rope.cuh). Config = dtype only: one unit holds
# the fast kernels of head sizes 64, 128 and 256 (both styles, 16-bit dtypes) and the generic one
# (any D, partial rotary, any alignment, fp32), picked at run time.
QKNORM_ROPE = KernelSpec(
    family="qknorm_rope",
    sources=("rope/qknorm_rope.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::rope::QKNormRope<{args}>::run"},
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)

# Gated activations (csrc/activation.cuh): out = act(input[..., :d]) * input[..., d:]. Config = dtype
# only; d and the row strides are run-time, and one unit holds the three activations as exports.
ACTIVATION = KernelSpec(
    family="activation",
    sources=("activation.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "silu_and_mul": "jit_kernel::activation::Activation<{args}>::silu_and_mul",
        "gelu_and_mul": "jit_kernel::activation::Activation<{args}>::gelu_and_mul",
        "gelu_tanh_and_mul": "jit_kernel::activation::Activation<{args}>::gelu_tanh_and_mul",
    },
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)
# kv_store: new tokens' K/V rows into a paged KV cache at given slots (csrc/kv_store.cuh).
# Config = (activation dtype, cache dtype): the cache dtype is the activation dtype (a copy) or
# fp8_e4m3_t (x / scale, saturated). Row widths, strides and the index dtype are run-time, so one
# unit (both exports, int32/int64 indices, vector and scalar paths) serves every model; fp32
# activations compile on first use.
KV_STORE = KernelSpec(
    family="kv_store",
    sources=("kv_store.cuh",),
    params=("dtype", "cache_dtype"),
    domains={"dtype": FLOAT_DTYPES, "cache_dtype": OneOf(("bf16_t", "fp16_t", "fp32_t", "fp8_e4m3_t"))},
    exports={
        "store": "jit_kernel::kv_store::KvStore<{args}>::store",
        "mla": "jit_kernel::kv_store::KvStore<{args}>::mla",
    },
    prebuilt=(("bf16_t", "bf16_t"), ("fp16_t", "fp16_t"), ("bf16_t", "fp8_e4m3_t"), ("fp16_t", "fp8_e4m3_t")),
)
# fp8 quantisation per token (csrc/quant/per_token_fp8.cuh) and per group of 64 or 128 columns of a
# token (csrc/quant/per_token_group_fp8.cuh, also fused after silu_and_mul). Config = dtype only:
# the hidden size, the group size and the scale layout are run-time.
PER_TOKEN_QUANT_FP8 = KernelSpec(
    family="per_token_quant_fp8",
    sources=("quant/per_token_fp8.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "dynamic": "jit_kernel::token_quant::PerTokenQuantFp8<{args}>::dynamic",
        "static": "jit_kernel::token_quant::PerTokenQuantFp8<{args}>::static_scale",
    },
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)
PER_TOKEN_GROUP_QUANT_FP8 = KernelSpec(
    family="per_token_group_quant_fp8",
    sources=("quant/per_token_group_fp8.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "quant": "jit_kernel::token_quant::PerTokenGroupQuantFp8<{args}>::quant",
        "silu_and_mul_quant": "jit_kernel::token_quant::PerTokenGroupQuantFp8<{args}>::silu_and_mul_quant",
    },
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)

# RMSNorm (optionally after the residual add) fused with fp8 quantisation of its output
# (csrc/norm/norm_quant.cuh): a static per-tensor scale, dynamic per-token, and dynamic per-group of
# 64 or 128 columns. Config = (hidden, dtype) as rmsnorm's: a hidden size the kernels are
# specialised for (bf16 in the grid), or 0, the kernel that takes D at run time (every D, and each
# row reduced as rmsnorm reduces it, so the result is bit for bit rmsnorm then the quantiser). The
# output dtype (static: e4m3 or e5m2), the group size and the scale layout are run-time values.
NORM_QUANT_HIDDEN_SIZES = (2048, 4096, 5120, 7168, 8192)
# Prebuilt: Llama-/Qwen-sized 4096 and DeepSeek-sized 7168 rows and the generic kernel, in bf16 (3
# units a family: each unit adds to every source build, docs/design/engine.md); every other config of
# the list above compiles on first use.
_NORM_QUANT_GRID = ((4096, "bf16_t"), (7168, "bf16_t"), (GENERIC_WIDTH, "bf16_t"))
_NORM_QUANT_DOMAINS = {
    "hidden": OneOf(
        (GENERIC_WIDTH, *NORM_HIDDEN_SIZES),
        generic_width_note("every width or dtype without a specialised bf16 kernel"),
    ),
    "dtype": FLOAT_DTYPES,
}
RMSNORM_QUANT_FP8 = KernelSpec(
    family="rmsnorm_quant_fp8",
    sources=("norm/norm_quant.cuh",),
    params=("hidden", "dtype"),
    domains=_NORM_QUANT_DOMAINS,
    exports={
        "run": "jit_kernel::norm::RMSNormQuantFp8<{args}>::run",
        "fused_add": "jit_kernel::norm::RMSNormQuantFp8<{args}>::fused_add",
    },
    prebuilt=_NORM_QUANT_GRID,
)
RMSNORM_PER_TOKEN_QUANT_FP8 = KernelSpec(
    family="rmsnorm_per_token_quant_fp8",
    sources=("norm/norm_quant.cuh",),
    params=("hidden", "dtype"),
    domains=_NORM_QUANT_DOMAINS,
    exports={
        "run": "jit_kernel::norm::RMSNormPerTokenQuantFp8<{args}>::run",
        "fused_add": "jit_kernel::norm::RMSNormPerTokenQuantFp8<{args}>::fused_add",
    },
    prebuilt=_NORM_QUANT_GRID,
)
RMSNORM_PER_TOKEN_GROUP_QUANT_FP8 = KernelSpec(
    family="rmsnorm_per_token_group_quant_fp8",
    sources=("norm/norm_quant.cuh",),
    params=("hidden", "dtype"),
    domains=_NORM_QUANT_DOMAINS,
    exports={
        "run": "jit_kernel::norm::RMSNormPerTokenGroupQuantFp8<{args}>::run",
        "fused_add": "jit_kernel::norm::RMSNormPerTokenGroupQuantFp8<{args}>::fused_add",
    },
    prebuilt=_NORM_QUANT_GRID,
)
# Gemma's RMSNorm, x * rrms * (1 + w) (csrc/norm/gemma.cuh). Config = dtype only: D is run-time
# (Gemma's hidden sizes, 1152 to 5376, are none of rmsnorm's specialised ones).
GEMMA_RMSNORM = KernelSpec(
    family="gemma_rmsnorm",
    sources=("norm/gemma.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "rmsnorm": "jit_kernel::norm::GemmaRMSNorm<{args}>::rmsnorm",
        "fused_add": "jit_kernel::norm::GemmaRMSNorm<{args}>::fused_add",
    },
    prebuilt=(("bf16_t",),),  # Gemma checkpoints run in bf16; fp16 and fp32 compile on first use
)

# MoE routing and combine (csrc/moe/). Config = the logits' (activations') dtype only: expert counts,
# top-k, groups and hidden sizes are run-time. moe_align_block_size has no template parameter. Prebuilt:
# bf16 routing and combine (what serving runs), one unit each; the rest compiles on first use.
MOE_ROUTE = KernelSpec(
    family="moe_route",
    sources=("moe/routing.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"route": "jit_kernel::moe::MoeRoute<{args}>::route"},
    prebuilt=(("bf16_t",),),
)
MOE_ALIGN = KernelSpec(
    family="moe_align_block_size",
    sources=("moe/align.cuh",),
    params=(),
    domains={},
    exports={"run": "jit_kernel::moe_align::MoeAlign::run"},
    prebuilt=((),),
)
MOE_SUM_REDUCE = KernelSpec(
    family="moe_sum_reduce",
    sources=("moe/sum_reduce.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::moe_sum::MoeSumReduce<{args}>::run"},
    prebuilt=(("bf16_t",),),
)

# sampling: temperature / top-k / top-p / min-p filtering, then a draw, a renormalisation or a mask
# (csrc/sampling/sample.cuh). Config = the dtype of the logits or probabilities; the vocabulary,
# the batch and every parameter are run-time, so one instance serves every model.
SAMPLING = KernelSpec(
    family="sampling",
    sources=("sampling/sample.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::sampling::Sampler<{args}>::run"},
    prebuilt=(("fp32_t",), ("bf16_t",), ("fp16_t",)),
)

# speculative: verification of speculative-decoding drafts (csrc/sampling/speculative.cuh): chain
# speculative sampling (FlashInfer's), the EAGLE tree's target-only sampling and greedy verification
# (sgl-kernel's). Config = the dtype of the probabilities (verify_tree_greedy takes none and is
# served by the fp32 instance); batch, draft length, tree size and vocabulary are run-time.
# Prebuilt: fp32, what the serving frameworks pass.
SPECULATIVE = KernelSpec(
    family="speculative",
    sources=("sampling/speculative.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "chain": "jit_kernel::speculative::Speculative<{args}>::chain",
        "tree": "jit_kernel::speculative::Speculative<{args}>::tree",
        "greedy": "jit_kernel::speculative::Speculative<{args}>::greedy",
    },
    prebuilt=(("fp32_t",),),
)

# decode_linear: F.linear for 1 to 16 rows (decode GEMV and skinny GEMM) on tensor cores with fp32
# accumulation, the weight read once (csrc/gemm/decode_linear.cuh). Config = dtype: the launcher picks
# the row tile (8 rows for inputs of 1 to 8, 16 for 9 to 16); N, K, the strides and the split of k
# over a cluster are run-time. Prebuilt in both 16-bit dtypes.
DECODE_LINEAR = KernelSpec(
    family="decode_linear",
    sources=("gemm/decode_linear.cuh",),
    params=("dtype",),
    domains={"dtype": OneOf(("bf16_t", "fp16_t"))},
    exports={"run": "jit_kernel::gemm::DecodeLinear<{args}>::run"},
    prebuilt=(("bf16_t",), ("fp16_t",)),
)

# The row tiles of decode_linear_fp8's kernels: 8 (inputs of 1 to 8 rows) or 16 (9 to 16).
DECODE_LINEAR_ROWS = (8, 16)

# decode_linear_fp8 (csrc/gemm/decode_linear_fp8.cuh): the fp8 block-scaled decode GEMM (1 x 128 input
# groups, 128 x 128 weight blocks, float32 scales). Config = (row tile 8 or 16, output dtype); N, K,
# the scale strides and the bias dtype are run-time. Prebuilt for bf16 output, what fp8 checkpoints
# serve in; fp16 compiles on first use.
DECODE_LINEAR_FP8 = KernelSpec(
    family="decode_linear_fp8",
    sources=("gemm/decode_linear_fp8.cuh",),
    params=("rows", "out_dtype"),
    domains={"rows": OneOf(DECODE_LINEAR_ROWS), "out_dtype": OneOf(("bf16_t", "fp16_t"))},
    exports={"run": "jit_kernel::gemm::fp8::DecodeLinearFp8<{args}>::run"},
    prebuilt=tuple((rows, "bf16_t") for rows in DECODE_LINEAR_ROWS),
)

# Decode attention (csrc/attention/decode.cuh): one query token per sequence over a StaticCache-layout
# KV cache [B, Hkv, max_len, D], grouped-query heads, flash-decoding splits merged by a second kernel.
# Config = (head_dim, dtype): the head dim sizes each lane's registers; batch, heads, group size,
# cache length and splits are run-time (the group picks one of four instantiations inside the unit).
ATTENTION_HEAD_DIMS = (64, 128, 256)
DECODE_ATTENTION = KernelSpec(
    family="decode_attention",
    sources=("attention/decode.cuh",),
    params=("head_dim", "dtype"),
    domains={"head_dim": OneOf(ATTENTION_HEAD_DIMS), "dtype": OneOf(("bf16_t", "fp16_t"))},
    exports={"run": "jit_kernel::attention::DecodeAttention<{args}>::run"},
    prebuilt=tuple((d, t) for d in ATTENTION_HEAD_DIMS for t in ("bf16_t", "fp16_t")),
)
# merge_attn_states (csrc/attention/merge.cuh): two attention results and their LSEs merged into one.
# Config = dtype only: tokens, heads and head dim are run-time.
MERGE_ATTN_STATES = KernelSpec(
    family="merge_attn_states",
    sources=("attention/merge.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={"run": "jit_kernel::attention::MergeAttnStates<{args}>::run"},
    prebuilt=(("bf16_t",), ("fp16_t",), ("fp32_t",)),
)

# custom_all_reduce: the all-reduce of jit_kernel.distributed over buffers shared by CUDA IPC, and
# the same fused with the residual add and RMSNorm (csrc/allreduce/allreduce.cuh), with the CUDA IPC
# helpers that allocate, share and map its regions. Config = dtype only: the world size, the
# algorithm, the hidden size and kper are run-time values.
CUSTOM_ALL_REDUCE = KernelSpec(
    family="custom_all_reduce",
    sources=("allreduce/allreduce.cuh",),
    params=("dtype",),
    domains={"dtype": FLOAT_DTYPES},
    exports={
        "all_reduce": "jit_kernel::allreduce::CustomAllReduce<{args}>::all_reduce",
        "fused_add_rmsnorm": "jit_kernel::allreduce::CustomAllReduce<{args}>::fused_add_rmsnorm",
        "fused_add_rmsnorm_quant_fp8": "jit_kernel::allreduce::CustomAllReduce<{args}>::fused_add_rmsnorm_quant_fp8",
        "fused_add_rmsnorm_per_token_group_quant_fp8": (
            "jit_kernel::allreduce::CustomAllReduce<{args}>::fused_add_rmsnorm_per_token_group_quant_fp8"
        ),
        "ipc_alloc": "jit_kernel::allreduce::ipc_alloc",
        "ipc_free": "jit_kernel::allreduce::ipc_free",
        "ipc_handle": "jit_kernel::allreduce::ipc_handle",
        "ipc_open": "jit_kernel::allreduce::ipc_open",
        "ipc_close": "jit_kernel::allreduce::ipc_close",
        "ipc_input_handle": "jit_kernel::allreduce::ipc_input_handle",
        "signal_bytes": "jit_kernel::allreduce::signal_bytes",
    },
    # bf16, what serving runs (the IPC helpers are loaded from it too); fp16 and fp32 compile on first use.
    prebuilt=(("bf16_t",),),
)


ALL_FAMILIES: tuple[KernelSpec, ...] = (
    ADD_CONSTANT_HOST,
    LAUNCH_SITE,
    ADD_CONSTANT_CUDA,
    HICACHE,
    HICACHE_TMA,
    HICACHE_PAGES,
    STREAM_WAIT,
    RMSNORM,
    QKNORM,
    PER_TENSOR_QUANT_FP8,
    SCALE,
    ROPE,
    QKNORM_ROPE,
    ACTIVATION,
    KV_STORE,
    PER_TOKEN_QUANT_FP8,
    PER_TOKEN_GROUP_QUANT_FP8,
    RMSNORM_QUANT_FP8,
    RMSNORM_PER_TOKEN_QUANT_FP8,
    RMSNORM_PER_TOKEN_GROUP_QUANT_FP8,
    GEMMA_RMSNORM,
    MOE_ROUTE,
    MOE_ALIGN,
    MOE_SUM_REDUCE,
    SAMPLING,
    SPECULATIVE,
    DECODE_LINEAR,
    DECODE_LINEAR_FP8,
    DECODE_ATTENTION,
    MERGE_ATTN_STATES,
    CUSTOM_ALL_REDUCE,
)


def family(name: str) -> KernelSpec:
    for spec in ALL_FAMILIES:
        if spec.family == name:
            return spec
    raise KeyError(f"unknown kernel family {name!r}; known: {[s.family for s in ALL_FAMILIES]}")
