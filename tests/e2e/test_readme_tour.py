"""The README's tour, run as written: the README cannot drift from what works.

The tour's bash blocks run in order in one shell (`set -euo pipefail`: a failing command
fails the test), in a scratch folder that sees the checkout's manifests, with the cluster
in a private cache folder (the control-plane and LWS binaries are the developer's).  Two
substitutions, both said in the README: `$(hack/venv.sh)` is the venv running this test,
and a watch (`kubectl get ... -w`) ends once its row has shown the states its comment names,
in order (`tour_watch.py`, bounded).  Everything it started is stopped even when it fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4_dev.cluster.binaries import bin_dir, lws_dir
from dsv4_dev.cluster.local import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
TOUR = "## A tour: one canary passes, one fails"
WATCH = ROOT / "tests" / "e2e" / "tour_watch.py"
# Two canaries at the shipped defaults (598 samples each) on CPU reference engines: minutes
# each, longer than the suite's per-test default on a busy machine.
TOUR_TIMEOUT_S = 40 * 60


def tour_blocks(readme: str) -> list[str]:
    """The bash blocks of the tour section, in order."""
    section = readme.split(TOUR, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [
        line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def substituted(command: str, venv: Path) -> str:
    command = command.replace("$(hack/venv.sh)", shlex.quote(str(venv)))
    code, _, comment = command.partition("#")
    if " -w" not in f"{code} ":
        return command
    chain = re.search(r"\w+(?:\s*→\s*\w+)+", comment)
    assert chain, f"a README watch must name the states it waits for: {command!r}"
    states = [s.strip() for s in chain.group(0).split("→")]
    return shlex.join([sys.executable, str(WATCH), *states, "--", *shlex.split(code)])


@pytest.mark.timeout(TOUR_TIMEOUT_S + 300)
def test_every_readme_tour_block_runs(tmp_path: Path) -> None:
    blocks = tour_blocks((ROOT / "README.md").read_text())
    assert blocks, "README has no tour"
    venv = Path(sys.executable).parent.parent
    script = "\n".join(
        ["set -euo pipefail", "PS4='+ [$EPOCHREALTIME] '", "set -x"]
        + [substituted(c, venv) for b in blocks for c in commands(b)]
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "manifests").symlink_to(ROOT / "manifests")
    cache = tmp_path / "cache"
    env = {
        **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        "DSV4_CACHE_DIR": str(cache),
        "DSV4_BIN_DIR": str(bin_dir().resolve()),
        "DSV4_LWS_DIR": str(lws_dir().resolve()),
    }
    log = tmp_path / "tour.log"
    cluster = LocalCluster(workdir=cache / "kwok")
    started = time.monotonic()
    with log.open("w") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the operator started with `&` is in its group
        )
    try:
        code = shell.wait(TOUR_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        _stop_group(shell.pid)
        down = [str(venv / "bin" / "dsv4ctl"), "cluster", "down"]
        subprocess.run(down, env=env, capture_output=True, timeout=120, check=False)
    text = log.read_text()
    print(f"README tour: {time.monotonic() - started:.0f}s\n{_timeline(text)}")
    assert code == 0, f"the tour failed (exit {code}); its log ends:\n{text[-6000:]}"

    assert "service/flash-router.default:" in text, "cluster status lists no router endpoint"
    assert "pod/flash-decode-0.default" in text, "cluster status lists no engine pod"
    assert re.search(r"^verdict\s+PASS$", text, re.M)
    assert re.search(r"^judged samples\s+598\b", text, re.M), "the PASS judged 598 samples"
    assert re.search(r"\btrue\s+bf16\s+Idle\b", text), "the watch never showed the flags promoted"
    assert "PASS" in (work / "flash-report.html").read_text()
    assert re.search(r"^verdict\s+FAIL$", text, re.M), "the fault-injected canary did not FAIL"
    assert re.search(r"^rejected revision\s+\S+$", text, re.M), "the faulty flags not rejected"
    assert re.search(r"\btrue\s+bf16\s+RolledBack\b", text), "production lost step 5's flags"
    # Both verdicts came from probe Jobs the Job controller ended: a PASS completes its Job,
    # a FAIL (exit 1) fails it.
    assert re.search(r"^flash-canary-\S+\s+Complete\s", text, re.M), "no probe Job Complete"
    assert re.search(r"^flash-canary-\S+\s+Failed\s", text, re.M), "no probe Job Failed"
    assert re.search(r"^monitoring: Prometheus at http://127\.0\.0\.1:\d+ ", text, re.M)
    # The local Prometheus (`--monitoring`) with the shipped rules: the PASS raised nothing,
    # the FAIL fired DSV4CanaryFailed for this deployment, and nothing else.
    after_pass, after_fail = _outputs(text, "dsv4ctl cluster alerts")
    assert after_pass == ["no alert pending or firing"], after_pass
    assert [line.split()[:2] for line in after_fail] == [["DSV4CanaryFailed", "firing"]], after_fail
    assert {"name=flash", "namespace=default", "verdict=FAIL"} <= set(after_fail[0].split())
    answer = text.index("\n", text.rindex("curl -s")) + 1  # curl's output follows its trace
    completion, _ = json.JSONDecoder().raw_decode(text, answer)
    assert completion["choices"][0]["text"], completion
    assert not cluster.leftover_pids(), "`dsv4ctl cluster down` left processes behind"


def _stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def _outputs(log: str, command: str) -> list[list[str]]:
    """The output lines of each run of ``command``, from bash's trace to the next trace (a
    command's, `+`, or a command substitution's, `++`)."""
    runs = re.findall(rf"^\+ \[[\d.]+\] {re.escape(command)}\n(.*?)(?=^\++ \[)", log, re.M | re.S)
    return [run.splitlines() for run in runs]


def _timeline(log: str) -> str:
    """Each command of the tour with the seconds it took (from bash's trace)."""
    marks = [(float(t), cmd) for t, cmd in re.findall(r"^\+ \[(\d+\.\d+)\] (.*)$", log, re.M)]
    rows = [
        f"{later - at:7.1f}s  {cmd[:110]}"
        for (at, cmd), (later, _) in zip(marks, marks[1:], strict=False)
    ]
    return "\n".join(rows)
