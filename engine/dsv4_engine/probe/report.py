"""The versioned JSON report of a probe run, and its plain-text summary.

The report is data first: the HTML page and the summary table are both rendered from the
JSON alone, so a report saved by the canary can be re-rendered later.  The schema lives in
`report_schema.json`; bump REPORT_SCHEMA_VERSION with any incompatible change.
"""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.probes import EXCERPT_CHARS
from dsv4_engine.probe.runner import DifferentialTally, KvCanaryReading, ProbeResult, Tally
from dsv4_engine.probe.stats import fail_boundary_lower, percents, upper_bound
from dsv4_engine.probe.verdict import exercised_needed

# 2: failed requests count as failures (`samples.failed`); 3: `samples.exercised`, with
# `settings.hicache` saying whether the verdict asked for it; 4: `samples.streamed`;
# 5: `differential` and the DIVERGED outcome; 6: `host_tier`, and `samples.exercised`
# counts judged answers proven by the engines' own host-tier count
REPORT_SCHEMA_VERSION = 6
EXAMPLES_PER_CLASS = 3
SERIES_POINTS = 400
LATENCY_BINS = 30


def report_schema() -> dict[str, Any]:
    text = resources.files("dsv4_engine.probe").joinpath("report_schema.json").read_text()
    return json.loads(text)


