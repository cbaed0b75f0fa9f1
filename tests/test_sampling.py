"""The sampling family on the GPU: ``sample``, ``mask_logits`` and the FlashInfer-compatible entry points
against a float64 torch reference of the processed distribution.

Distributions are checked with Pearson's chi-square goodness-of-fit test (p >= 0.001) on constructed
rows (a 16-token row with ties, a 1000-token row, and a 128,256-token vocabulary with its mass on about
300 tokens), drawn as a batch of identical rows with per-row seeds; every draw must also lie in the
reference's support. Filter thresholds (top-p, min-p) are picked in the middle of a gap of the
reference's cumulative mass (or probability ratio), so float32 against float64 rounding cannot move a
token across a threshold; ties at a threshold are built in on purpose and must be kept.

Also: greedy rows, determinism across batch slots and batch sizes, ``offset`` advancing (``sample``)
or not (the FlashInfer names), CUDA graphs, torch.compile, invalid rows, log-probabilities, the renorm
and mask ops over a sweep of vocabulary sizes and dtypes, strided rows, ``out=`` and ``indices=``.
The chi-square survival function and the reference are self-tested on the CPU."""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

import jit_kernel

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
VOCABS = [1, 2, 7, 1000, 32000, 128256, 151936, 262144]
P_MIN = 1e-3  # the smallest chi-square p-value a test accepts
F64 = torch.float64
# The kernel's weights are round(w * 2^FIXED_POINT_BITS), w = p / p_max: a token's weight is off by
# at most half a unit, so results near a tiny probability are as exact as that allows, no more.
FIXED_POINT_BITS = 30
RESOLUTION = 2.0**-FIXED_POINT_BITS

# ---------------------------------------------------------------------------------------------
# chi-square goodness of fit
# ---------------------------------------------------------------------------------------------


def _gammaincc(a: float, x: float) -> float:
    """Q(a, x) = Gamma(a, x) / Gamma(a), the regularised upper incomplete gamma function (a > 0): the
    power series of P = 1 - Q below x = a + 1, the continued fraction of Q (modified Lentz) above."""
    if x <= 0.0:
        return 1.0
    log_prefix = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        for _ in range(100_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) <= abs(total) * 1e-17:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) <= 1e-16:
            break
    return math.exp(log_prefix) * h


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X chi-square distributed with ``df`` degrees of freedom."""
    return _gammaincc(df / 2.0, x / 2.0)


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, int]:
    """Pearson's chi-square test of ``counts`` [V] against ``probs`` [V]: (p-value, statistic, degrees of
    freedom). Bins expecting fewer than 5 draws are pooled into one (folded into the smallest other bin
    if the pool itself expects fewer than 5)."""
    counts, probs = counts.double().cpu(), probs.double().cpu()
    n = float(counts.sum())
    expected = probs / probs.sum() * n
    support = expected > 0
    e, o = expected[support], counts[support]
    small = e < 5.0
    if bool(small.any()):
        pooled_e, pooled_o = e[small].sum(), o[small].sum()
        e, o = e[~small].clone(), o[~small].clone()
        if float(pooled_e) < 5.0 and e.numel() > 0:
            j = int(e.argmin())
            e[j] += pooled_e
            o[j] += pooled_o
        else:
            e, o = torch.cat([e, pooled_e[None]]), torch.cat([o, pooled_o[None]])
    df = e.numel() - 1
    if df < 1:
        return 1.0, 0.0, 0
    stat = float(((o - e) ** 2 / e).sum())
    return chi2_sf(stat, df), stat, df


def assert_distribution(ids: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    """Every draw is a valid token in the support of ``probs`` [V], and the counts pass the chi-square
    test at ``P_MIN``."""
    probs = probs.double().cpu()
    vocab = probs.numel()
    ids = ids.reshape(-1).long().cpu()
    bad = (ids < 0) | (ids >= vocab)
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} of {ids.numel()} ids out of range, e.g. {int(ids[bad][0])}"
    counts = torch.bincount(ids, minlength=vocab).double()
    outside = (counts > 0) & ~(probs > 0)
    assert not bool(outside.any()), (
        f"{what}: {int(counts[outside].sum())} draws outside the reference's support, "
        f"e.g. token {int(outside.nonzero()[0])}"
    )
    p, stat, df = chi2_pvalue(counts, probs)
    assert p >= P_MIN, f"{what}: chi-square {stat:.1f} on {df} degrees of freedom, p = {p:.2e} < {P_MIN}"


# ---------------------------------------------------------------------------------------------
# the float64 reference
# ---------------------------------------------------------------------------------------------

Param = float | int | torch.Tensor | None


def _per_row(value: Param, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).reshape(-1).expand(rows)
    return torch.full((rows,), value, dtype=dtype, device=device)


def _renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    q = torch.where(keep, p, 0.0)
    return q / q.sum(1, keepdim=True)


def _top_p_keep(q: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The smallest set of top tokens of ``q`` whose mass is >= top_p, with every token tied with the
    last one taken."""
    qs = q.sort(1, descending=True).values
    cs = qs.cumsum(1)
    last = (cs < top_p[:, None]).sum(1).clamp(max=q.shape[1] - 1)
    return q >= qs.gather(1, last[:, None])


