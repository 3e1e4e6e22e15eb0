"""`dsv4ctl validate` and `dsv4ctl probe` as a user runs them: output, exit codes, errors."""

import json
from pathlib import Path

import jsonschema
import pytest

from dsv4_engine.probe import report_schema
from dsv4_engine.probe.exitcodes import VERDICT_NOT_FILED
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.cli import probe as probe_cli
from dsv4_operator.cli.main import main
from dsv4_operator.kube.client import ApiError
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.decide import ProbeOutcome
from dsv4_operator.rollout.reports import (
    ANNOTATION_VERDICT,
    PROBE_MANAGER,
    Evidence,
    ReportRef,
    report_filing,
    report_skeleton,
)
from tests.unit.operator.memory_api import MemoryApi

CORPUS = Path(__file__).parents[2] / "data" / "dsml_corpus"
OWNER = Owner(name="flash", namespace="serving", uid="uid-of-flash")


def test_validate_json_output_is_one_object_per_line(capsys):
    path = CORPUS / "corpus_v41.jsonl"
    code = main(["validate", "--format", "v41", str(path), "--output", "json"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    *out, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 1  # the corpus holds corrupt completions
    assert [o["id"] for o in out] == [r["id"] for r in rows]
    assert all(set(o) == {"id", "valid", "class", "detail"} for o in out)
    assert all(o["valid"] == (o["class"] == "VALID") for o in out)
    assert all(bool(o["detail"]) == (not o["valid"]) for o in out)
    counts = summary["summary"]["counts"]
    assert summary["summary"]["total"] == len(rows) == sum(counts.values())
    assert counts["VALID"] == sum(o["valid"] for o in out)


def test_validate_score_reports_precision_and_recall_per_class(capsys):
    path = CORPUS / "corpus_v4.jsonl"
    main(["validate", "--format", "v4", str(path), "--output", "json", "--score"])
    *out, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    labels = [json.loads(line)["label"] for line in path.read_text().splitlines()]
    scores = summary["summary"]["scores"]
    for name, s in scores.items():
        assert s["labelled"] == labels.count(name)
        assert s["judged"] == sum(o["class"] == name for o in out)
        hits = sum(o["class"] == name == label for o, label in zip(out, labels, strict=True))
        assert s["correct"] == hits
    main(["validate", "--format", "v4", str(path), "--score"])
    table = capsys.readouterr().out
    assert "class              labelled judged precision recall" in table


def test_validate_score_needs_labels(tmp_path, capsys):
    path = tmp_path / "unlabelled.jsonl"
    path.write_text('{"id": "a", "text": "fine"}\n')
    assert main(["validate", "--format", "v4", str(path), "--score"]) == 3
    assert "record 'a' has no field 'label'" in capsys.readouterr().err


def test_validate_all_valid_exits_zero(tmp_path, capsys):
    valid = [
        line
        for line in (CORPUS / "corpus_v4.jsonl").read_text().splitlines()
        if json.loads(line)["label"] == "VALID"
    ]
    (tmp_path / "ok.jsonl").write_text("\n".join(valid) + "\n\n")
    assert main(["validate", "--format", "v4", str(tmp_path / "ok.jsonl")]) == 0
    assert f"# VALID: {len(valid)}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "bad.jsonl:2: not a JSON object"),
        ('{"text": "hi"}', "bad.jsonl:2: field 'id' (string) is missing"),
        ('{"id": "a"}', "bad.jsonl:2: field 'text'"),
        ('{"id": "a", "text": "x", "echo": {"tool": 1}}', "bad.jsonl:2: echo must be"),
        ('{"id": "a", "text": "x", "prompt": 3}', "bad.jsonl:2: field 'prompt' must be"),
        ('{"id": "a", "text": "x", "label": "FINE"}', "bad.jsonl:2: field 'label' must be one of"),
        (
            '{"id": "a", "text": "x", "tools": [{"function": {"name": "f", "parameters": {"type": 5}}}]}',
            "bad.jsonl:2: tools[0] (f): parameters is not a JSON schema",
        ),
    ],
)
def test_validate_bad_input_names_line_and_field(tmp_path, capsys, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    assert main(["validate", "--format", "v4", str(path)]) == 3
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_validate_reads_records_as_json_lines_defines_them(tmp_path, capsys):
    """U+2028/U+2029 are legal unescaped inside a JSON string: they end no record."""
    records = [
        {"id": "a", "text": "line one\u2028line two"},
        {"id": "b", "text": "para\u2029graph"},
        {"id": "c", "text": "plain"},
    ]
    path = tmp_path / "seps.jsonl"
    text = "\r\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n"
    assert "\u2028" in text and "\u2029" in text
    path.write_text(text, encoding="utf-8")
    assert main(["validate", "--format", "v4", str(path), "--output", "json"]) == 0
    *out, summary = [json.loads(line) for line in capsys.readouterr().out.split("\n") if line]
    assert [o["id"] for o in out] == ["a", "b", "c"]
    assert summary["summary"]["total"] == 3


def test_a_malformed_record_is_named_and_the_rest_still_judged(tmp_path, capsys):
    lines = [
        '{"id": "first", "text": "fine"}',
        "{not json",
        '{"id": "third", "text": "also fine"}',
        '{"text": "no id"}',
        '{"id": "fifth", "text": "fine again"}',
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["validate", "--format", "v4", str(path), "--output", "json"]) == 3
    captured = capsys.readouterr()
    *out, summary = [json.loads(line) for line in captured.out.splitlines()]
    assert [o["id"] for o in out] == ["first", "third", "fifth"]
    assert summary["summary"]["total"] == 3
    assert "mixed.jsonl:2: not a JSON object" in captured.err
    assert "mixed.jsonl:4: field 'id' (string) is missing" in captured.err
    assert "Traceback" not in captured.err


def test_validate_missing_file(capsys):
    assert main(["validate", "--format", "v4", "/nonexistent.jsonl"]) == 3
    assert "cannot read /nonexistent.jsonl" in capsys.readouterr().err


def test_probe_fail_exit_code_report_and_html(server_thread, tmp_path, capsys):
    srv = server_thread(corruption_rate=0.12, seed=4)
    report_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    argv = f"probe {srv.url} --probes toolcall-echo --concurrency 8 --requests 1000"
    code = main([*argv.split(), "--report", str(report_path), "--html", str(html_path)])
    out = capsys.readouterr()
    assert code == 1
    assert out.out.startswith("verdict") and "FAIL" in out.out.splitlines()[0]
    assert "\r[" not in out.err, "no progress bar when stderr is not a terminal"
    report = json.loads(report_path.read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert report["verdict"] == "FAIL" and report["rate"] > 0
    assert "<svg" in html_path.read_text()


def test_probe_inconclusive_json_output(server_thread, capsys):
    srv = server_thread()
    argv = f"probe {srv.url} --probes toolcall-echo --concurrency 4 --requests 50 --output json"
    code = main(argv.split())
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["verdict"] == "INCONCLUSIVE"
    assert report["samples"]["judged"] == 50


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--probes", "toolcall-echo,nope"], "--probes: unknown probe 'nope'"),
        (["--concurrency", "0"], "--concurrency: Input should be greater than or equal to 1"),
        (["--max-corruption-rate", "2"], "--max-corruption-rate: Input should be less than 1"),
        (["--admin-offload-path", "admin"], "admin_offload_path must start with '/'"),
    ],
)
def test_probe_usage_errors_exit_3(capsys, argv, message):
    assert main(["probe", "http://127.0.0.1:9", *argv]) == 3
    assert message in capsys.readouterr().err


