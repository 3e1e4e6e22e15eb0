"""A bad-argument sweep over the command lines: `dsv4ctl plan|probe|validate|render|rollout` and
`dsv4-engine serve|launch`.  Whatever a user types ends with an exit code and — when it is
refused — one line on stderr naming what is wrong; never a traceback.

Property-based, fixed seed (derandomize, no example database): each example takes a
working command line and breaks it — a value replaced by garbage (wrong type, out of range,
empty, huge, unicode), a token dropped, an unknown flag, a known flag repeated with garbage,
a file that is missing, a directory, not UTF-8 or of the wrong shape.  The commands run
in-process on their real code, against nothing that could succeed by accident: the probe's
engine URL refuses connections, the kubeconfig does not exist.  Two effects are replaced,
and only them: `dsv4-engine serve` does not start serving (its `_serve` returns at once, so
a valid command line ends 0) and `dsv4-engine launch` does not replace the test process
(`os.execve` records the call).
"""

from __future__ import annotations

import argparse
import io
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4_engine import cli as engine_cli
from dsv4_engine.commands import launch, serve
from dsv4_engine.engine_config import EngineConfig, dump_engine_yaml
from dsv4_engine.features import Role
from dsv4_engine.probe import runner
from dsv4_engine.probe.settings import ProbeSettings
from dsv4_operator.cli import main as dsv4ctl

pytestmark = pytest.mark.slow

EXAMPLES = 150  # per command
ROOT = Path(__file__).resolve().parents[3]
GARBAGE = [
    "", " ", "-1", "0", "1", "2", "-0.5", "1.5", "1e309", "nan", "inf", "-inf",
    "99999999999999999999", "abc", "-", "--", "ü", "x" * 300, "/", "None", "null",
    "true", "[]", "{}", "0x10", "1_000", "fp16", "v5", "http://", "http://127.0.0.1:1",
]  # fmt: skip


# Exit codes that are verdicts, not errors: a refused `dsv4ctl probe|validate` exits 3.
VERDICT_CODES = {"probe": (1, 2), "validate": (1,)}


@dataclass(frozen=True)
class Command:
    name: str
    entry: Callable[[Sequence[str]], int]
    argv: tuple[str, ...]  # a command line that works (or fails only on the environment)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket is


def files(tmp: Path) -> dict[str, Path]:
    engine = EngineConfig(
        role=Role.DECODE, model_path="/m", served_model_name="m", backend="reference", tp=1
    )
    made = {
        "engine.yaml": dump_engine_yaml(engine),
        "bad.yaml": "role: [\n",
        "wrong.yaml": "role: both\nport: many\n",
        "calls.jsonl": (ROOT / "tests/data/dsml_corpus/corpus_v4.jsonl").read_text().splitlines()[0]
        + "\n",
        "bad.jsonl": "{not json\n",
        "config.json": (ROOT / "tests/data/deepseek-v32-dsa-config.json").read_text(),
        "bad.json": '{"hidden_size": "big"}',
        "flash.yaml": (ROOT / "manifests/samples/flash-b200-1p1d.yaml").read_text(),
    }
    out = {}
    for name, text in made.items():
        (tmp / name).write_text(text)
        out[name] = tmp / name
    (tmp / "latin1.jsonl").write_bytes(b"\xff\xfe\x00")
    out["latin1.jsonl"] = tmp / "latin1.jsonl"
    out["dir"] = tmp
    out["missing"] = tmp / "missing.yaml"
    return out


