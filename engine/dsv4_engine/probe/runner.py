"""Run a probe set against an engine: preflight, concurrent workers, sequential stopping.

`concurrency` workers each run one sample at a time, so requests in flight never exceed the
setting and reach it whenever the engine keeps up.  Every finished sample goes through one
`Tally` (single-threaded event loop, no locks), which applies the FAIL rule after each judged
sample and stops new samples as soon as it fires; samples already in flight still finish
and are counted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp

from dsv4_engine import kv_canary
from dsv4_engine.engine_config import Backend, ReferenceModelKind
from dsv4_engine.probe import evidence
from dsv4_engine.probe.client import EndpointMissing, EngineClient, TransportError
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.probes import Baseline, ProbeContext, Sample, run_sample
from dsv4_engine.probe.settings import Determinism, ProbeName, ProbeSettings
from dsv4_engine.probe.stats import excess_fail_now, fail_now, upper_bound
from dsv4_engine.probe.verdict import Divergence, Evidence, Verdict, decide


class ProbeConnectionError(Exception):
    """The engine cannot be reached or does not speak the OpenAI API (exit code 3)."""


@dataclass
class Tally:
    """Every sample counts: a corrupt answer and a request that got no answer to judge (an
    error, a timeout, a body that is not a chat answer) are both failures of the canary,
    and the bounds are on failures over all samples.  No failed request gives its slot
    back: re-issuing it until an answer comes would let a canary that fails 2% of its
    requests PASS on the 98% that it answered."""

    settings: ProbeSettings
    budget: int
    samples: list[Sample] = field(default_factory=list)
    judged: int = 0
    """Samples counted: every one run, a failed request included."""
    corrupt: int = 0
    transport_errors: int = 0
    """Failed requests: no answer to judge (each also a failure)."""
    exercised: int = 0
    """Judged answers proven to have read a prefix back from the host tier (set after the
    run, from the engines' counts: `evidence.proven_exercised`)."""
    judged_prompts: list[int] = field(default_factory=list)
    """The prompt size of every judged request to the engine under test."""
    unjudged_tokens: int = 0
    """The prompt tokens of its requests whose answers were not judged."""
    streamed: int = 0
    """Samples whose judged answer was streamed (the rest were answered whole)."""
    fail_at: int | None = None
    failure_flags: list[bool] = field(default_factory=list)
    """One entry per judged sample, in completion order: the running rate's data."""
    stopped_because: str | None = None
    differential: DifferentialTally | None = None
    """Set when consistency samples are differential (the engine is not deterministic)."""

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.judged_prompts.extend(sample.judged_prompts)
        self.unjudged_tokens += sample.unjudged_tokens
        if self.differential is not None and sample.probe.needs_determinism:
            self._add_differential(sample)
            return
        self.judged += 1
        self.corrupt += sample.outcome.is_corruption
        self.transport_errors += sample.outcome is Outcome.TRANSPORT_ERROR
        self.streamed += sample.streamed
        self.failure_flags.append(sample.outcome.is_failure)
        s = self.settings
        if self.fail_at is None and fail_now(
            self.failed, self.judged, s.max_corruption_rate, s.confidence
        ):
            self.fail_at = self.judged
            self.stop("sequential FAIL rule fired")

    def _add_differential(self, sample: Sample) -> None:
        d = self.differential
        assert d is not None
        d.add(sample)
        s = self.settings
        if d.fail_at is None and excess_fail_now(
            d.canary, d.n_canary, d.stable, d.n_stable, s.max_divergence_excess, s.confidence
        ):
            d.fail_at = d.n_canary
            self.stop("sequential FAIL rule on the divergence excess fired")

    @property
    def failed(self) -> int:
        """Corrupt answers plus failed requests: what the bounds count."""
        return self.corrupt + self.transport_errors

    def stop(self, why: str) -> None:
        if self.stopped_because is None:
            self.stopped_because = why

    @property
    def upper_bound(self) -> float:
        return upper_bound(self.failed, self.judged, self.settings.confidence)


@dataclass
class DifferentialTally:
    """Differential consistency samples, counted per side.  A canary request that failed
    counts as a changed answer (no failed request is forgiven); a failed baseline request
    leaves that sample out of the baseline's rate."""

    baseline_url: str
    n_canary: int = 0
    canary: int = 0
    canary_errors: int = 0
    n_stable: int = 0
    stable: int = 0
    stable_errors: int = 0
    fail_at: int | None = None

    def add(self, sample: Sample) -> None:
        self.n_canary += 1
        failed = sample.outcome is Outcome.TRANSPORT_ERROR
        self.canary_errors += failed
        self.canary += failed or sample.outcome is Outcome.DIVERGED
        if sample.baseline_diverged is None:
            self.stable_errors += not failed  # a failed canary sample never asked it
        else:
            self.n_stable += 1
            self.stable += sample.baseline_diverged

    def evidence(self, margin: float) -> Divergence:
        return Divergence(
            self.n_canary, self.canary, self.n_stable, self.stable, margin, self.fail_at
        )


@dataclass(frozen=True)
class ProbeResult:
    """What a run found.  `verdict`, `rate`, `upper_bound` and `judged` are what a canary
    gate reads; `report()` (see `report.build_report`) is the versioned JSON."""

    settings: ProbeSettings
    model: str
    verdict: Verdict
    reasons: tuple[str, ...]
    tally: Tally
    not_applicable: dict[ProbeName, str]
    applicable: tuple[ProbeName, ...]
    peak_concurrency: int
    mean_concurrency: float
    started_at: datetime
    finished_at: datetime
    duration_s: float
    kv_canary: KvCanaryReading | None = None
    """The engines' kv-canary violations during the run; None: not asked for."""
    host_tier: HostTierReading | None = None
    """What the engines read from their host tier during the run; None: HiCache off."""

    @property
    def judged(self) -> int:
        return self.tally.judged

    @property
    def corrupt(self) -> int:
        return self.tally.corrupt

    @property
    def failed(self) -> int:
        return self.tally.failed

    @property
    def rate(self) -> float:
        """Failures (corrupt answers and failed requests) per judged sample."""
        return self.tally.failed / self.tally.judged if self.tally.judged else 0.0

    @property
    def upper_bound(self) -> float:
        return self.tally.upper_bound

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


@dataclass(frozen=True)
class KvCanaryReading:
    """What the engines' kv-canary counted between the probe's two reads of it."""

    violations: tuple[kv_canary.Violations, ...] = ()
    unread: str | None = None
    """Why the violations are not known (a read failed, or a page could not vouch for
    them: `kv_canary.unread`)."""

    @classmethod
    def of(
        cls, before: evidence.EngineReading | str, after: evidence.EngineReading | str
    ) -> KvCanaryReading:
        for read in (before, after):
            if isinstance(read, str):
                return cls(unread=read)
            if read.kv_unread is not None:
                return cls(unread=read.kv_unread)
        assert not isinstance(before, str) and not isinstance(after, str)
        return cls(violations=kv_canary.new_violations(before.kv_counts, after.kv_counts))


@dataclass(frozen=True)
class HostTierReading:
    """What the engines read back from their host tier during the run (`evidence`)."""

    host_tokens: int | None = None
    """Host-tier prompt tokens the prefix-matching engines counted; None: not read."""
    unread: str | None = None
    pool: evidence.PoolSizes | None = None
    prefix_groups: int | None = None
    """The shared prefixes the probe cycled through (sized from ``pool``)."""

    @classmethod
    def of(
        cls,
        before: evidence.EngineReading | str,
        after: evidence.EngineReading | str,
        prefix_groups: int | None,
    ) -> HostTierReading:
        for read in (before, after):
            if isinstance(read, str):
                return cls(unread=read, prefix_groups=prefix_groups)
        assert not isinstance(before, str) and not isinstance(after, str)
        if not after.host_tokens:
            why = f"no prefix-matching engine's page counts {evidence.CACHED_TOKENS}"
            return cls(unread=why, pool=after.pool, prefix_groups=prefix_groups)
        read = evidence.host_tokens_read(before, after)
        return cls(host_tokens=read, pool=after.pool, prefix_groups=prefix_groups)


async def _engine_reading(client: EngineClient) -> evidence.EngineReading | str:
    """The engines' counts through the router, or why they could not be read."""
    try:
        return evidence.read(await client.engine_metrics())
    except TransportError as err:
        return str(err)


ProgressFn = Callable[[Tally], None]


async def run_probes(settings: ProbeSettings, progress: ProgressFn | None = None) -> ProbeResult:
    """Probe `settings.base_url`; raises ProbeConnectionError when it cannot even start."""
    started_at, t0 = datetime.now(UTC), time.monotonic()
    # A differential sample asks the canary and the baseline at once: a connection each.
    sides = 1 if settings.baseline_url is None else 2
    connector = aiohttp.TCPConnector(limit=sides * settings.concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        client = EngineClient(
            settings.base_url,
            session,
            settings.request_timeout_s,
            settings.connect_timeout_s,
            settings.api_key,
        )
        model = await _warm_up(client, settings)
        counted = settings.kv_canary or settings.hicache
        first = await _engine_reading(client) if counted else None
        probe_set = settings.probe_set(await _reference_model(client, settings))
        groups = None
        if settings.hicache and not isinstance(first, (str, type(None))):
            groups = await _prefix_groups(client, settings, model, first.pool, len(probe_set))
        # Read after the working set's measure: every request from here on is a sample's.
        before = await _engine_reading(client) if counted else None
        not_applicable, host_round_trip, baseline = await _preflight(
            client, session, settings, probe_set
        )
        applicable = tuple(p for p in probe_set if p not in not_applicable)
        client.meter.reset()
        ctx = ProbeContext(client, settings, model, host_round_trip, baseline, groups)
        tally = Tally(settings, settings.sample_budget)
        if baseline is not None and settings.baseline_url is not None:
            tally.differential = DifferentialTally(settings.baseline_url)
        if applicable:
            await _drive(ctx, applicable, tally, progress)
        meter = client.meter
        after = await _engine_reading(client) if counted else None
    kv = host = None
    if before is not None and after is not None:
        kv = KvCanaryReading.of(before, after) if settings.kv_canary else None
        host = HostTierReading.of(before, after, groups) if settings.hicache else None
    if host is not None and host.host_tokens is not None:
        tally.exercised = evidence.proven_exercised(
            host.host_tokens, tally.judged_prompts, tally.unjudged_tokens
        )
    found = Evidence(
        judged=tally.judged,
        corrupt=tally.corrupt,
        transport_errors=tally.transport_errors,
        fail_at=tally.fail_at,
        peak_concurrency=meter.peak,
        target_concurrency=settings.concurrency,
        threshold=settings.max_corruption_rate,
        confidence=settings.confidence,
        applicable_probes=len(applicable),
        hicache=settings.hicache,
        exercised=tally.exercised,
        kv_canary=kv.violations if kv else (),
        kv_canary_unread=kv.unread if kv else None,
        host_tier_unread=host.unread if host else None,
        divergence=tally.differential.evidence(settings.max_divergence_excess)
        if tally.differential is not None
        else None,
    )
    verdict, reasons = decide(found)
    return ProbeResult(
        settings=settings,
        model=model,
        verdict=verdict,
        reasons=reasons,
        tally=tally,
        not_applicable=not_applicable,
        applicable=applicable,
        peak_concurrency=meter.peak,
        mean_concurrency=meter.mean,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        duration_s=time.monotonic() - t0,
        kv_canary=kv,
        host_tier=host,
    )


def probe(settings: ProbeSettings, progress: ProgressFn | None = None) -> ProbeResult:
    """Blocking form of `run_probes`, for callers without an event loop."""
    return asyncio.run(run_probes(settings, progress))


async def _drive(
    ctx: ProbeContext, applicable: tuple[ProbeName, ...], tally: Tally, progress: ProgressFn | None
) -> None:
    next_index = 0
    limit = ctx.settings.max_duration_s
    deadline = None if limit is None else time.monotonic() + limit

    async def worker() -> None:
        nonlocal next_index
        # Every sample started is judged: a failed request is a failure, never re-issued.
        while tally.stopped_because is None and next_index < tally.budget:
            if deadline is not None and time.monotonic() > deadline:
                tally.stop(f"time limit of {limit:g} s reached")
                break
            index, next_index = next_index, next_index + 1
            use, probe = divmod(index, len(applicable))
            sample = await run_sample(applicable[probe], index, ctx, use)
            tally.add(sample)
            if progress is not None:
                progress(tally)

    workers = [asyncio.create_task(worker()) for _ in range(ctx.settings.concurrency)]
    await asyncio.gather(*workers)


async def _prefix_groups(
    client: EngineClient,
    settings: ProbeSettings,
    model: str,
    pool: evidence.PoolSizes | None,
    probes: int,
) -> int | None:
    """How many shared prefixes the prefix-reuse probes cycle through so that between two
    turns of one the samples send about `PoolSizes.working_set` prompt tokens: by then it
    has left the device pool and is still on the host tier, and comes back from there.
    The samples take the ``probes`` of the set in turn, each prompt about a prefix long, so
    one round of them sends about ``probes`` prefixes' worth; one request (a prefix and a
    one-token answer) measures a prefix in the engine's tokens.  None (the default groups)
    when the engines report no pool, or it cannot be measured."""
    if pool is None:
        return None
    ctx = ProbeContext(client, settings, model)
    body = ctx.body([{"role": "system", "content": ctx.shared_prefix(0)},
                     {"role": "user", "content": "Reply with OK."}], 1, tools=False)  # fmt: skip
    try:
        tokens = (await client.chat(body)).prompt_tokens
    except TransportError:
        return None
    if not tokens:
        return None
    return max(ctx.groups, math.ceil(pool.working_set / (tokens * probes)))


# Pauses between warm-up tries: the first, and the longest (doubling in between).
WARM_UP_PAUSE_S = (0.5, 5.0)


async def _warm_up(client: EngineClient, settings: ProbeSettings) -> str:
    """The model to ask for, once the engine has answered one chat request (not judged).

    Kubernetes calls a canary Ready before its router necessarily routes (a worker not yet
    discovered, a connection refused for a moment): until that first answer a failed
    request means "not ready yet", not a failure of the flags, and is tried again for up to
    `warm_up_s`; an engine that never answers is a `ProbeConnectionError` (no evidence).
    After it, every failed request counts against the canary (`Tally`)."""
    deadline = time.monotonic() + settings.warm_up_s
    pause, longest = WARM_UP_PAUSE_S
    while True:
        try:
            model = await _model(client, settings)
            await client.chat(
                {
                    "model": model,
                    "messages": [{"role": "user", "content": "Reply with OK."}],
                    "max_tokens": 1,
                    "temperature": 0,
                    "stream": False,
                }
            )
            return model
        except TransportError as err:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeConnectionError(
                    f"{settings.base_url} did not answer a warm-up request within "
                    f"{settings.warm_up_s:g} s: {err}"
                ) from None
            await asyncio.sleep(min(pause, left))
            pause = min(2 * pause, longest)


async def _model(client: EngineClient, settings: ProbeSettings) -> str:
    """The model to ask for; a TransportError when the engine does not answer (yet)."""
    try:
        models = await client.models()
    except EndpointMissing:
        # Reachable but without a model list: the request's model field is then a label.
        return settings.model or "default"
    if settings.model is not None:
        return settings.model
    if not models:
        raise ProbeConnectionError(f"{settings.base_url}/v1/models lists no model; pass --model")
    return models[0]


async def _reference_model(
    client: EngineClient, settings: ProbeSettings
) -> ReferenceModelKind | None:
    """Which model a reference engine serves, when the default probe set depends on it: as
    told (`ProbeSettings.reference_model`), else as its GET /server_info says."""
    if settings.probes or settings.backend is not Backend.REFERENCE:
        return None
    if settings.reference_model is not None:
        return settings.reference_model
    try:
        served = (await client.server_info()).get("reference_model")
    except TransportError:
        return None  # the default set for the backend; the determinism check says why
    try:
        return ReferenceModelKind(served)
    except ValueError:
        return None


async def _preflight(
    client: EngineClient,
    session: aiohttp.ClientSession,
    settings: ProbeSettings,
    probe_set: tuple[ProbeName, ...],
) -> tuple[dict[ProbeName, str], bool, Baseline | None]:
    """(checks that cannot judge this engine, each with why — reported, never counted;
    whether the engine can push cached prefixes to its host tier; the baseline that makes
    consistency differential on an engine that is not deterministic, or None)."""
    offload_problem = None
    if settings.offload_path is not None:
        try:
            await client.offload(settings.offload_path)
        except EndpointMissing:
            offload_problem = f"engine has no POST {settings.offload_path} (host-tier offload)"
        except TransportError as err:
            offload_problem = f"host-tier offload failed: {err}"
    host_round_trip = settings.offload_path is not None and offload_problem is None
    consistency = [p for p in probe_set if p.needs_determinism]
    if not consistency:
        return {}, host_round_trip, None
    if settings.offload_path is not None and offload_problem is not None:
        return dict.fromkeys(consistency, offload_problem), host_round_trip, None
    reason = await _determinism_problem(client, settings)
    if reason is None:
        return {}, host_round_trip, None
    if settings.baseline_url is None:
        reason += "; --baseline-url (the stable side) makes the check differential"
        return dict.fromkeys(consistency, reason), host_round_trip, None
    baseline = await _baseline(session, settings)
    if isinstance(baseline, str):
        return dict.fromkeys(consistency, baseline), host_round_trip, None
    return {}, host_round_trip, baseline


async def _baseline(session: aiohttp.ClientSession, settings: ProbeSettings) -> Baseline | str:
    """The baseline, warmed up like the canary, with its own host-tier push if it serves
    one; or why it cannot be one (then consistency does not apply, and says why)."""
    assert settings.baseline_url is not None
    client = EngineClient(
        settings.baseline_url,
        session,
        settings.request_timeout_s,
        settings.connect_timeout_s,
        settings.api_key,
    )
    try:
        model = await _warm_up(
            client, settings.model_copy(update={"base_url": settings.baseline_url})
        )
    except ProbeConnectionError as err:
        return f"baseline not answering: {err}"
    path = settings.offload_path
    if path is not None:
        try:
            await client.offload(path)
        except EndpointMissing:
            path = None  # a stable without HiCache: its warm answer is a device-cache hit
        except TransportError as err:
            return f"baseline host-tier offload failed: {err}"
    return Baseline(client, model, path)


async def _determinism_problem(client: EngineClient, settings: ProbeSettings) -> str | None:
    if settings.deterministic is Determinism.YES:
        return None
    if settings.deterministic is Determinism.NO:
        return "engine declared non-deterministic (--deterministic no)"
    try:
        info = await client.server_info()
    except TransportError as err:
        return f"cannot tell whether the engine is deterministic ({err}); pass --deterministic"
    if info.get("deterministic") is True or _nested_flag(info, "enable_deterministic_inference"):
        return None
    return "engine is not deterministic (GET /server_info: no deterministic / enable_deterministic_inference)"


def _nested_flag(value: object, key: str, depth: int = 4) -> bool:
    """True when `key` is set to true anywhere in `value`: SGLang's /server_info serializes
    its server args with nested records expanded (0.5.23 reads this flag as
    `exec.deterministic.enable_deterministic_inference`), older versions flat."""
    if depth < 0:
        return False
    if isinstance(value, dict):
        if value.get(key) is True:
            return True
        return any(_nested_flag(v, key, depth - 1) for v in value.values())
    if isinstance(value, list):
        return any(_nested_flag(v, key, depth - 1) for v in value)
    return False