def test_probe_unreachable_engine_exits_3(capsys, unused_tcp_port):
    url = f"http://127.0.0.1:{unused_tcp_port}"
    assert main(["probe", url, "--requests", "5", "--warm-up", "1"]) == 3
    assert "did not answer a warm-up request within 1 s" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["probe", "http://x", "--concurrency", "many"],
        ["probe"],
        ["validate", "file.jsonl"],
        ["validate", "--format", "v5", "file.jsonl"],
    ],
)
def test_argparse_usage_errors_exit_3_not_2(argv, capsys):
    """2 means INCONCLUSIVE to a script gating on `dsv4ctl probe`; a typo must not read so."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 3
    assert "error:" in capsys.readouterr().err


def test_probe_refuses_a_bad_kubeconfig_before_probing(server_thread, tmp_path, capsys):
    srv = server_thread()
    code = main(
        [
            "probe", srv.url, "--backend", "reference", "--requests", "8",
            "--report-configmap", "flash-canary-x-1",
            "--kubeconfig", str(tmp_path / "missing.kubeconfig"),
        ]
    )  # fmt: skip
    assert code == 3
    assert "cannot load kubeconfig" in capsys.readouterr().err
    assert srv.server.chat_requests == 0  # no probe run whose report could not be filed


# -- filing into a report ConfigMap (what a probe Job runs) -------------------------------

NS, REPORT = "serving", "flash-canary-ab12-1"
# Few samples can PASS at a 30% budget: a quick run against a clean scripted server.
QUICK = ["--probes", "toolcall-echo", "--concurrency", "2", "--requests", "10"]
QUICK += ["--max-corruption-rate", "0.3"]


def _reports(monkeypatch, verdict: str | None = None) -> MemoryApi:
    """The API a probe pod files into: the attempt's report skeleton, optionally already
    holding ``verdict`` as a probe files it."""
    api = MemoryApi()
    skeleton = report_skeleton(OWNER, ReportRef("canary", "ab12", attempt=1))
    api.user_apply(skeleton)
    if verdict is not None:
        _file_as_probe(api, verdict)
    monkeypatch.setattr(probe_cli, "connect", lambda kubeconfig, exit_code: api)
    monkeypatch.setattr(probe_cli.time, "sleep", lambda s: None)
    return api


def _file_as_probe(api: MemoryApi, verdict: str) -> None:
    outcome = ProbeOutcome(RolloutVerdict(verdict), 0.5, 0.9, 12, REPORT, "an earlier run")
    filing = report_filing(Evidence({"verdict": verdict}, outcome, {}))
    filing["metadata"].update(name=REPORT, namespace=NS)
    api.apply({"apiVersion": "v1", "kind": "ConfigMap", **filing}, manager=PROBE_MANAGER)


def _probe(url: str) -> int:
    return main(["probe", url, *QUICK, "--report-configmap", REPORT, "--report-namespace", NS])


def _filed(api: MemoryApi) -> str:
    return api.get("ConfigMap", NS, REPORT)["metadata"]["annotations"][ANNOTATION_VERDICT]


@pytest.mark.parametrize("verdict", ["PASS", "FAIL"])
def test_a_verdict_there_before_the_run_is_never_repeated_and_fails_the_attempt(
    server_thread, monkeypatch, capsys, verdict
):
    """The forged PASS of issue 62: a PASS pre-filed into the attempt's report, which the
    probe used to repeat ("already holds PASS; not probing again", exit 0).  Whoever filed
    it, this run did not: it probes nothing, leaves the report alone and exits FAIL."""
    api = _reports(monkeypatch, verdict=verdict)
    srv = server_thread()  # clean: a new run would PASS
    assert _probe(srv.url) == 1
    assert srv.server.chat_requests == 0, "not probed"
    assert _filed(api) == verdict, "left as it is"
    err = capsys.readouterr().err
    assert (
        f"evidence existed before the run: configmap {NS}/{REPORT} already holds {verdict}" in err
    )


@pytest.mark.parametrize("verdict", ["PASS", "FAIL"])
def test_a_verdict_filed_by_someone_else_during_the_run_fails_the_attempt(
    server_thread, monkeypatch, capsys, verdict
):
    """A verdict raced in while the probe ran is neither overwritten (a filed verdict
    stands) nor taken as this run's: exit FAIL."""
    api = _reports(monkeypatch)
    srv = server_thread()
    reads = []
    real_get = api.get

    def get(kind, namespace, name, *args):
        reads.append(name)
        if len(reads) == 2:  # after the first look, before the filing: a rival files
            _file_as_probe(api, verdict)
        return real_get(kind, namespace, name, *args)

    monkeypatch.setattr(api, "get", get)
    assert _probe(srv.url) == 1
    assert srv.server.chat_requests > 0
    assert _filed(api) == verdict
    assert f"was filed ({verdict}) by someone else during this run" in capsys.readouterr().err


def test_a_pass_is_filed_once(server_thread, monkeypatch):
    api = _reports(monkeypatch)
    assert _probe(server_thread().url) == 0
    assert _filed(api) == "PASS"


def test_a_verdict_that_cannot_be_filed_exits_4_after_bounded_retries(
    server_thread, monkeypatch, capsys
):
    api = _reports(monkeypatch)
    api.refuse[("apply", "ConfigMap")] = ApiError(503, "etcd is unhappy")
    pauses = []
    monkeypatch.setattr(probe_cli.time, "sleep", pauses.append)
    assert _probe(server_thread().url) == VERDICT_NOT_FILED
    assert pauses == list(probe_cli.FILING_PAUSES_S)
    assert "cannot file the report in configmap serving/flash-canary-ab12-1" in (
        capsys.readouterr().err
    )