def _percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: an actual observed latency, never an interpolation."""
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def _latency(latencies: list[float]) -> dict[str, Any]:
    if not latencies:
        return {"count": 0, "histogram": []}
    values = sorted(latencies)
    lo, hi = values[0], values[-1]
    width = (hi - lo) / LATENCY_BINS or 1e-9
    counts = [0] * LATENCY_BINS
    for v in values:
        counts[min(LATENCY_BINS - 1, int((v - lo) / width))] += 1
    return {
        "count": len(values),
        "mean_ms": 1000 * sum(values) / len(values),
        **{f"p{q}_ms": 1000 * _percentile(values, q) for q in (50, 90, 99)},
        "max_ms": 1000 * hi,
        "histogram": [
            {"from_ms": 1000 * (lo + i * width), "to_ms": 1000 * (lo + (i + 1) * width), "count": c}
            for i, c in enumerate(counts)
        ],
    }


def _series(flags: list[bool], confidence: float) -> list[dict[str, float]]:
    """The running failure rate with its bounds at up to SERIES_POINTS judged-sample counts."""
    step = max(1, -(-len(flags) // SERIES_POINTS))
    points, failed = [], 0
    for n, bad in enumerate(flags, start=1):
        failed += bad
        if n % step == 0 or n == len(flags):
            points.append(
                {
                    "n": n,
                    "failed": failed,
                    "rate": failed / n,
                    "upper": upper_bound(failed, n, confidence),
                    "fail_lower": fail_boundary_lower(failed, n, confidence),
                }
            )
    return points


def build_report(result: ProbeResult) -> dict[str, Any]:
    tally, s = result.tally, result.settings
    counts = {o.value: 0 for o in Outcome if o is not Outcome.NOT_APPLICABLE}
    examples: dict[str, list[dict[str, Any]]] = {}
    per_probe: dict[str, dict[str, int]] = {p.value: {} for p in result.applicable}
    for sample in tally.samples:
        counts[sample.outcome.value] += 1
        probe_counts = per_probe[sample.probe.value]
        probe_counts[sample.outcome.value] = probe_counts.get(sample.outcome.value, 0) + 1
        if sample.outcome is not Outcome.VALID:
            shown = examples.setdefault(sample.outcome.value, [])
            if len(shown) < EXAMPLES_PER_CLASS:
                shown.append(
                    {
                        "sample": sample.index,
                        "probe": sample.probe.value,
                        "detail": sample.detail[:EXCERPT_CHARS],
                        "excerpt": sample.excerpt[:EXCERPT_CHARS],
                        "expected": sample.expected[:EXCERPT_CHARS],
                    }
                )
    latencies = [x.latency_s for x in tally.samples if x.latency_s is not None]
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": "dsv4-probe-report",
        "settings": s.model_dump(mode="json", exclude={"api_key"}),
        "model": result.model,
        "started_at": result.started_at.isoformat(),
        "finished_at": result.finished_at.isoformat(),
        "duration_s": result.duration_s,
        "verdict": result.verdict.value,
        "reasons": list(result.reasons),
        "threshold": s.max_corruption_rate,
        "confidence": s.confidence,
        "samples": {
            "budget": tally.budget,
            "attempted": len(tally.samples),
            "judged": tally.judged,
            "corrupt": tally.corrupt,
            "transport_errors": tally.transport_errors,
            "failed": tally.failed,
            "exercised": tally.exercised,
            "streamed": tally.streamed,
            "fail_at": tally.fail_at,
            "stopped_because": tally.stopped_because,
        },
        "rate": result.rate,
        "upper_bound": result.upper_bound,
        "counts": counts,
        "probes": {
            "applicable": per_probe,
            "not_applicable": {p.value: why for p, why in result.not_applicable.items()},
        },
        "examples": examples,
        "concurrency": {
            "target": s.concurrency,
            "peak": result.peak_concurrency,
            "mean": result.mean_concurrency,
        },
        "latency": _latency(latencies),
        "series": _series(tally.failure_flags, s.confidence),
        "kv_canary": _kv_canary(result.kv_canary),
        "host_tier": _host_tier(result, tally),
        "differential": _differential(tally.differential, s.max_divergence_excess, s.confidence),
    }


def _host_tier(result: ProbeResult, tally: Tally) -> dict[str, Any] | None:
    reading = result.host_tier
    if reading is None:
        return None
    pool = reading.pool
    return {
        "host_tokens": reading.host_tokens,
        "unread": reading.unread,
        "device_pool_tokens": pool.device if pool else None,
        "host_pool_tokens": pool.host if pool else None,
        "prefix_groups": reading.prefix_groups,
        "judged_requests": len(tally.judged_prompts),
        "judged_prompt_tokens": sum(tally.judged_prompts),
        "unjudged_prompt_tokens": tally.unjudged_tokens,
        "seconds_per_sample": result.duration_s / max(1, len(tally.samples)),
    }


def _differential(
    tally: DifferentialTally | None, margin: float, confidence: float
) -> dict[str, Any] | None:
    if tally is None:
        return None
    lower, upper = tally.evidence(margin).bounds(confidence)
    return {
        "baseline_url": tally.baseline_url,
        "margin": margin,
        "canary": _side(tally.n_canary, tally.canary, tally.canary_errors),
        "stable": _side(tally.n_stable, tally.stable, tally.stable_errors),
        "excess_lower": lower,
        "excess_upper": upper,
        "fail_at": tally.fail_at,
    }


def _side(samples: int, diverged: int, errors: int) -> dict[str, Any]:
    return {
        "samples": samples,
        "diverged": diverged,
        "errors": errors,
        "rate": diverged / samples if samples else 0.0,
    }


def _kv_canary(reading: KvCanaryReading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {
        "violations": [dataclasses.asdict(v) for v in reading.violations],
        "unread": reading.unread,
    }


def summary_table(report: dict[str, Any]) -> str:
    """What a person reads at the end of `dsv4ctl probe`."""
    smp, conc, lat = report["samples"], report["concurrency"], report["latency"]
    rows = [
        ("verdict", report["verdict"]),
        ("model", report["model"]),
        (
            "judged samples",
            f"{smp['judged']} (of {smp['attempted']} attempted, budget {smp['budget']})",
        ),
        ("corrupt", str(smp["corrupt"])),
        ("failed requests", f"{smp['transport_errors']} (no answer to judge; each a failure)"),
        ("failed", f"{smp['failed']}  rate {report['rate']:.3%}"),
        (
            "exercised/judged/clean",
            # A report of schema 2 or older did not count exercised samples: "-".
            f"{smp.get('exercised', '-')} / {smp['judged']} / {report['counts'][Outcome.VALID.value]}",
        ),
        ("host-tier reads", _host_tier_rule(report)),
        *_host_tier_rows(report.get("host_tier")),
        (
            "streamed/whole",
            # A report of schema 3 or older did not stream any sample: "-".
            f"{smp.get('streamed', '-')} / "
            + (str(smp["judged"] - smp["streamed"]) if "streamed" in smp else "-"),
        ),
        (
            f"upper bound ({report['confidence']:.0%})",
            "{}  threshold {}".format(*percents(report["upper_bound"], report["threshold"])),
        ),
        ("concurrency", f"peak {conc['peak']}, mean {conc['mean']:.1f}, target {conc['target']}"),
        ("kv-canary", _kv_canary_row(report.get("kv_canary"))),
    ]
    if (diff := report.get("differential")) is not None:
        rows.append(("differential", _differential_row(diff, report["confidence"])))
    if lat["count"]:
        rows.append(
            (
                "latency",
                f"p50 {lat['p50_ms']:.0f} ms, p90 {lat['p90_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms",
            )
        )
    rows += [(f"  {name}", str(n)) for name, n in report["counts"].items() if n]
    rows += [(f"  n/a {name}", why) for name, why in report["probes"]["not_applicable"].items()]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"- {reason}" for reason in report["reasons"]]
    return "\n".join(lines + _example_lines(report["examples"]))


def _differential_row(diff: dict[str, Any], confidence: float) -> str:
    c, s = diff["canary"], diff["stable"]
    return (
        f"warm != cold: canary {c['diverged']}/{c['samples']} ({c['rate']:.1%}), stable "
        f"{s['diverged']}/{s['samples']} ({s['rate']:.1%}); excess {diff['excess_lower']:+.1%} "
        f"to {diff['excess_upper']:+.1%} at {confidence:.0%}, margin {diff['margin']:.1%}"
    )


def _kv_canary_row(kv: dict[str, Any] | None) -> str:
    if kv is None:
        return "not read (not asked for: the engines run no kv-canary)"
    if kv["unread"] is not None:
        return f"not read: {kv['unread']}"
    found = sum(v["count"] for v in kv["violations"])
    return f"{found} violations during the run" + (" (each FAILs it)" if found else "")


def _host_tier_rule(report: dict[str, Any]) -> str:
    """What the exercised count means for this run's verdict (`verdict.unexercised`)."""
    if not report["settings"].get("hicache", False):
        return "not applicable: HiCache off, no exercised sample required"
    needed = exercised_needed(report["confidence"])
    return (
        f"{needed} exercised answers required to PASS (judged answers proven, by the engines' "
        "own count of prompt tokens read back from the host tier, to have read from it)"
    )


