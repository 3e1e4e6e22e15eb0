"""`make demo` tells the incident's story on the sample the README names, applied unchanged:
the echo model, with the race aimed at a share of host-tier loads."""

from __future__ import annotations

import re
from pathlib import Path

from dsv4_dev.demo import SAMPLE, UNGATED_SHARE, how_promoted
from dsv4_operator.api.samples import shipped_sample

ROOT = Path(__file__).resolve().parents[3]


def test_make_demo_runs_the_story():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t\$\(PY\) -m dsv4_dev\.demo\n", makefile, re.M)


def test_the_demo_runs_the_model_the_readme_names():
    assert shipped_sample(SAMPLE)["spec"]["model"]["referenceModel"] == "echo"
    readme = (ROOT / "README.md").read_text()
    assert (
        f"`make demo` tells the incident's\nown story on `manifests/samples/{SAMPLE}.yaml`"
        in readme
    )
    assert f"the\nrace is injected into {UNGATED_SHARE:.0%} of host-tier loads" in readme


def test_the_race_is_aimed_at_host_tier_loads():
    """Every load, or a share: the answers that read from the host tier are a share of all
    (the canary reaches the tier by eviction), which makes the incident's rate."""
    assert 0 < UNGATED_SHARE <= 1


def test_the_demo_says_how_the_flags_were_promoted_as_the_status_records_it():
    """The demo's flags (bf16 index-K after fp8) change the transfer format: it must not claim
    a role-by-role promotion the operator never made."""
    paired = {"phase": "Idle", "verdict": "PASS", "transfer": "incompatible", "slot": "green"}
    assert how_promoted(paired).startswith("promoted in prefill+decode pairs")
    assert "slot green" in how_promoted(paired)
    surged = how_promoted({**paired, "transfer": "compatible", "promotion": "Surge"})
    assert surged.startswith("promoted in prefill+decode pairs (a surge")
    in_place = {**paired, "transfer": "compatible", "promotion": "InPlace", "slot": "blue"}
    assert how_promoted(in_place) == "promoted role by role in place"
