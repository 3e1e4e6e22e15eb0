"""DeepSeek-V4 pool sizing: the model SGLang 0.5.23's ``DSV4PoolConfigurator`` uses.

Memory per rank is ``full_tokens * bytes_per_full_token + fixed_bytes``.  One "full"
token costs its share of every pool: SWA slots (``swa_ratio`` of full tokens, plus the c4
compress-state rows addressed per SWA page), a quarter of a c4 entry and of its index
key, and 1/128 of a c128 entry.  Pages of the paged FlashMLA layout are padded to the
reader's row stride, which is why a c128 page of one or two entries costs more than its
entries.  The c128 compress state is one ring per request slot, so it is fixed bytes set
by max running requests.  Modelled: the default FlashMLA ``v4`` KV layout on CUDA, paged
(non-unified) pools, a single pipeline stage, no HiSparse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4_engine.configurator.budget import GiB
from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.index_budget import (
    index_k_budget_bytes,
    index_k_storage,
    stored_index_k_bytes,
)
from dsv4_engine.configurator.model import ModelSpec
from dsv4_engine.configurator.result import Pool, PoolPlan
from dsv4_engine.configurator.settings import EngineSettings

DEFAULT_SWA_RATIO = 0.1
CAP_MODE_MODEL_TYPE = "deepseek_v41"
# SGLang's DeepSeek-V4 hook sets --max-running-requests to this when it is not given.
DEFAULT_MAX_RUNNING_REQUESTS = 256
SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL
STATE_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}
FP8_SCALE_TILE = 64  # the v4 layout keeps one ue8m0 scale per 64 nope values, plus a pad byte


@dataclass(frozen=True)
class Dsv4Geometry:
    """Per-token and per-row byte costs, independent of the memory budget."""

    page_size: int
    ring4: int
    ring128: int
    n_layers: int
    n_c4: int
    n_c128: int
    bytes_per_swa_token: float
    bytes_per_full_token: float
    index_k_budget: int
    index_k_alloc: int
    paged_swa: float
    paged_c4: float
    paged_c128: float
    c4_state_row_bytes: int
    c128_state_row_bytes: int
    swa_ratio: float
    swa_cap_tokens: int | None
    spec_inflation: float


def v4_page_bytes(model: ModelSpec, tokens: int) -> int:
    """Bytes of one page of ``tokens`` FlashMLA v4 rows: fp8 nope + bf16 rope + scales,
    padded to a multiple of the data row (the reader's TMA stride)."""
    data = model.qk_nope_head_dim + 2 * model.qk_rope_head_dim
    scales = model.qk_nope_head_dim // FP8_SCALE_TILE + 1
    return math.ceil(tokens * (data + scales) / data) * data


def _paged_bytes_per_token(model: ModelSpec, page_size: int, ratio: int) -> float:
    tokens = page_size // ratio if ratio else page_size
    return v4_page_bytes(model, tokens) / tokens


def ring_size(ratio: int, settings: EngineSettings) -> int:
    """Compress-state rows per request: raw tokens waiting to be compressed (twice the
    ratio for c4's overlapping windows), wider when draft tokens are written ahead."""
    if settings.speculative:
        return 16 if ratio == 4 else 256
    return 8 if ratio == 4 else 128


def _check_ring_serves_drafts(settings: EngineSettings) -> None:
    for ratio in (4, 128):
        window = ratio * (2 if ratio == 4 else 1)
        ring = ring_size(ratio, settings)
        most = ring - window + 2 if ring > window else 0
        if settings.speculative_num_draft_tokens > most:
            raise ConfigError(
                f"speculative_num_draft_tokens: {settings.speculative_num_draft_tokens} exceeds "
                f"the {most} draft tokens the c{ratio} compress-state ring can hold"
            )


def _request_cap_tokens(model: ModelSpec, settings: EngineSettings, mrr: int) -> int:
    """SWA slots live at max running requests (cap mode), plus radix-cache tail headroom."""
    page, window = settings.page_size, model.sliding_window
    draft_tokens = settings.speculative_num_draft_tokens or 1
    trailing = window + SWA_EVICTION_INTERVAL * draft_tokens + page
    if not settings.speculative:
        decode_alloc = page
    elif settings.disable_overlap_schedule:
        raise ConfigError(
            "disable_overlap_schedule: SWA cap mode with speculative decoding and the "
            "overlap scheduler off is not modelled; give swa_full_tokens_ratio instead"
        )
    else:
        decode_alloc = 2 * max(
            settings.speculative_num_steps or 1, settings.speculative_num_draft_tokens
        )
    per_request = trailing + decode_alloc
    if settings.disaggregation_mode == "decode":
        cap = per_request * mrr + (window + page) * settings.disaggregation_decode_extra_slots
    else:
        chunks = 1 if settings.disable_overlap_schedule else 2
        cap = per_request * mrr + chunks * settings.chunked_prefill_size + page
    if settings.swa_prefix_tails is not None:
        tails = settings.swa_prefix_tails
    else:
        tails = 0 if settings.radix_cache_disabled else 4 * mrr
    total = cap + tails * (window + page)
    return -(-total // page) * page


def _uses_cap_mode(model: ModelSpec, settings: EngineSettings) -> bool:
    """SGLang sizes SWA from the request cap only when no ratio was given, and its V4 model
    override gives 0.1 to every config but ``deepseek_v41`` ones."""
    return (
        settings.swa_full_tokens_ratio is None
        and model.model_type == CAP_MODE_MODEL_TYPE
        and (settings.disaggregation_mode == "decode" or settings.chunked_prefill_size > 0)
    )


def dsv4_geometry(model: ModelSpec, settings: EngineSettings) -> Dsv4Geometry:
    page = settings.page_size
    if page % 128:
        raise ConfigError(
            f"page_size: DeepSeek-V4 compressed attention needs a multiple of 128, got {page}"
        )
    if settings.speculative:
        _check_ring_serves_drafts(settings)
    ring4, ring128 = ring_size(4, settings), ring_size(128, settings)
    n_layers, n_c4, n_c128 = (
        len(model.compress_ratios),
        model.layers_with_ratio(4),
        model.layers_with_ratio(128),
    )
    state_bytes = STATE_ELEMENT_BYTES[settings.compress_state_dtype]
    paged_swa = _paged_bytes_per_token(model, page, 0)
    paged_c4 = _paged_bytes_per_token(model, page, 4)
    paged_c128 = _paged_bytes_per_token(model, page, 128)
    # c4 keeps (kv, score) for two overlapping windows: 2 * 2 * dim per row.
    c4_state_row = 2 * 2 * model.attn_head_dim * state_bytes
    c4_index_state_row = 2 * 2 * model.index_head_dim * state_bytes
    # Same operation order as SGLang so the float coefficient matches it bit for bit.
    bytes_per_swa_token = paged_swa * n_layers + (
        ring4 / page * (c4_state_row + c4_index_state_row) * n_c4
    )
    index_budget = index_k_budget_bytes(model.index_head_dim, settings)
    c4_per_full_token = 1 / 4 * paged_c4 + 1 / 4 * index_budget
    c128_per_full_token = 1 / 128 * paged_c128
    mrr = settings.max_running_requests_per_worker or DEFAULT_MAX_RUNNING_REQUESTS
    swa_cap = _request_cap_tokens(model, settings, mrr) if _uses_cap_mode(model, settings) else None
    ratio = (
        settings.swa_full_tokens_ratio
        if settings.swa_full_tokens_ratio is not None
        else DEFAULT_SWA_RATIO
    )
    coeff_ratio = 0 if swa_cap is not None else ratio
    bytes_per_full_token = coeff_ratio * bytes_per_swa_token + (
        c4_per_full_token * n_c4 + c128_per_full_token * n_c128
    )
    inflation = 1.0
    if settings.speculative:
        # The MTP draft layer is reserved by inflating per-token bytes by (L + 1) / L.
        inflation = (n_layers + 1) / n_layers
        bytes_per_full_token *= inflation
        bytes_per_swa_token *= inflation
    index_alloc = stored_index_k_bytes(model.index_head_dim, settings.index_dtype)
    return Dsv4Geometry(
        page_size=page,
        ring4=ring4,
        ring128=ring128,
        n_layers=n_layers,
        n_c4=n_c4,
        n_c128=n_c128,
        bytes_per_swa_token=bytes_per_swa_token,
        bytes_per_full_token=bytes_per_full_token,
        index_k_budget=index_budget,
        index_k_alloc=index_alloc,
        paged_swa=paged_swa,
        paged_c4=paged_c4,
        paged_c128=paged_c128,
        c4_state_row_bytes=(c4_state_row + c4_index_state_row) * n_c4,
        c128_state_row_bytes=2 * model.attn_head_dim * state_bytes * n_c128,
        swa_ratio=ratio,
        swa_cap_tokens=swa_cap,
        spec_inflation=inflation,
    )


def _request_slots(settings: EngineSettings, mrr: int) -> int:
    extra = (
        settings.disaggregation_decode_extra_slots
        if settings.disaggregation_mode == "decode"
        else 0
    )
    return mrr + extra + 1


def _c128_state_rows(geo: Dsv4Geometry, settings: EngineSettings, mrr: int) -> tuple[int, int]:
    """(rows addressed by requests, rows allocated): one ring per request slot, plus one
    spare ring and a row, padded to a multiple of 128."""
    if not geo.n_c128:
        return 0, 0
    used = _request_slots(settings, mrr) * geo.ring128
    return used, -(-(used + geo.ring128 + 1) // 128) * 128


def plan_dsv4(model: ModelSpec, settings: EngineSettings, kv_budget_bytes: int) -> PoolPlan:
    geo = dsv4_geometry(model, settings)
    page = geo.page_size
    mrr = settings.max_running_requests_per_worker or DEFAULT_MAX_RUNNING_REQUESTS
    c128_rows, c128_alloc_rows = _c128_state_rows(geo, settings, mrr)
    c128_fixed = c128_alloc_rows * geo.c128_state_row_bytes
    swa_fixed = 0 if geo.swa_cap_tokens is None else geo.swa_cap_tokens * geo.bytes_per_swa_token
    fixed = c128_fixed + swa_fixed
    for_tokens = max(kv_budget_bytes - fixed, 0)
    full = int(for_tokens / geo.bytes_per_full_token) // page * page
    if geo.swa_cap_tokens is not None:
        swa = geo.swa_cap_tokens
        if full <= 0:
            raise ConfigError(
                f"memory: the SWA request cap ({swa} tokens, {swa_fixed / GiB:.2f} GiB) leaves "
                f"no room for one {page}-token page of the full KV pool in "
                f"{kv_budget_bytes / GiB:.2f} GiB; lower max_running_requests or add memory"
            )
    else:
        swa = int(full * geo.swa_ratio) // page * page
        if model.sliding_window + page >= swa:
            raise ConfigError(
                f"memory: {kv_budget_bytes / GiB:.2f} GiB per rank holds {full} full tokens, "
                f"an SWA pool of {swa} tokens: too small for one request "
                f"(needs more than sliding_window {model.sliding_window} + page_size {page})"
            )
    infl = geo.spec_inflation
    pools = (
        Pool("swa", geo.paged_swa * geo.n_layers * infl, swa),
        Pool("c4", geo.paged_c4 * geo.n_c4 * infl, full // 4),
        Pool("c4_indexer", geo.index_k_budget * geo.n_c4 * infl, full // 4),
        Pool("c128", geo.paged_c128 * geo.n_c128 * infl, full // 128),
        Pool("c4_state", geo.c4_state_row_bytes * infl, swa // page * geo.ring4),
        Pool("c128_state", geo.c128_state_row_bytes, c128_rows, c128_alloc_rows - c128_rows),
    )
    return PoolPlan(
        model_kind=model.kind.value,
        index_dtype=settings.index_dtype.value,
        engine=settings.engine.value,
        index_k_storage=index_k_storage(model.index_head_dim, settings),
        legacy=settings.legacy,
        page_size=page,
        kv_budget_bytes=kv_budget_bytes,
        bytes_per_full_token=geo.bytes_per_full_token,
        fixed_bytes=int(fixed),
        full_tokens=full,
        max_running_requests_per_worker=mrr,
        index_k_budget_bytes=geo.index_k_budget,
        index_k_alloc_bytes=geo.index_k_alloc,
        swa_mode="cap" if geo.swa_cap_tokens is not None else "ratio",
        pools=pools,
    )