def ref_dist(
    x: torch.Tensor,
    *,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
    order: str = "top_k_first",
    from_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The processed distribution of each row of ``x`` [B, V] (logits, or probabilities with
    ``from_probs``; the values the kernel reads, i.e. already rounded to the input dtype):
    (probs [B, V] float64, kept [B, V] bool, valid [B] bool); invalid rows are NaN.

    ``top_k_first`` (vLLM's order): temperature, top-k (every token tied with the k-th largest kept),
    top-p over the renormalised top-k set, min-p (p >= min_p * p_max); ``joint`` (FlashInfer's): top-k
    and top-p both on the original distribution, the intersection kept. Temperature 0 is greedy: the
    argmax, lowest index among ties. A parameter is None (off), a number, or a tensor [B]."""
    x = x.to(F64)
    rows, vocab = x.shape
    dev = x.device
    t = _per_row(temperature, rows, F64, dev)
    k = _per_row(top_k, rows, torch.int64, dev)
    tp = _per_row(top_p, rows, F64, dev)
    mp = _per_row(min_p, rows, F64, dev)
    valid = ~torch.isnan(x).any(1) & ~(x == math.inf).any(1)
    greedy = torch.zeros(rows, dtype=torch.bool, device=dev)
    if from_probs:
        assert t is None, "the from-probs forms take no temperature"
        valid &= (x > 0).any(1)
        weights = torch.where(valid[:, None], x, 0.0).clamp_min(0.0)
        score = weights
    else:
        valid &= (x > -math.inf).any(1)
        xs = torch.where(valid[:, None], x, 0.0)
        scale = torch.ones(rows, dtype=F64, device=dev)
        if t is not None:
            valid &= t >= 0  # NaN fails too
            greedy = t == 0
            scale = torch.where(t > 0, t, 1.0)
        score = xs / scale[:, None]
        weights = torch.exp(score - score.max(1, keepdim=True).values)
    if k is not None:
        valid &= k >= 1
    if tp is not None:
        valid &= (tp > 0) & (tp <= 1)
    if mp is not None:
        valid &= (mp >= 0) & (mp <= 1)
    p = weights / weights.sum(1, keepdim=True)
    keep = torch.ones(rows, vocab, dtype=torch.bool, device=dev)
    if k is not None:
        kth = score.sort(1, descending=True).values.gather(1, (k.clamp(1, vocab) - 1)[:, None])
        keep &= score >= kth
    if order == "joint":
        assert mp is None and t is None, "the joint order takes top-k and top-p only"
        if tp is not None:
            keep &= _top_p_keep(p, tp)
    elif order == "top_k_first":
        if tp is not None:
            keep &= _top_p_keep(_renorm(p, keep), tp)
        if mp is not None:
            q = _renorm(p, keep)
            keep &= q >= mp[:, None] * q.max(1, keepdim=True).values
    else:
        raise ValueError(order)
    top = torch.where(valid[:, None], x, 0.0).argmax(1)
    argmax = torch.arange(vocab, device=dev)[None, :] == top[:, None]
    keep = torch.where(greedy[:, None], argmax, keep)
    p = torch.where(greedy[:, None], argmax.to(F64), _renorm(p, keep))
    p = torch.where(valid[:, None], p, math.nan)
    return p, keep, valid


def ref_logprob(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return p.gather(1, ids.long().clamp_min(0)[:, None]).squeeze(1).log()


def ref_mask_logits(
    x: torch.Tensor,
    *,
    temperature: Param = None,
    top_k: Param = None,
    top_p: Param = None,
    min_p: Param = None,
) -> torch.Tensor:
    """``mask_logits``'s output: logits / temperature in x's dtype (exact for the powers of two the tests
    use), -inf outside the kept set; greedy rows keep the raw argmax logit; invalid rows NaN."""
    _, keep, valid = ref_dist(x, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = x.shape[0]
    t = _per_row(temperature, rows, F64, x.device)
    scaled = x if t is None else torch.where(t[:, None] > 0, x.double() / t.clamp_min(1e-30)[:, None], x.double())
    out = torch.where(keep, scaled.to(x.dtype), -math.inf)
    return torch.where(valid[:, None], out, math.nan).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# thresholds away from rounding
# ---------------------------------------------------------------------------------------------


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def _group_spans(ws: torch.Tensor, cum: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For weights ``ws`` sorted descending and their cumulative mass ``cum``: at the last token of each
    group of tied weights, the mass before the group and after it (``end`` marks those positions)."""
    end = torch.ones_like(ws, dtype=torch.bool)
    end[:, :-1] = ws[:, :-1] != ws[:, 1:]
    before = torch.cummax(torch.where(end, cum, 0.0), 1).values
    before = torch.cat([torch.zeros_like(before[:, :1]), before[:, :-1]], 1)
    return before, cum, end


def safe_top_p(
    w: torch.Tensor, target: float | torch.Tensor, *, raw_too: bool = False, gap: float = 2e-4
) -> torch.Tensor:
    """Per row of the weights ``w`` [B, V] (the distribution top-p sees), the top-p value (float32)
    nearest ``target`` that lies in the middle of one tie group's span of cumulative mass, that span
    at least ``gap`` wide: no rounding of the mass moves the cut. With ``raw_too`` the value is also
    inside the group's span of the unnormalised cumulative weight (probabilities given to the
    from-probs forms need not sum to exactly 1)."""
    w = w.double()
    ws = w.sort(1, descending=True).values
    total = ws.sum(1, keepdim=True)
    lo, hi, end = _group_spans(ws, ws.cumsum(1) / total)
    if raw_too:
        lo_raw, hi_raw, _ = _group_spans(ws, ws.cumsum(1))
        lo, hi = torch.maximum(lo, lo_raw), torch.minimum(hi, hi_raw)
    ok = end & (ws > 0) & (hi - lo >= gap)
    mid = (lo + hi) / 2
    target_t = torch.as_tensor(target, dtype=F64, device=w.device).reshape(-1, 1)
    score = torch.where(ok, (mid - target_t).abs(), math.inf)
    pick = mid.gather(1, score.argmin(1, keepdim=True)).squeeze(1)
    assert bool(ok.any(1).all()), "no top-p value clear of rounding"
    return pick.float()


def safe_min_p(q: torch.Tensor, target: float | torch.Tensor, *, rel_gap: float = 1e-3) -> torch.Tensor:
    """Per row of ``q`` [B, V], the min-p value (float32) nearest ``target`` (on a log scale) that lies
    between two consecutive distinct probability ratios p / p_max at least ``rel_gap`` apart; 0 where
    the row has a single token."""
    q = q.double()
    rows, vocab = q.shape
    if vocab == 1:
        return torch.zeros(rows, dtype=torch.float32, device=q.device)
    rs = (q / q.max(1, keepdim=True).values).sort(1, descending=True).values
    a, b = rs[:, :-1], rs[:, 1:]
    ok = (b > 0) & (a >= b * (1 + rel_gap))
    mid = (a * b).sqrt()
    target_t = torch.as_tensor(target, dtype=F64, device=q.device).reshape(-1, 1).clamp_min(1e-30)
    score = torch.where(ok, (mid.clamp_min(1e-300).log() - target_t.log()).abs(), math.inf)
    pick = mid.gather(1, score.argmin(1, keepdim=True)).squeeze(1)
    return torch.where(ok.any(1), pick, 0.0).float()


def top_p_margin(w: torch.Tensor, top_p: float) -> float:
    """How far ``top_p`` is from the nearest tie group boundary of the cumulative mass of ``w`` [1, V]."""
    ws = w.double().sort(1, descending=True).values
    lo, hi, end = _group_spans(ws, ws.cumsum(1) / ws.sum())
    return float(torch.where(end, torch.minimum((lo - top_p).abs(), (hi - top_p).abs()), math.inf).min())


# ---------------------------------------------------------------------------------------------
# constructed distributions
# ---------------------------------------------------------------------------------------------

EMB_VOCAB = 128256


def _dist_small16() -> torch.Tensor:
    """16 tokens, ties at several levels, one -inf."""
    values = [2.0, 2.0, 1.5, 1.0, 1.0, 1.0, 0.5, 0.0, -0.5, -1.0, -1.0, -2.0, -3.0, -4.0, -5.0, -math.inf]
    return torch.tensor([values], dtype=F64)


def _dist_v1000() -> torch.Tensor:
    """1000 tokens, normal logits (sd 1.5), ten tied pairs, one -inf."""
    g = torch.Generator().manual_seed(1000)
    x = (torch.randn(1000, generator=g, dtype=F64) * 1.5).float().double()
    x[10:20] = x[0:10]
    x[500] = -math.inf
    return x[None]


def _dist_emb() -> torch.Tensor:
    """A 128,256-token vocabulary with its mass on 305 scattered tokens (normal logits, sd 0.7; five tied
    pairs); the rest 100 below the smallest of them (never drawn), five at -inf."""
    g = torch.Generator().manual_seed(EMB_VOCAB)
    pos = torch.randperm(EMB_VOCAB, generator=g)[:310]
    x = torch.full((EMB_VOCAB,), -100.0, dtype=F64)
    x[pos[:300]] = (torch.randn(300, generator=g, dtype=F64) * 0.7).float().double()
    x[pos[300:305]] = x[pos[:5]]
    x[pos[305:]] = -math.inf
    x = torch.where(x == -100.0, x[pos[:300]].min() - 100.0, x)
    return x[None]


def _dist_wide() -> torch.Tensor:
    """32,000 tokens with their mass spread over 6,000 (normal logits, sd 0.3), the rest 30 below: top-k
    3,000 and top-p keep more candidates than the kernel gathers into one block (2,048), so their
    thresholds take the cluster's radix passes."""
    g = torch.Generator().manual_seed(32000)
    x = torch.full((32000,), -30.0, dtype=F64)
    pos = torch.randperm(32000, generator=g)[:6000]
    x[pos] = (torch.randn(6000, generator=g, dtype=F64) * 0.3).float().double()
    return x[None]


DISTS: dict[str, Callable[[], torch.Tensor]] = {
    "small16": _dist_small16,
    "v1000": _dist_v1000,
    "emb": _dist_emb,
    "wide": _dist_wide,
}
# small16: the 10th largest is tied with the 11th: 11 kept
TOP_K = {"small16": 10, "v1000": 40, "emb": 60, "wide": 3000}

SAMPLE_CONFIGS: dict[str, dict[str, float | bool]] = {
    "temperature": {"temperature": 0.7},
    "top_k": {"top_k": True},
    "top_p": {"top_p": 0.7},
    "min_p": {"min_p": 0.1},
    "top_k_top_p": {"top_k": True, "top_p": 0.6},
    "all": {"temperature": 0.8, "top_k": True, "top_p": 0.8, "min_p": 0.1},
}


def resolve(
    x: torch.Tensor,
    spec: dict[str, Any],
    top_k: int,
    *,
    from_probs: bool = False,
    order: str = "top_k_first",
) -> dict[str, float | int]:
    """Concrete parameters for a row ``x`` [1, V] from a spec: temperature as given, ``top_k`` when the
    spec has one, top-p and min-p the safe values nearest the spec's targets (``top_p_fixed`` is taken
    as is, its margin checked), each chosen on the distribution that filter sees."""
    params: dict[str, float | int] = {}
    if "temperature" in spec:
        params["temperature"] = _f32(spec["temperature"])
    if spec.get("top_k"):
        params["top_k"] = top_k
    base_args = {} if order == "joint" else dict(params)
    base = ref_dist(x, from_probs=from_probs, order="top_k_first", **base_args)[0]
    if "top_p_fixed" in spec:
        params["top_p"] = _f32(spec["top_p_fixed"])
        assert top_p_margin(base, params["top_p"]) >= 1e-3
    elif "top_p" in spec:
        raw_too = from_probs and (order == "joint" or "top_k" not in params)
        params["top_p"] = float(safe_top_p(base, spec["top_p"], raw_too=raw_too)[0])
    if "min_p" in spec:
        base = ref_dist(x, from_probs=from_probs, **params)[0]
        params["min_p"] = float(safe_min_p(base, spec["min_p"])[0])
    return params


# ---------------------------------------------------------------------------------------------
# helpers for the GPU tests
# ---------------------------------------------------------------------------------------------


def _fi(name: str) -> Callable[..., Any]:
    """A FlashInfer-named entry point: from the package, else from its sampling module."""
    fn = getattr(jit_kernel, name, None)
    if fn is None:
        from jit_kernel.ops import sampling

        fn = getattr(sampling, name)
    return fn


FI_FILTERS = {
    "sampling_from_logits": (),
    "sampling_from_probs": (),
    "top_k_sampling_from_probs": ("top_k",),
    "top_p_sampling_from_probs": ("top_p",),
    "min_p_sampling_from_probs": ("min_p",),
    "top_k_top_p_sampling_from_logits": ("top_k", "top_p"),
    "top_k_top_p_sampling_from_probs": ("top_k", "top_p"),
}
FI_SAMPLERS = list(FI_FILTERS)


def _fi_call(name: str, x: torch.Tensor, params: dict[str, Any], order: str | None = None, **kw: Any) -> Any:
    args = [params[f] for f in FI_FILTERS[name]]
    if order is not None:
        kw["filter_apply_order"] = order
    return _fi(name)(x, *args, **kw)


def _fi_default_params(vocab: int) -> dict[str, Any]:
    return {"top_k": min(vocab, 20), "top_p": 0.9, "min_p": 0.05}


def _logits(rows: int, vocab: int, dtype: torch.dtype, *, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """Normal logits on multiples of 1/256 (ties are common, and x / 2 and x * 2 are exact in every
    dtype), rounded to ``dtype``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device="cuda", dtype=torch.float32) * scale
    return (torch.round(x * 256) / 256).to(dtype)


def _probs(rows: int, vocab: int, dtype: torch.dtype, *, seed: int = 0) -> torch.Tensor:
    return torch.softmax(_logits(rows, vocab, torch.float32, seed=seed).double(), 1).to(dtype)


def _seeds(rows: int, base: int = 0) -> torch.Tensor:
    return torch.arange(rows, device="cuda", dtype=torch.int64) * 1_000_003 + base


def _zeros64(rows: int) -> torch.Tensor:
    return torch.zeros(rows, device="cuda", dtype=torch.int64)


def _poison_allocations(nbytes: int, count: int = 4) -> None:
    """Leave the CUDA caching allocator's next blocks of this size full of 0xFF bytes (NaN in every
    float dtype), so an output the op allocates and does not fully write shows up."""
    blocks = [torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda").fill_(0xFF) for _ in range(count)]
    del blocks


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def _first_mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    diff = a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)
    if a.shape != b.shape or not bool(diff.any()):
        return f"shapes {tuple(a.shape)} and {tuple(b.shape)}"
    row, byte = (int(v) for v in diff.nonzero()[0])
    col = byte // a.element_size()
    return f"first at [{row}, {col}]: {a[row, col].item()} vs {b[row, col].item()}"


def _logprob_tol(p: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """1e-4, widened by the fixed point's resolution (of the row's largest probability) relative to the
    sampled token's probability."""
    pt = p.gather(1, ids.long().clamp_min(0)[:, None]).squeeze(1)
    return 1e-4 + 2 * RESOLUTION * p.max(1).values / pt.clamp_min(1e-300)


# ---------------------------------------------------------------------------------------------
# CPU: the chi-square survival function
# ---------------------------------------------------------------------------------------------


def _sf_closed_form(x: float, df: int) -> float:
    if df == 1:
        return math.erfc(math.sqrt(x / 2))
    if df == 3:
        return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    assert df % 2 == 0
    term = math.exp(-x / 2)
    total = term
    for i in range(1, df // 2):
        term *= (x / 2) / i
        total += term
    return total


@pytest.mark.parametrize("df", [1, 2, 3, 4, 10, 50, 100, 500, 1000])
def test_chi2_sf_closed_forms(df: int) -> None:
    for x in [0.01, 0.5, 1.0, 3.0, 10.0, 50.0, 120.0, 480.0, 520.0, 900.0, 1000.0, 1100.0]:
        want = _sf_closed_form(x, df)
        got = chi2_sf(x, df)
        if want > 1e-250:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-14), (x, df)
        else:
            assert got < 1e-200


@pytest.mark.parametrize(
    ("x", "df", "p"),
    [
        (3.841458820694124, 1, 0.05),
        (6.6348966010212145, 1, 0.01),
        (10.827566170662733, 1, 0.001),
        (5.991464547107979, 2, 0.05),
        (18.307038053275146, 10, 0.05),
        (124.34211340400407, 100, 0.05),
    ],
)
def test_chi2_sf_quantiles(x: float, df: int, p: float) -> None:
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-6)


def test_chi2_sf_edges() -> None:
    assert chi2_sf(0.0, 5) == 1.0
    assert chi2_sf(1e-12, 3) == pytest.approx(1.0)
    assert chi2_sf(1e4, 10) == pytest.approx(0.0, abs=1e-300)
    for df in (7, 99, 999):  # the median of chi-square(df) is about df (1 - 2 / (9 df))^3
        median = df * (1 - 2 / (9 * df)) ** 3
        assert chi2_sf(median, df) == pytest.approx(0.5, abs=0.01)


def test_chi2_test_accepts_true_and_rejects_wrong_distribution() -> None:
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(300, generator=g, dtype=F64) * 1.5, 0)
    ids = torch.multinomial(probs, 200_000, replacement=True, generator=g)
    assert_distribution(ids, probs, "true distribution")
    wrong = probs.clone()
    wrong[probs.argmax()] *= 1.2
    p, _, _ = chi2_pvalue(torch.bincount(ids, minlength=300), wrong / wrong.sum())
    assert p < 1e-6
    with pytest.raises(AssertionError, match="outside the reference's support"):
        zeroed = probs.clone()
        zeroed[int(ids[0])] = 0
        assert_distribution(ids, zeroed, "support")
    with pytest.raises(AssertionError, match="out of range"):
        assert_distribution(torch.tensor([0, -1]), probs, "invalid id")