def _host_tier_rows(host: dict[str, Any] | None) -> list[tuple[str, str]]:
    """What the engines counted and the prompt sizes the bound rests on."""
    if host is None:
        return []
    if host["unread"] is not None:
        read = f"not read: {host['unread']}"
    else:
        read = f"{host['host_tokens']} prompt tokens read back by the engines"
    pool = host["device_pool_tokens"]
    sized = (
        f"device pool {pool}, host tier {host['host_pool_tokens']} tokens; "
        f"{host['prefix_groups'] or 'default'} prefix groups"
        if pool is not None
        else "pool not reported; default prefix groups"
    )
    requests = host["judged_requests"]
    prompts = (
        f"{host['judged_prompt_tokens']} in {requests} judged requests "
        f"({host['judged_prompt_tokens'] // max(1, requests)} each), "
        f"{host['unjudged_prompt_tokens']} unjudged; {host['seconds_per_sample']:.2f} s a sample"
    )
    return [("  host tier", read), ("  sized", sized), ("  prompt tokens", prompts)]


SUMMARY_EXAMPLES = 3
_SHOWN_CHARS = 240


def _example_lines(examples: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A few damaged answers, each under the clean answer it should have been (classes in
    turn, so each class shows once before any shows twice), as escaped one-line strings."""
    order = [
        (cls, shown[depth])
        for depth in range(EXAMPLES_PER_CLASS)
        for cls, shown in examples.items()
        if len(shown) > depth
    ]
    lines = []
    for cls, e in order[:SUMMARY_EXAMPLES]:
        lines += [
            f"example {cls} (sample {e['sample']}, {e['probe']}): {e['detail']}",
            f"  expected  {json.dumps(e.get('expected', ''), ensure_ascii=False)[:_SHOWN_CHARS]}",
            f"  answered  {json.dumps(e['excerpt'], ensure_ascii=False)[:_SHOWN_CHARS]}",
        ]
    return lines
