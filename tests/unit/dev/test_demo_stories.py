"""`make demo` and `make demo-incident` tell the story on the samples the README names, each
applied unchanged: the quick one on the random-weights model with every host-tier load
raced, the incident on the echo model with the race aimed at a share of loads."""

from __future__ import annotations

import re
from pathlib import Path

from dsv4_dev.demo import STORIES, how_promoted
from dsv4_operator.api.samples import shipped_sample

ROOT = Path(__file__).resolve().parents[3]


def test_each_make_target_runs_its_story():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t\$\(PY\) -m dsv4_dev\.demo\n", makefile, re.M)
    assert re.search(
        r"^demo-incident:.*\n\t\$\(PY\) -m dsv4_dev\.demo --story incident\n", makefile, re.M
    )


def test_the_stories_run_the_models_the_readme_names():
    models = {
        name: shipped_sample(story.sample)["spec"]["model"].get("referenceModel", "random")
        for name, story in STORIES.items()
    }
    assert models == {"quick": "random", "incident": "echo"}
    readme = (ROOT / "README.md").read_text()
    assert (
        "`make demo` plays the whole story on\n`manifests/samples/flash-reference.yaml`" in readme
    )
    assert (
        "`make demo-incident` tells the incident's own story on\n`manifests/samples/flash-echo.yaml`"
        in readme
    )


def test_only_the_incident_aims_the_race_at_a_share():
    assert STORIES["quick"].share is None  # every load races: the FAIL comes fast
    assert 0 < STORIES["incident"].share < 1


def test_the_demo_says_how_the_flags_were_promoted_as_the_status_records_it():
    """The demo's flags (bf16 index-K after fp8) change the transfer format: it must not claim
    a role-by-role promotion the operator never made."""
    paired = {"phase": "Idle", "verdict": "PASS", "transfer": "incompatible", "slot": "green"}
    assert how_promoted(paired).startswith("promoted in prefill+decode pairs")
    assert "slot green" in how_promoted(paired)
    assert how_promoted({**paired, "transfer": "compatible"}) == "promoted role by role"