def test_chi2_pools_small_bins() -> None:
    probs = torch.tensor([0.5, 0.3, 0.1999, 1e-5, 1e-5, 5e-5], dtype=F64)
    counts = torch.tensor([500, 300, 200, 0, 0, 0])
    p, _, df = chi2_pvalue(counts, probs)
    assert df == 2 and p > 0.9


# ---------------------------------------------------------------------------------------------
# CPU: the reference
# ---------------------------------------------------------------------------------------------


def _support(p: torch.Tensor) -> list[int]:
    return (p[0] > 0).nonzero().flatten().tolist()


def test_reference_top_k_keeps_ties() -> None:
    x = _dist_small16()
    assert _support(ref_dist(x, top_k=5)[0]) == [0, 1, 2, 3, 4, 5]
    assert _support(ref_dist(x, top_k=1)[0]) == [0, 1]
    assert _support(ref_dist(x, top_k=100)[0]) == list(range(15))  # -inf never
    p = ref_dist(x, top_k=3)[0][0]
    e = torch.tensor([2.0, 2.0, 1.5], dtype=F64).exp()
    torch.testing.assert_close(p[:3], e / e.sum(), rtol=1e-15, atol=0)


def test_reference_top_p_over_renormalised_top_k_set() -> None:
    x = _dist_small16()
    # original mass of the tie groups {2,2}, {1.5}, {1,1,1}: 0.467, 0.609, 0.867; over the 6 tokens
    # top-k=6 keeps: 0.539, 0.703, 1.0
    assert _support(ref_dist(x, top_p=0.5)[0]) == [0, 1, 2]
    assert _support(ref_dist(x, top_p=0.4)[0]) == [0, 1]
    assert _support(ref_dist(x, top_k=6, top_p=0.65)[0]) == [0, 1, 2]
    assert _support(ref_dist(x, top_k=6, top_p=0.65, order="joint")[0]) == [0, 1, 2, 3, 4, 5]
    assert _support(ref_dist(x, top_k=6, top_p=1.0)[0]) == [0, 1, 2, 3, 4, 5]
    assert _support(ref_dist(x, top_p=1.0)[0]) == list(range(15))


