"""Which slots the stable engines occupy, with which flags and how many replicas: a pure
function of the rollout status, read by the reconciler (what to render) and by `decide`
(when a step of a paired promotion is done).

Passed flags are promoted in **pairs** (`spec.rollout.promotion: Surge`, the default, and
always for a change of the prefill→decode transfer format): the new flags grow in the other
slot one prefill + one decode replica at a time (GROW), each slot's router pairs only its
own slot's engines, and the old slot gives a pair back once the new one serves (SHRINK),
keeping one of each until the last step; before it gives up its last pair its router leaves
(RETIRE), so it never routes to a half-empty slot.  Capacity never drops below the spec's:
a new pair serves before an old one goes, at the cost of at most one extra prefill and one
extra decode replica at a time.  `InPlace` (asked for, same format only) rolls role by
role in the one active slot instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import (
    EngineRevision,
    PairStage,
    RolloutPhase,
    RolloutStatus,
    Slot,
)


@dataclass(frozen=True)
class Pairs:
    """The spec's replica counts, which a paired promotion moves one pair at a time."""

    prefill: int
    decode: int

    @property
    def steps(self) -> int:
        """Pairs to move: a step moves one prefill and one decode replica (while any)."""
        return max(self.prefill, self.decode)

    def moved(self, k: int) -> tuple[int, int]:
        """(prefill, decode) replicas in the new slot after k steps."""
        return min(k, self.prefill), min(k, self.decode)

    def left(self, k: int) -> tuple[int, int]:
        """(prefill, decode) replicas left in the old slot after k steps.  It keeps one of
        each until the last step, so it serves until the new slot holds everything: with
        unequal counts, giving up its last prefill early would strand its decodes."""
        if k >= self.steps:
            return 0, 0
        return max(self.prefill - k, 1), max(self.decode - k, 1)


def serves(replicas: tuple[int, int]) -> bool:
    """A slot can answer requests only with at least one prefill and one decode."""
    return replicas[0] > 0 and replicas[1] > 0


@dataclass(frozen=True)
class SlotPlan:
    slot: Slot
    flags: dict[Role, EngineRevision]  # per role: a role-by-role promotion runs both in one slot
    prefill: int
    decode: int
    router: bool

    @property
    def replicas(self) -> tuple[int, int]:
        return self.prefill, self.decode


def paired(status: RolloutStatus) -> bool:
    """A paired promotion is under way: its stage is recorded from its start to its end (a
    role-by-role one has none)."""
    return status.phase is RolloutPhase.PROMOTING and status.pair_stage is not None


def plan_slots(status: RolloutStatus, pairs: Pairs) -> list[SlotPlan]:
    """The stable slots as ``status`` wants them, the active one first."""
    stable = dict.fromkeys(Role, status.stable)
    full = (pairs.prefill, pairs.decode)
    if paired(status):
        assert status.canary is not None and status.pair_stage is not None
        k, stage = max(status.pair_step, 1), status.pair_stage
        old = pairs.left(k if stage is PairStage.SHRINK else k - 1)
        old_router = serves(old) and stage is not PairStage.RETIRE
        new = pairs.moved(k)
        return [
            SlotPlan(status.slot, stable, *old, router=old_router),
            SlotPlan(status.slot.other, dict.fromkeys(Role, status.canary), *new, serves(new)),
        ]
    flags = {role: role_flags(status, role) for role in Role}
    active = SlotPlan(status.slot, flags, *full, router=True)
    if status.retiring is None:
        return [active]
    # A rolled-back paired promotion: the rejected slot stops serving at once and its
    # engines go once its router has (kept at their count until then, not re-scaled).
    assert status.canary is not None
    rejected = dict.fromkeys(Role, status.canary)
    return [active, SlotPlan(status.retiring, rejected, *pairs.moved(status.pair_step), False)]


def role_flags(status: RolloutStatus, role: Role) -> EngineRevision:
    """The flags the active slot's ``role`` runs: during a role-by-role promotion the roles
    already promoted run the new flags; otherwise the stable ones."""
    if status.phase is RolloutPhase.PROMOTING and role in status.promoted_roles:
        assert status.canary is not None
        return status.canary
    return status.stable