def commands(tmp: Path, f: dict[str, Path]) -> list[Command]:
    url = f"http://127.0.0.1:{closed_port()}"
    kubeconfig = str(tmp / "no-kubeconfig")
    return [
        Command("plan", dsv4ctl.main, ("plan", "--preset", "v4-flash", "--gpu-memory", "180GiB", "--tp", "4", "--hicache-ratio", "2")),
        Command("plan", dsv4ctl.main, ("plan", "--model-config", str(f["config.json"]), "--gpu-memory", "80GiB", "--output", "json")),
        Command("probe", dsv4ctl.main, ("probe", url, "--backend", "reference", "--requests", "20", "--concurrency", "2", "--timeout", "2", "--warm-up", "0.1")),
        Command("probe", dsv4ctl.main, ("probe", url, "--report-configmap", "r", "--kubeconfig", kubeconfig, "--warm-up", "0.1")),
        Command("validate", dsv4ctl.main, ("validate", "--format", "v4", str(f["calls.jsonl"]), "--output", "json")),
        Command("render", dsv4ctl.main, ("render", str(f["flash.yaml"]), "--canary", "indexDtype=fp4", "hicache.enabled=true", "--probe-job")),
        Command("rollout", dsv4ctl.main, ("rollout", "status", "flash", "-n", "ns", "--kubeconfig", kubeconfig)),
        Command("rollout", dsv4ctl.main, ("rollout", "abort", "flash", "--kubeconfig", kubeconfig)),
        Command("serve", engine_cli.main, ("serve", "--port", "0", "--enable-hicache", "--hicache-ratio", "3", "--index-dtype", "bf16", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0")),
        Command("launch", engine_cli.main, ("launch", "--config", str(f["engine.yaml"]), "--dry-run")),
    ]  # fmt: skip


def subparser(entry: Callable, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of a command line's (sub)command: its flags are what a user can misuse."""
    from dsv4_engine import commands as engine_commands
    from dsv4_engine.cliutil import build_parser
    from dsv4_operator import cli as operator_cli

    package = engine_commands if entry is engine_cli.main else operator_cli
    parser = build_parser("x", "", package, list(argv))
    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
    return parser


@st.composite
def broken(draw: st.DrawFn, cases: list[Command], pool: list[str]) -> tuple[Command, list[str]]:
    """A working command line, broken one to three ways."""
    case = draw(st.sampled_from(cases))
    argv = list(case.argv)
    flags = sorted(
        f for f in subparser(case.entry, argv)._option_string_actions if f not in ("-h", "--help")
    )
    typed = st.text(st.characters(blacklist_characters="\x00"), max_size=12)  # argv has no NUL
    garbage = st.one_of(st.sampled_from([*GARBAGE, *pool]), typed)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["replace", "drop", "unknown", "flag", "repeat"]))
        at = draw(st.integers(1, max(1, len(argv) - 1)))
        if how == "replace" and len(argv) > 1:
            argv[at] = draw(garbage)
        elif how == "drop" and len(argv) > 1:
            del argv[at]
        elif how == "unknown":
            argv.insert(at, draw(st.sampled_from(["--nope", "--nope=1", "-z", "--tp-siz"])))
        elif how == "flag":
            argv += [draw(st.sampled_from(flags)), draw(garbage)]
        elif how == "repeat" and at < len(argv) - 1:
            argv += argv[at : at + 2]
    return case, argv


def attempt(entry: Callable[[Sequence[str]], int], argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        try:
            code = entry(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return code, err.getvalue()


def test_no_argument_ends_in_a_traceback(tmp_path, monkeypatch):
    async def no_serving(settings: object) -> None:
        return None

    execs: list[list[str]] = []
    monkeypatch.setattr(serve, "_serve", no_serving)
    monkeypatch.setattr(launch.os, "execve", lambda path, argv, env: execs.append(argv))
    real_warm_up = runner._warm_up

    async def short_warm_up(client: object, settings: ProbeSettings) -> str:
        """A command line that lost its `--warm-up` would wait the default minute for an
        engine the sweep never starts; the refusal, not the wait, is what is tested."""
        quick = settings.model_copy(update={"warm_up_s": min(settings.warm_up_s, 0.2)})
        return await real_warm_up(client, quick)

    monkeypatch.setattr(runner, "_warm_up", short_warm_up)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    made = files(tmp_path)
    cases, pool = commands(tmp_path, made), [str(p) for p in made.values()]
    outcomes: Counter[tuple[str, str]] = Counter()
    tried: set[tuple[str, ...]] = set()

    @settings(
        max_examples=EXAMPLES * len({c.name for c in cases}),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(broken(cases, pool))
    def sweep(example: tuple[Command, list[str]]) -> None:
        case, argv = example
        tried.add(tuple(argv))
        code, err = attempt(case.entry, argv)  # an exception here is the traceback a user sees
        lines = [line for line in err.split("\n") if line.strip()]  # as a terminal shows it
        if code == 0:
            outcomes[(case.name, "ran")] += 1
        elif case.name == "validate" and code == 1 and not lines:
            outcomes[(case.name, "judged not valid")] += 1  # its verdict, not an error
        else:
            assert len(lines) == 1, f"{argv}: exit {code}, stderr:\n{err}"
            assert "error" in lines[0] or "filed INCONCLUSIVE" in lines[0], (argv, err)
            if case.name in VERDICT_CODES and "error" in lines[0]:
                assert code == 3, f"{argv}: a usage error read as a verdict (exit {code})"
            outcomes[(case.name, f"refused, exit {code}")] += 1

    sweep()
    print(f"\n{len(tried)} distinct command lines:")
    for (name, how), n in sorted(outcomes.items()):
        print(f"  {name:<9} {how:<22} {n}")
    print(f"  (launch would have started the engine {len(execs)} times)")
    assert {name for name, _ in outcomes} == {c.name for c in cases}