def test_reference_min_p_temperature_greedy() -> None:
    x = _dist_small16()
    # ratios to the max: e^(x - 2); min_p 0.3 keeps e^-0.5 = 0.61 and e^-1 = 0.37, not e^-1.5 = 0.22
    assert _support(ref_dist(x, min_p=0.3)[0]) == [0, 1, 2, 3, 4, 5]
    assert _support(ref_dist(x, temperature=0.5, min_p=0.3)[0]) == [0, 1, 2]  # ratios squared
    p = ref_dist(x, temperature=2.0)[0][0]
    torch.testing.assert_close(p, torch.softmax(x[0] / 2, 0), rtol=1e-14, atol=0)
    p, keep, valid = ref_dist(x, temperature=0.0, top_k=3)
    assert bool(valid.all()) and _support(p) == [0] and float(p[0, 0]) == 1.0 and int(keep.sum()) == 1


def test_reference_from_probs_and_invalid_rows() -> None:
    x = _dist_small16()
    probs = torch.softmax(x, 1)
    for kw in ({}, {"top_k": 5}, {"top_p": 0.7}, {"min_p": 0.3}, {"top_k": 6, "top_p": 0.65}):
        torch.testing.assert_close(
            ref_dist(probs, from_probs=True, **kw)[0], ref_dist(x, **kw)[0], rtol=1e-12, atol=1e-15
        )
    rows = x.repeat(8, 1)
    rows[1, 3] = math.nan
    rows[2, 4] = math.inf
    rows[3] = -math.inf
    temperature = torch.tensor([1.0, 1, 1, 1, -1, math.nan, 0, 1])
    top_k = torch.tensor([3, 3, 3, 3, 3, 3, 3, 0])
    p, _, valid = ref_dist(rows, temperature=temperature, top_k=top_k)
    assert valid.tolist() == [True, False, False, False, False, False, True, False]
    assert bool(p[~valid].isnan().all()) and not bool(p[valid].isnan().any())
    for bad in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_p": math.nan}, {"min_p": 2.0}, {"min_p": -0.5}):
        assert not bool(ref_dist(x, **bad)[2].any()), bad


def test_reference_mask_logits() -> None:
    x = _dist_small16().float()
    got = ref_mask_logits(x, temperature=0.5, top_k=3)
    assert got[0, :3].tolist() == [4.0, 4.0, 3.0] and bool((got[0, 3:] == -math.inf).all())
    got = ref_mask_logits(x.repeat(2, 1), temperature=torch.tensor([0.0, -1.0]))
    assert got[0, 0] == 2.0 and bool((got[0, 1:] == -math.inf).all()) and bool(got[1].isnan().all())


def test_safe_thresholds_are_clear_of_rounding() -> None:
    g = torch.Generator().manual_seed(3)
    x = (torch.round(torch.randn(6, 5000, generator=g, dtype=F64) * 3 * 64) / 64).to(torch.bfloat16).double()
    p = ref_dist(x)[0]
    targets = torch.tensor([0.1, 0.3, 0.5, 0.7, 0.9, 0.99], dtype=F64)
    tp = safe_top_p(p, targets).double()
    for r in range(6):
        assert top_p_margin(p[r : r + 1], float(tp[r])) >= 1e-4
        assert abs(float(tp[r]) - float(targets[r])) < 0.05
    mp = safe_min_p(p, 0.05).double()
    ratio = p / p.max(1, keepdim=True).values
    nearest = (ratio / mp[:, None]).log().abs().min(1).values
    assert bool((nearest >= 4e-4).all())
    assert float(safe_min_p(torch.ones(1, 1, dtype=F64), 0.1)[0]) == 0.0
    assert float(safe_top_p(torch.ones(1, 1, dtype=F64), 0.9)[0]) == 0.5


@pytest.mark.parametrize("dist", list(DISTS))
def test_distribution_cases_exercise_every_filter(dist: str) -> None:
    """Each constructed case's filters remove tokens the previous step kept, and leave several."""
    x = DISTS[dist]()
    for name, spec in SAMPLE_CONFIGS.items():
        params = resolve(x, spec, TOP_K[dist])
        steps: dict[str, Any] = {}
        previous = int((ref_dist(x, temperature=params.get("temperature"))[0] > 0).sum())
        for key in ("temperature", "top_k", "top_p", "min_p"):
            if key not in params:
                continue
            steps[key] = params[key]
            kept = int((ref_dist(x, **steps)[0] > 0).sum())
            if key != "temperature":
                assert kept < previous, (dist, name, key, kept, previous)
            assert kept >= 3, (dist, name, key, kept)
            previous = kept
    for name, order, spec in FI_CASES:
        if FI_FILTERS[name]:
            from_probs = name.endswith("probs")
            inp = _fi_input(x, from_probs)
            params = _fi_resolve(inp, dist, spec, from_probs, order)
            kept = int((ref_dist(inp, from_probs=from_probs, order=order or "top_k_first", **params)[0] > 0).sum())
            assert 3 <= kept < int((inp > 0 if from_probs else inp > -math.inf).sum()) - 1, (dist, name, order)


def test_joint_and_top_k_first_cases_differ() -> None:
    for dist in ("small16", "emb"):
        for name in ("top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_probs"):
            from_probs = name.endswith("probs")
            inp = _fi_input(DISTS[dist](), from_probs)
            spec = dict(FI_SPECS[name])
            p = {}
            for order in ("top_k_first", "joint"):
                params = _fi_resolve(inp, dist, spec, from_probs, order)
                p[order] = ref_dist(inp, from_probs=from_probs, order=order, **params)[0]
                p[order + " other"] = ref_dist(inp, from_probs=from_probs, order=_other(order), **params)[0]
            # the parameters each order's test uses select a different set under the other order
            assert not torch.equal(p["top_k_first"] > 0, p["top_k_first other"] > 0) or not torch.equal(
                p["joint"] > 0, p["joint other"] > 0
            ), (dist, name)


def _other(order: str) -> str:
    return "joint" if order == "top_k_first" else "top_k_first"


# ---------------------------------------------------------------------------------------------
# GPU: distributions of sample
# ---------------------------------------------------------------------------------------------

SAMPLE_DRAWS = {"small16": (4096, 8), "v1000": (4096, 16), "emb": (1024, 16), "wide": (4096, 32)}  # (rows, calls)


def _as_tensors(params: dict[str, Any], rows: int) -> dict[str, torch.Tensor]:
    dtypes = {"temperature": torch.float32, "top_k": torch.int64, "top_p": torch.float32, "min_p": torch.float32}
    return {k: torch.full((rows,), v, dtype=dtypes[k], device="cuda") for k, v in params.items()}


def _draw_sample(x: torch.Tensor, params: dict[str, Any], calls: int, base: int = 0) -> torch.Tensor:
    """``calls`` calls of sample on ``x`` with per-row seeds; offset advances by itself."""
    seed, offset = _seeds(x.shape[0], base), _zeros64(x.shape[0])
    out = [jit_kernel.sample(x, **params, seed=seed, offset=offset) for _ in range(calls)]
    assert torch.equal(offset, torch.full_like(offset, calls))
    return torch.cat(out)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [*SAMPLE_CONFIGS, "all_tensors"])
@pytest.mark.parametrize("dist", list(DISTS))
def test_sample_distribution(dist: str, config: str) -> None:
    x64 = DISTS[dist]()
    params = resolve(x64, SAMPLE_CONFIGS[config.removesuffix("_tensors")], TOP_K[dist])
    ref = ref_dist(x64, **params)[0][0]
    rows, calls = SAMPLE_DRAWS[dist]
    x = x64.float().cuda().expand(rows, -1).contiguous()
    kw = _as_tensors(params, rows) if config.endswith("_tensors") else params
    ids = _draw_sample(x, kw, calls, base=zlib.crc32(f"{dist}-{config}".encode()) % 1000)
    assert ids.dtype == torch.int32
    assert_distribution(ids, ref, f"sample {dist} {config} {params}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dist", ["small16", "v1000"])
def test_sample_distribution_half_inputs(dist: str, dtype: torch.dtype) -> None:
    x64 = DISTS[dist]().to(dtype).double()  # the reference sees the rounded logits
    params = resolve(x64, SAMPLE_CONFIGS["all"], TOP_K[dist])
    ref = ref_dist(x64, **params)[0][0]
    rows, calls = SAMPLE_DRAWS[dist]
    x = x64.to(dtype).cuda().expand(rows, -1).contiguous()
    assert_distribution(_draw_sample(x, params, calls, base=5), ref, f"sample {dist} {dtype} {params}")


