"""The operator's Prometheus metrics: one registry, named once, used by reconcile and rollout.

The alert rules in manifests/monitoring/prometheusrule.yaml are written against these names
(and `promtool test rules` checks them), so a rename here must be made there too.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dsv4_operator.api.rollout import RolloutPhase, RolloutVerdict, WatchVerdict

REGISTRY = CollectorRegistry(auto_describe=True)
_OBJ = ("namespace", "name")

RECONCILES = Counter(
    "dsv4_operator_reconcile_total",
    "Reconcile passes by result (ok | error).",
    ["result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "dsv4_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
ROLLOUT_PHASE = Gauge(
    "dsv4_operator_rollout_phase",
    "1 for the rollout phase each DSV4Deployment is in, 0 for the others.",
    [*_OBJ, "phase"],
    registry=REGISTRY,
)
ROLLOUT_PHASE_SINCE = Gauge(
    "dsv4_operator_rollout_phase_since_timestamp_seconds",
    "Unix time the current rollout phase began (for 'rollout stuck' alerts).",
    _OBJ,
    registry=REGISTRY,
)
CANARY_VERDICTS = Counter(
    "dsv4_operator_canary_verdicts_total",
    "Canary verdicts by outcome (PASS | FAIL | INCONCLUSIVE | ABORTED | MANUAL_PROMOTE | "
    "PROMOTION_TIMEOUT | UNDO | NoCapacity).",
    [*_OBJ, "verdict"],
    registry=REGISTRY,
)
CORRUPTION_RATE = Gauge(
    "dsv4_operator_canary_corruption_rate",
    "Corruption rate measured by the last probe run.",
    [*_OBJ, "target"],
    registry=REGISTRY,
)
CORRUPTION_BOUND = Gauge(
    "dsv4_operator_canary_corruption_upper_bound",
    "Upper confidence bound of the corruption rate of the last probe run.",
    [*_OBJ, "target"],
    registry=REGISTRY,
)
CORRUPTION_BUDGET = Gauge(
    "dsv4_operator_canary_max_corruption_rate",
    "spec.canary.maxCorruptionRate: the budget a verdict holds the upper bound against.",
    _OBJ,
    registry=REGISTRY,
)
ROLLBACKS = Counter(
    "dsv4_operator_rollbacks_total",
    "Rollouts rolled back (canary failed, inconclusive or aborted).",
    _OBJ,
    registry=REGISTRY,
)
PROBE_REQUESTS = Counter(
    "dsv4_operator_probe_requests_total",
    "Probe requests by judged outcome (valid, a corruption class, transport_error, ...).",
    [*_OBJ, "target", "outcome"],
    registry=REGISTRY,
)
STABLE_CORRUPTION = Gauge(
    "dsv4_operator_stable_corruption_detected",
    "1 when the last low-rate probe of the promoted (stable) deployment FAILed.",
    _OBJ,
    registry=REGISTRY,
)
WATCH_RESULT = Gauge(
    "dsv4_operator_stable_watch_result",
    "1 for what the last finished production watch run found (NoCorruptionSeen | Corrupt | "
    "NoEvidence), 0 for the others: a run that judged nothing is not a clean one.",
    [*_OBJ, "result"],
    registry=REGISTRY,
)
PROGRESS_DEADLINE_EXCEEDED = Gauge(
    "dsv4_operator_progress_deadline_exceeded",
    "1 while a DSV4Deployment is Degraded with ProgressDeadlineExceeded: a role made no "
    "progress for spec.progressDeadlineSeconds (the status message says why).",
    _OBJ,
    registry=REGISTRY,
)


def record_progress_deadline(namespace: str, name: str, exceeded: bool) -> None:
    PROGRESS_DEADLINE_EXCEEDED.labels(namespace, name).set(1.0 if exceeded else 0.0)


def record_phase(
    namespace: str, name: str, phase: RolloutPhase, since_unix: float, budget: float
) -> None:
    """The phase of one deployment's rollout and its corruption budget (``budget``,
    spec.canary.maxCorruptionRate), recorded on every pass.  Its verdict and
    rollback counters are exported from its first pass on, at 0: a counter whose series
    is born at its first increment shows Prometheus a first sample of 1, an `increase()` of
    0, and `DSV4CanaryFailed` would never fire for a deployment's first FAIL."""
    for verdict in RolloutVerdict:
        CANARY_VERDICTS.labels(namespace, name, verdict.value)
    ROLLBACKS.labels(namespace, name)
    for candidate in RolloutPhase:
        ROLLOUT_PHASE.labels(namespace, name, candidate.value).set(
            1.0 if candidate is phase else 0.0
        )
    ROLLOUT_PHASE_SINCE.labels(namespace, name).set(since_unix)
    CORRUPTION_BUDGET.labels(namespace, name).set(budget)


def record_watch(namespace: str, name: str, verdict: WatchVerdict | None) -> None:
    """What the last finished watch run found, recorded on every pass from the status (so
    an operator restart exports it again); nothing before a deployment's first run."""
    if verdict is None:
        return
    for result in WatchVerdict:
        WATCH_RESULT.labels(namespace, name, result.value).set(1.0 if result is verdict else 0.0)


NOT_ROLLED_BACK = (
    RolloutVerdict.PASS,
    RolloutVerdict.MANUAL_PROMOTE,
    RolloutVerdict.UNDO,
    RolloutVerdict.NO_CAPACITY,
)


def record_decision(namespace: str, name: str, verdict: RolloutVerdict) -> None:
    """A canary verdict the rollout reached and recorded in the status: from a probe run,
    a canary that never became Ready, or a person's promote or abort.  Every verdict but
    a PASS or a person's promote or undo rolls the canary back, and NoCapacity only gives
    its slice back (its flags are tried again)."""
    CANARY_VERDICTS.labels(namespace, name, verdict.value).inc()
    if verdict not in NOT_ROLLED_BACK:
        ROLLBACKS.labels(namespace, name).inc()


def record_verdict(
    namespace: str,
    name: str,
    target: str,
    verdict: RolloutVerdict,
    rate: float | None,
    bound: float | None,
    outcomes: dict[str, int],
) -> None:
    """One finished probe run's evidence; ``target`` is ``canary`` or ``stable``.  A
    canary run's verdict is counted by :func:`record_decision`, once the rollout has
    acted on it (a run the rollout no longer waits for decides nothing)."""
    if target == "stable":
        STABLE_CORRUPTION.labels(namespace, name).set(
            1.0 if verdict is RolloutVerdict.FAIL else 0.0
        )
    if rate is not None:
        CORRUPTION_RATE.labels(namespace, name, target).set(rate)
    if bound is not None:
        CORRUPTION_BOUND.labels(namespace, name, target).set(bound)
    for outcome, count in outcomes.items():
        PROBE_REQUESTS.labels(namespace, name, target, outcome).inc(count)
