"""Waiting for a CRD keeps polling through the moment its status has no conditions yet (where
`kubectl wait --for=condition=Established` fails at once) and says why when time runs out."""

from __future__ import annotations

import subprocess

from dsv4_dev.cluster.established import established


def answers(*outputs: str):
    """A kubectl that prints ``outputs`` in turn (the last one from then on)."""
    calls: list[tuple[str, ...]] = []

    def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        out = outputs[min(len(calls), len(outputs)) - 1]
        return subprocess.CompletedProcess(args, 0, out, "")

    return kubectl, calls


def test_no_conditions_yet_is_waited_through():
    kubectl, calls = answers("", "False", "True")
    assert established(kubectl, "crd/widgets.example.com", timeout=10) is None
    assert len(calls) == 3 and calls[0][:2] == ("get", "crd/widgets.example.com")


def test_never_established_says_which_crd_after_the_timeout():
    kubectl, _ = answers("False")
    assert established(kubectl, "crd/widgets.example.com", timeout=0.6) == (
        "crd/widgets.example.com not Established within 1s"
    )