# ---------------------------------------------------------------------------------------------
# GPU: distributions of the FlashInfer-named entry points
# ---------------------------------------------------------------------------------------------

FI_SPECS: dict[str, dict[str, Any]] = {
    "sampling_from_logits": {},
    "sampling_from_probs": {},
    "top_k_sampling_from_probs": {"top_k": True},
    "top_p_sampling_from_probs": {"top_p": 0.75},
    "min_p_sampling_from_probs": {"min_p": True},
    "top_k_top_p_sampling_from_logits": {"top_k": True, "top_p": 0.65},
    "top_k_top_p_sampling_from_probs": {"top_k": True, "top_p": 0.65},
}
FI_CASES: list[tuple[str, str | None, dict[str, Any]]] = [
    (name, order, spec)
    for name, spec in FI_SPECS.items()
    for order in (("top_k_first", "joint") if name.startswith("top_k_top_p") else (None,))
]
FI_TOP_K = {"small16": 5, "v1000": 40, "emb": 80, "wide": 3000}  # small16: the 5th largest is tied three ways: 6 kept
FI_MIN_P = {"small16": 0.3, "v1000": 0.1, "emb": 0.1, "wide": 0.5}
FI_TOP_K_TOP_P = {"small16": (6, 0.65)}  # fixed: the two orders keep 3 and 6 tokens


def _fi_input(x64: torch.Tensor, from_probs: bool) -> torch.Tensor:
    """What the entry point reads, as float64: float32 logits, or float32 probabilities."""
    return torch.softmax(x64, 1).float().double() if from_probs else x64.float().double()


def _fi_resolve(
    inp: torch.Tensor, dist: str, spec: dict[str, Any], from_probs: bool, order: str | None
) -> dict[str, Any]:
    spec = dict(spec)
    top_k = FI_TOP_K[dist]
    if spec.get("min_p") is True:
        spec["min_p"] = FI_MIN_P[dist]
    if "top_k" in spec and "top_p" in spec and dist in FI_TOP_K_TOP_P:
        top_k, top_p = FI_TOP_K_TOP_P[dist]
        del spec["top_p"]
        spec["top_p_fixed"] = top_p
    return resolve(inp, spec, top_k, from_probs=from_probs, order=order or "top_k_first")


@pytest.mark.gpu
@pytest.mark.parametrize("dist", ["small16", "emb"])
@pytest.mark.parametrize(("name", "order", "spec"), FI_CASES, ids=[f"{n}-{o}" if o else n for n, o, _ in FI_CASES])
def test_flashinfer_distribution(name: str, order: str | None, spec: dict[str, Any], dist: str) -> None:
    """small16: 4096 identical rows, an int seed (the row is the stream); emb: two rows (the second a
    permutation of the first) that int64 ``indices`` map 4096 outputs to, alternately."""
    from_probs = name.endswith("probs")
    inp = _fi_input(DISTS[dist](), from_probs)
    params = _fi_resolve(inp, dist, spec, from_probs, order)
    ref_order = order or "top_k_first"
    if dist == "small16":
        rows_in = inp
        x = inp.float().cuda().expand(4096, -1).contiguous()
        indices = None
    else:
        rows_in = torch.cat([inp, inp.roll(40_000, 1)])
        x = rows_in.float().cuda()
        indices = (torch.arange(4096, device="cuda") % 2).to(torch.int64)
    ref = ref_dist(rows_in, from_probs=from_probs, order=ref_order, **params)[0]
    ids = torch.cat([_fi_call(name, x, params, order, indices=indices, seed=31337, offset=r) for r in range(8)])
    what = f"{name} {order} {dist} {params}"
    if indices is None:
        assert ids.dtype == torch.int32
        assert_distribution(ids, ref[0], what)
    else:
        assert ids.dtype == torch.int64
        which = indices.repeat(8)
        for r in range(2):
            assert_distribution(ids[which == r], ref[r], f"{what} row {r}")


# ---------------------------------------------------------------------------------------------
# GPU: greedy rows
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_rows_take_the_lowest_argmax(dtype: torch.dtype) -> None:
    rows, vocab = 64, 32000
    x = _logits(rows, vocab, dtype, seed=11)
    g = torch.Generator(device="cuda").manual_seed(12)
    pos = torch.randint(0, vocab, (rows, 3), generator=g, device="cuda")
    top = x.float().amax(1) + 1
    for j in range(3):  # three-way ties at the max on the greedy rows
        x[torch.arange(0, rows, 2, device="cuda"), pos[::2, j]] = top[::2].to(dtype)
    x[2] = 0  # all tied: token 0
    x[4, -1] = top[4].to(dtype) + 1  # the max at the last token
    greedy = torch.arange(rows, device="cuda") % 2 == 0
    temperature = torch.where(greedy, 0.0, 1.0).float()
    ids, logprobs = jit_kernel.sample(
        x, temperature=temperature, seed=_seeds(rows), offset=_zeros64(rows), return_logprobs=True
    )
    expect = x.double().argmax(1)
    assert expect[2] == 0 and expect[4] == vocab - 1
    assert torch.equal(ids[greedy].long(), expect[greedy])
    assert bool((logprobs[greedy] == 0).all())
    p = ref_dist(x, temperature=temperature)[0]
    sampled = ~greedy
    assert bool((ids[sampled] >= 0).all()) and bool((p[sampled].gather(1, ids[sampled].long()[:, None]) > 0).all())
    # greedy ignores the filters (the argmax always survives them) and needs no seed
    all_greedy = jit_kernel.sample(x, temperature=0.0, top_k=5, top_p=0.5, min_p=0.5)
    assert torch.equal(all_greedy.long(), expect)


# ---------------------------------------------------------------------------------------------
# GPU: determinism, seeds and offsets
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_seed_offset_and_row_give_the_same_token_anywhere(dtype: torch.dtype) -> None:
    vocab = 32000
    row = _logits(1, vocab, dtype, seed=21, scale=1.0)[0]  # high entropy: many plausible tokens
    seed, off = 2**40 + 12345, 77
    mine = {"temperature": 0.9, "top_k": 400, "top_p": 0.97, "min_p": 0.001}
    tokens = []
    for rows in (1, 7, 64, 1000, 4096):
        x = _logits(rows, vocab, dtype, seed=rows, scale=1.0)
        slots = sorted({0, rows // 2, rows - 1})
        x[slots] = row
        g = torch.Generator(device="cuda").manual_seed(rows)
        seeds = torch.randint(0, 2**62, (rows,), generator=g, device="cuda")
        offsets = torch.randint(0, 1000, (rows,), generator=g, device="cuda")
        params = {
            "temperature": torch.rand(rows, generator=g, device="cuda") + 0.5,
            "top_k": torch.randint(1, vocab, (rows,), generator=g, device="cuda", dtype=torch.int32),
            "top_p": torch.rand(rows, generator=g, device="cuda") * 0.5 + 0.5,
            "min_p": torch.rand(rows, generator=g, device="cuda") * 0.1,
        }
        seeds[slots], offsets[slots] = seed, off
        for k, v in mine.items():
            params[k][slots] = v
        before = offsets.clone()
        ids = jit_kernel.sample(x, **params, seed=seeds, offset=offsets)
        assert torch.equal(offsets, before + 1), "sample advances every row's offset by 1"
        tokens += ids[slots].tolist()
        again = jit_kernel.sample(x, **params, seed=seeds, offset=before.clone())
        assert torch.equal(ids, again), f"rows={rows}: a repeated call differs"
        if rows <= 1000:
            p = ref_dist(x, **params)[0]
            assert bool((p.gather(1, ids.long()[:, None]) > 0).all()), "a draw outside the kept set"
    assert len(set(tokens)) == 1, tokens
    # and distinct seeds or offsets do draw differently
    x = row.expand(1000, -1).contiguous()
    by_seed = jit_kernel.sample(x, **mine, seed=_seeds(1000), offset=torch.full((1000,), off, device="cuda"))
    by_offset = jit_kernel.sample(
        x,
        **mine,
        seed=torch.full((1000,), seed, device="cuda"),
        offset=_zeros64(1000) + torch.arange(1000, device="cuda"),
    )
    assert by_seed.unique().numel() > 100 and by_offset.unique().numel() > 100


@pytest.mark.gpu
def test_sample_is_slot_independent_under_permutation() -> None:
    rows, vocab = 256, 1000
    x = _logits(rows, vocab, torch.float16, seed=31, scale=1.0)
    t = torch.rand(rows, device="cuda") + 0.2
    seeds, offsets = _seeds(rows, 9), torch.randint(0, 10**6, (rows,), device="cuda")
    perm = torch.randperm(rows, device="cuda")
    a = jit_kernel.sample(x, temperature=t, top_k=100, seed=seeds, offset=offsets.clone())
    b = jit_kernel.sample(x[perm], temperature=t[perm], top_k=100, seed=seeds[perm], offset=offsets[perm].clone())
    assert torch.equal(a[perm], b)


@pytest.mark.gpu
def test_sample_int_seed_streams_by_row_and_does_not_advance() -> None:
    x = torch.zeros(256, 1000, device="cuda")
    a = jit_kernel.sample(x, seed=5, offset=3)
    assert a.unique().numel() > 50, "identical rows draw different tokens (the row is the stream)"
    assert torch.equal(a, jit_kernel.sample(x, seed=5, offset=3))
    assert not torch.equal(a, jit_kernel.sample(x, seed=5, offset=4))
    assert not torch.equal(a, jit_kernel.sample(x, seed=6, offset=3))


@pytest.mark.gpu
def test_default_seed_comes_from_torch_generator() -> None:
    x = torch.zeros(64, 1000, device="cuda")
    torch.cuda.manual_seed(123)
    a = jit_kernel.sample(x)
    torch.cuda.manual_seed(123)
    b = jit_kernel.sample(x)
    c = jit_kernel.sample(x)
    assert torch.equal(a, b) and not torch.equal(b, c) and a.unique().numel() > 10
    for name in FI_SAMPLERS:
        inp = torch.softmax(x, 1) if name.endswith("probs") else x
        params = _fi_default_params(1000)
        g1 = torch.Generator(device="cuda").manual_seed(9)
        g2 = torch.Generator(device="cuda").manual_seed(9)
        a = _fi_call(name, inp, params, generator=g1)
        b = _fi_call(name, inp, params, generator=g2)
        c = _fi_call(name, inp, params, generator=g1)
        assert torch.equal(a, b) and not torch.equal(a, c), name


@pytest.mark.gpu
@pytest.mark.parametrize("name", FI_SAMPLERS)
def test_flashinfer_entry_points_are_slot_independent_and_do_not_advance(name: str) -> None:
    rows, vocab = 128, 1000
    inp = (
        _probs(rows, vocab, torch.float32, seed=41)
        if name.endswith("probs")
        else _logits(rows, vocab, torch.float32, seed=41)
    )
    params = _fi_default_params(vocab)
    seeds, offsets = _seeds(rows, 3), torch.randint(0, 10**6, (rows,), device="cuda")
    before = offsets.clone()
    a = _fi_call(name, inp, params, seed=seeds, offset=offsets)
    assert torch.equal(offsets, before), "the FlashInfer-named entry points leave offset alone"
    assert a.dtype == torch.int32
    assert torch.equal(a, _fi_call(name, inp, params, seed=seeds, offset=offsets))
    perm = torch.randperm(rows, device="cuda")
    b = _fi_call(name, inp[perm], params, seed=seeds[perm], offset=offsets[perm])
    assert torch.equal(a[perm], b)
    if name.startswith("top_k_top_p"):
        for order in ("top_k_first", "joint"):
            c = _fi_call(name, inp, params, order, seed=seeds, offset=offsets)
            d = _fi_call(name, inp[perm], params, order, seed=seeds[perm], offset=offsets[perm])
            assert torch.equal(c[perm], d), order
    p = ref_dist(inp, from_probs=name.endswith("probs"), **{f: params[f] for f in FI_FILTERS[name]})[0]
    assert bool((p.gather(1, a.long()[:, None]) > 0).all()), "a draw outside the kept set"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sampling_from_logits", "top_k_top_p_sampling_from_probs"])
def test_flashinfer_length_one_seed_tensor_acts_as_int(name: str) -> None:
    inp = (
        torch.full((64, 1000), 1e-3, device="cuda") if name.endswith("probs") else torch.zeros(64, 1000, device="cuda")
    )
    params = _fi_default_params(1000) | {"top_k": 1000, "top_p": 1.0}
    seed, offset = torch.tensor([17], device="cuda"), torch.tensor([4], device="cuda")
    a = _fi_call(name, inp, params, seed=seed, offset=offset)
    assert int(offset) == 4
    assert torch.equal(a, _fi_call(name, inp, params, seed=17, offset=4))
    assert a.unique().numel() > 10


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("name", FI_SAMPLERS)
def test_flashinfer_indices_map_outputs_to_rows(name: str, index_dtype: torch.dtype) -> None:
    unique, rows, vocab = 5, 300, 2000
    inp = (
        _probs(unique, vocab, torch.float32, seed=51)
        if name.endswith("probs")
        else _logits(unique, vocab, torch.float32, seed=51)
    )
    indices = torch.randint(0, unique, (rows,), device="cuda").to(index_dtype)
    params = _fi_default_params(vocab)
    seeds, offsets = _seeds(rows, 8), torch.randint(0, 10**6, (rows,), device="cuda")
    got = _fi_call(name, inp, params, indices=indices, seed=seeds, offset=offsets)
    assert got.dtype == index_dtype and got.shape == (rows,)
    want = _fi_call(name, inp[indices.long()].contiguous(), params, seed=seeds, offset=offsets)
    assert torch.equal(got.long(), want.long())


# ---------------------------------------------------------------------------------------------
# GPU: CUDA graphs and torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_graph_replays_draw_fresh_tokens() -> None:
    rows, vocab = 64, 1000
    x = torch.zeros(rows, vocab, device="cuda", dtype=torch.bfloat16)  # uniform: high entropy
    temperature = torch.ones(rows, device="cuda")
    top_k = torch.full((rows,), 900, device="cuda", dtype=torch.int32)
    seed, offset = _seeds(rows, 1), _zeros64(rows)

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        return jit_kernel.sample(
            x, temperature=temperature, top_k=top_k, top_p=0.99, seed=seed, offset=offset, return_logprobs=True
        )

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # resolve the kernel outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids, logprobs = step()
    offset.fill_(5)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append((ids.clone(), logprobs.clone()))
    torch.cuda.synchronize()
    assert torch.equal(offset, torch.full_like(offset, 8)), "three replays advance offset by 3"
    assert not torch.equal(replays[0][0], replays[1][0]) and not torch.equal(replays[1][0], replays[2][0])
    eager_offset = torch.full_like(offset, 5)
    for r in range(3):
        e_ids, e_lp = jit_kernel.sample(
            x, temperature=temperature, top_k=top_k, top_p=0.99, seed=seed, offset=eager_offset, return_logprobs=True
        )
        assert torch.equal(replays[r][0], e_ids), f"replay {r}"
        assert torch.equal(replays[r][1], e_lp), f"replay {r}"


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager() -> None:
    torch._dynamo.reset()
    rows, vocab = 32, 32000

    def step(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor):
        ids, logprobs = jit_kernel.sample(
            logits, temperature=temperature, top_k=50, top_p=0.9, seed=seed, offset=offset, return_logprobs=True
        )
        return ids + 0, logprobs * 1

    x = _logits(rows, vocab, torch.bfloat16, seed=61)
    temperature = torch.rand(rows, device="cuda") + 0.3
    temperature[0] = 0
    seed = _seeds(rows, 2)
    off_eager, off_compiled = _zeros64(rows), _zeros64(rows)
    compiled = torch.compile(step, fullgraph=True)
    for _ in range(2):
        want = step(x, temperature, seed, off_eager)
        got = compiled(x, temperature, seed, off_compiled)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(off_compiled, off_eager)
    assert torch.equal(off_compiled, torch.full_like(off_compiled, 2))
    explanation = torch._dynamo.explain(step)(x, temperature, seed, _zeros64(rows))
    assert explanation.graph_break_count == 0, explanation.break_reasons


# ---------------------------------------------------------------------------------------------
# GPU: invalid rows
# ---------------------------------------------------------------------------------------------

# (row, what) for the invalid-row batch: logits edits and per-request values
INVALID_ROWS = {
    1: "NaN logit",
    2: "+inf logit",
    3: "all -inf",
    5: "top_k 0",
    6: "top_p 0",
    7: "top_p 1.5",
    8: "temperature -1",
    9: "min_p 2",
    10: "temperature NaN",
    11: "top_k -3",
    12: "min_p -0.5",
    15: "top_p NaN",
    16: "min_p NaN",
}
INVALID_BATCH = 18  # rows 0, 4 (half -inf), 13 (greedy), 14, 17 are valid


def _invalid_batch(dtype: torch.dtype, vocab: int = 1000) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    rows = INVALID_BATCH
    x = _logits(rows, vocab, dtype, seed=71)
    x[1, 3] = math.nan
    x[2, 7] = math.inf
    x[3] = -math.inf
    x[4, ::2] = -math.inf
    t = torch.ones(rows, device="cuda")
    k = torch.full((rows,), vocab, device="cuda", dtype=torch.int32)
    p = torch.ones(rows, device="cuda")
    m = torch.zeros(rows, device="cuda")
    k[5], p[6], p[7], t[8], m[9], t[10], k[11], m[12], t[13], p[15], m[16] = (
        0,
        0,
        1.5,
        -1,
        2,
        math.nan,
        -3,
        -0.5,
        0,
        math.nan,
        math.nan,
    )
    k[14], p[17], m[0] = 30, 0.8, 0.05
    return x, {"temperature": t, "top_k": k, "top_p": p, "min_p": m}


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [None, torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", DTYPES)
def test_invalid_rows_get_minus_one_and_nan(dtype: torch.dtype, out_dtype: torch.dtype | None) -> None:
    x, params = _invalid_batch(dtype)
    rows = INVALID_BATCH
    bad = torch.zeros(rows, dtype=torch.bool, device="cuda")
    bad[list(INVALID_ROWS)] = True
    _, _, ref_valid = ref_dist(x, **params)
    assert torch.equal(~ref_valid, bad)
    seeds, offsets = _seeds(rows, 4), _zeros64(rows)
    kw: dict[str, Any] = {}
    if out_dtype is not None:
        kw["out"] = torch.full((rows,), 0x3FFFFFFF, dtype=out_dtype, device="cuda")  # poison
    ids, logprobs = jit_kernel.sample(x, **params, seed=seeds, offset=offsets.clone(), return_logprobs=True, **kw)
    if out_dtype is not None:
        assert ids.data_ptr() == kw["out"].data_ptr() and ids.dtype == out_dtype
    for r, what in INVALID_ROWS.items():
        assert int(ids[r]) == -1, f"row {r} ({what}): id {int(ids[r])}"
        assert bool(logprobs[r].isnan()), f"row {r} ({what}): logprob {float(logprobs[r])}"
    good = ~bad
    sub = {k: v[good] for k, v in params.items()}
    want_ids, want_lp = jit_kernel.sample(
        x[good], **sub, seed=seeds[good], offset=offsets[good].clone(), return_logprobs=True
    )
    assert torch.equal(ids[good].long(), want_ids.long()), "invalid rows disturb the valid ones"
    assert torch.equal(logprobs[good], want_lp)
    # mask_logits: invalid rows NaN, the others as without them
    masked = jit_kernel.mask_logits(x, **params)
    assert bool(masked[bad].isnan().all())
    assert _bits_equal(masked[good], jit_kernel.mask_logits(x[good], **sub))
    # the device is fine afterwards
    after = jit_kernel.sample(_logits(8, 1000, dtype, seed=72), temperature=0.7, top_p=0.9)
    torch.cuda.synchronize()
    assert bool(((after >= 0) & (after < 1000)).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_invalid_rows_of_the_probs_ops(dtype: torch.dtype) -> None:
    rows, vocab = 6, 1000
    probs = _probs(rows, vocab, dtype, seed=73)
    probs[1, 5] = math.nan
    top_k = torch.tensor([10, 10, 0, 10, 10, 10], device="cuda")
    top_p = torch.tensor([0.9, 0.9, 0.9, 0.0, 1.5, 0.9], device="cuda")
    bad_k = torch.tensor([False, True, True, False, False, False], device="cuda")
    bad_p = torch.tensor([False, True, False, True, True, False], device="cuda")
    out = _fi("top_k_renorm_probs")(probs, top_k)
    assert bool(out[bad_k].isnan().all()) and not bool(out[~bad_k].isnan().any())
    assert _bits_equal(out[~bad_k], _fi("top_k_renorm_probs")(probs[~bad_k], top_k[~bad_k]))
    out = _fi("top_p_renorm_probs")(probs, top_p)
    assert bool(out[bad_p].isnan().all()) and not bool(out[~bad_p].isnan().any())
    logits = _logits(rows, vocab, dtype, seed=74)
    logits[1, 5] = math.nan
    out = _fi("top_k_mask_logits")(logits, top_k)
    assert bool(out[bad_k].isnan().all()) and not bool(out[~bad_k].isnan().any())
    if dtype == torch.float32:
        ids, valid = _fi("sampling_from_probs")(probs, seed=1, offset=0, return_valid=True)
        assert valid.dtype == torch.bool and valid.tolist() == [True, False, True, True, True, True]
        assert bool((ids[valid] >= 0).all())
        ids, valid = _fi("top_k_top_p_sampling_from_probs")(probs, top_k, top_p, seed=1, offset=0, return_valid=True)
        assert valid.tolist() == (~(bad_k | bad_p)).tolist()
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_check_nan_raises() -> None:
    probs = _probs(4, 100, torch.float32)
    logits = _logits(4, 100, torch.float32)
    _fi("sampling_from_probs")(probs, check_nan=True)
    _fi("top_k_top_p_sampling_from_logits")(logits, 5, 0.9, check_nan=True)
    probs[2, 3] = math.nan
    logits[1, 0] = math.nan
    with pytest.raises(ValueError, match=r"(?i)nan"):
        _fi("sampling_from_probs")(probs, check_nan=True)
    with pytest.raises(ValueError, match=r"(?i)nan"):
        _fi("top_k_top_p_sampling_from_logits")(logits, 5, 0.9, check_nan=True)
    with pytest.raises(ValueError, match=r"(?i)nan"):
        _fi("sampling_from_logits")(logits, check_nan=True)


# ---------------------------------------------------------------------------------------------
# GPU: log-probabilities
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_logprobs_match_the_reference(dtype: torch.dtype) -> None:
    rows, vocab = 64, 32000
    x = _logits(rows, vocab, dtype, seed=81)
    g = torch.Generator(device="cuda").manual_seed(82)
    temperature = torch.tensor([0.0, 0.5, 1.0, 1.3], device="cuda").repeat(rows // 4)
    top_k = torch.tensor([vocab, 20, 1000, vocab + 7, 3, 200, vocab, 50], device="cuda").repeat(rows // 8)
    base = ref_dist(x, temperature=temperature, top_k=top_k)[0]
    top_p = safe_top_p(
        torch.where(base.isnan(), 1.0, base), torch.rand(rows, generator=g, device="cuda", dtype=F64) * 0.6 + 0.4
    )
    top_p[::5] = 1.0
    base = ref_dist(x, temperature=temperature, top_k=top_k, top_p=top_p)[0]
    min_p = safe_min_p(base, 0.02)
    min_p[::3] = 0.0
    params = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    p = ref_dist(x, **params)[0]
    for call in range(3):
        ids, logprobs = jit_kernel.sample(
            x, **params, seed=_seeds(rows, 6), offset=_zeros64(rows) + call, return_logprobs=True
        )
        assert logprobs.dtype == torch.float32 and logprobs.shape == (rows,)
        assert bool((p.gather(1, ids.long()[:, None]) > 0).all()), "a draw outside the kept set"
        want = ref_logprob(p, ids)
        err = (logprobs.double() - want).abs()
        tol = _logprob_tol(p, ids)
        assert bool((err <= tol).all()), (
            f"row {int((err - tol).argmax())}: logprob {logprobs.tolist()} vs {want.tolist()}"
        )
        assert bool((logprobs[temperature == 0] == 0).all())


# ---------------------------------------------------------------------------------------------
# GPU: every vocabulary size and dtype
# ---------------------------------------------------------------------------------------------


def _top_k_values(vocab: int, rows: int) -> int | torch.Tensor:
    if rows == 1:
        return max(1, vocab // 3)
    return torch.tensor([1, 7, vocab // 2 + 1, vocab + 5], device="cuda").repeat(rows // 4)


def _assert_renorm(out: torch.Tensor, p64: torch.Tensor, keep: torch.Tensor, what: str) -> None:
    assert not bool(out.isnan().any()), f"{what}: NaN in the output"
    assert bool((out[~keep] == 0).all()), f"{what}: non-zero outside the kept set"
    ref = _renorm(p64, keep)
    rtol = {torch.float32: 2e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9}[out.dtype]
    tiny = {torch.float32: 1e-40, torch.bfloat16: 1e-38, torch.float16: 6e-8}[out.dtype]
    tol = rtol * ref + 2 * RESOLUTION * ref.max(1, keepdim=True).values + tiny
    err = (out.double() - ref).abs()
    assert bool((err <= tol).all()), f"{what}: max error {float((err - tol).max())} over the tolerance"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_renorm_probs(vocab: int, dtype: torch.dtype, rows: int) -> None:
    probs = _probs(rows, vocab, dtype, seed=vocab)
    top_k = _top_k_values(vocab, rows)
    p64 = probs.double()
    _, keep, _ = ref_dist(p64, top_k=top_k, from_probs=True)
    _poison_allocations(probs.nbytes)
    out = _fi("top_k_renorm_probs")(probs, top_k)
    assert out.dtype == dtype and out.shape == probs.shape
    _assert_renorm(out, p64, keep, f"top_k_renorm_probs V={vocab} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_top_p_renorm_probs(vocab: int, dtype: torch.dtype, rows: int) -> None:
    probs = _probs(rows, vocab, dtype, seed=vocab + 1)
    p64 = probs.double()
    targets = torch.tensor([0.3, 0.6, 0.9, 0.99], dtype=F64, device="cuda")[:rows] if rows == 4 else 0.8
    chosen = safe_top_p(p64, targets, raw_too=True)
    top_p: float | torch.Tensor = float(chosen[0]) if rows == 1 else chosen
    _, keep, _ = ref_dist(p64, top_p=top_p, from_probs=True)
    _poison_allocations(probs.nbytes)
    out = _fi("top_p_renorm_probs")(probs, top_p)
    assert out.dtype == dtype and out.shape == probs.shape
    _assert_renorm(out, p64, keep, f"top_p_renorm_probs V={vocab} {dtype} top_p={top_p}")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_mask_logits(vocab: int, dtype: torch.dtype, rows: int) -> None:
    x = _logits(rows, vocab, dtype, seed=vocab + 2)
    top_k = _top_k_values(vocab, rows)
    if isinstance(top_k, torch.Tensor):
        top_k = top_k.to(torch.int32)
    _, keep, _ = ref_dist(x, top_k=top_k)
    want = torch.where(keep, x, -math.inf)
    _poison_allocations(x.nbytes)
    out = _fi("top_k_mask_logits")(x, top_k)
    assert _bits_equal(out, want), _first_mismatch(out, want)


def _mask_params(x: torch.Tensor, rows: int) -> dict[str, Any]:
    vocab = x.shape[1]
    if rows == 1:
        params: dict[str, Any] = {"top_k": min(vocab, 40)}
        params["top_p"] = float(safe_top_p(ref_dist(x, **params)[0], 0.9)[0])
        params["min_p"] = float(safe_min_p(ref_dist(x, **params)[0], 0.02)[0])
        return params
    t = torch.tensor([1.0, 0.5, 2.0, 0.0], device="cuda").repeat(rows // 4)
    k = torch.tensor([vocab + 5, 7, vocab // 2 + 1, 1], device="cuda").repeat(rows // 4)
    base = ref_dist(x, temperature=t, top_k=k)[0]
    p = safe_top_p(base, torch.tensor([1.0, 0.8, 0.95, 0.5], device="cuda", dtype=F64).repeat(rows // 4))
    p[0] = 1.0
    base = ref_dist(x, temperature=t, top_k=k, top_p=p)[0]
    m_target = torch.tensor([0.01, 0.1, 0.0, 0.0], device="cuda", dtype=F64).repeat(rows // 4)
    m = torch.where(m_target > 0, safe_min_p(base, m_target), 0.0)
    return {"temperature": t, "top_k": k, "top_p": p, "min_p": m}


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_mask_logits(vocab: int, dtype: torch.dtype, rows: int) -> None:
    x = _logits(rows, vocab, dtype, seed=vocab + 3)
    params = _mask_params(x, rows)
    want = ref_mask_logits(x, **params)
    _poison_allocations(x.nbytes)
    out = jit_kernel.mask_logits(x, **params)
    assert _bits_equal(out, want), _first_mismatch(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", VOCABS)
def test_sample_every_vocab(vocab: int, dtype: torch.dtype) -> None:
    rows = 4
    x = _logits(rows, vocab, dtype, seed=vocab + 4)
    params = _mask_params(x, rows)
    p = ref_dist(x, **params)[0]
    ids, logprobs = jit_kernel.sample(x, **params, seed=_seeds(rows), offset=_zeros64(rows), return_logprobs=True)
    assert ids.dtype == torch.int32 and ids.shape == (rows,)
    assert bool(((ids >= 0) & (ids < vocab)).all()) and bool((p.gather(1, ids.long()[:, None]) > 0).all())
    err = (logprobs.double() - ref_logprob(p, ids)).abs()
    assert bool((err <= _logprob_tol(p, ids)).all()), (logprobs.tolist(), ref_logprob(p, ids).tolist())
    if vocab == 1:
        assert ids.tolist() == [0] * rows and bool((logprobs.abs() <= 1e-6).all())


# ---------------------------------------------------------------------------------------------
# GPU: strided rows, out=
# ---------------------------------------------------------------------------------------------

LAYOUT_OPS = [
    "sample",
    "mask_logits",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
]


def _layout_call(op: str, x: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if op == "sample":
        return jit_kernel.sample(x, temperature=0.8, top_k=50, top_p=0.9, seed=_seeds(rows), offset=_zeros64(rows))
    if op == "mask_logits":
        return jit_kernel.mask_logits(x, temperature=0.5, top_k=50, top_p=0.9, min_p=0.01)
    if op == "top_k_mask_logits":
        return _fi(op)(x, 50)
    if op == "top_k_renorm_probs":
        return _fi(op)(x, 50)
    if op == "top_p_renorm_probs":
        return _fi(op)(x, 0.9)
    if op == "sampling_from_probs":
        return _fi(op)(x, seed=_seeds(rows), offset=_zeros64(rows))
    return _fi(op)(x, 50, 0.9, seed=_seeds(rows), offset=_zeros64(rows))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["padded", "shifted"])
@pytest.mark.parametrize(("vocab", "dtype"), [(1000, torch.float32), (128256, torch.bfloat16)])
@pytest.mark.parametrize("op", LAYOUT_OPS)
def test_strided_rows_match_contiguous(op: str, vocab: int, dtype: torch.dtype, layout: str) -> None:
    """Rows of a wider tensor (row stride V + 64; ``shifted`` also starts one element in): the same
    result, bit for bit, as the contiguous copy."""
    rows = 6
    probs_op = op.endswith("probs")
    # the FlashInfer samplers are documented for float32 inputs
    dtype_in = torch.float32 if op in ("sampling_from_probs", "top_k_top_p_sampling_from_logits") else dtype
    src = _probs(rows, vocab, dtype_in, seed=91) if probs_op else _logits(rows, vocab, dtype_in, seed=91)
    wide = torch.full((rows, vocab + 64), math.nan, device="cuda", dtype=dtype_in)
    start = 1 if layout == "shifted" else 0
    view = wide[:, start : start + vocab]
    view.copy_(src)
    assert view.stride() == (vocab + 64, 1)
    got = _layout_call(op, view)
    want = _layout_call(op, src)
    assert _bits_equal(got, want), _first_mismatch(got.reshape(rows, -1), want.reshape(rows, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.int32, torch.int64])
def test_sample_out(out_dtype: torch.dtype) -> None:
    rows = 33
    x = _logits(rows, 32000, torch.bfloat16, seed=95)
    want = jit_kernel.sample(x, temperature=0.7, top_k=100, seed=_seeds(rows), offset=_zeros64(rows))
    out = torch.full((rows,), 0x3FFFFFFF, device="cuda", dtype=out_dtype)
    got = jit_kernel.sample(x, temperature=0.7, top_k=100, seed=_seeds(rows), offset=_zeros64(rows), out=out)
    assert got.data_ptr() == out.data_ptr() and got.dtype == out_dtype
    assert torch.equal(out.long(), want.long())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_mask_logits_out(dtype: torch.dtype) -> None:
    rows = 8
    x = _logits(rows, 32000, dtype, seed=96)
    params = _mask_params(x, rows)
    want = ref_mask_logits(x, **params)
    out = torch.full_like(x, math.nan)
    got = jit_kernel.mask_logits(x, **params, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert _bits_equal(out, want), _first_mismatch(out, want)
