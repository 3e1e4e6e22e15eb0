"""`dsv4ctl plan`: the table, the JSON, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dsv4_operator.cli.main import main

DONE_WHEN = [
    "plan",
    "--preset",
    "v4-flash",
    "--gpu-memory",
    "180GiB",
    "--tp",
    "4",
    "--index-dtype",
    "bf16",
    "--engine",
    "reference",
]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_legacy_compare_prints_over_reservation_and_tokens_lost(capsys):
    code, out, err = run(capsys, *DONE_WHEN, "--legacy-compare", "--hicache-ratio", "2")
    assert code == 0 and err == ""
    for pool in ("swa", "c4", "c4_indexer", "c128", "c4_state", "c128_state"):
        assert f"\n{pool} " in out
    legacy = next(line for line in out.splitlines() if line.startswith("legacy"))
    assert (
        "264 B instead of 256 B" in legacy and "over-reserves" in legacy and "full tokens" in legacy
    )
    assert "HiCache     host memory" in out


def test_json_output_matches_the_table_numbers(capsys):
    code, out, _ = run(capsys, *DONE_WHEN, "--legacy-compare", "--output", "json")
    assert code == 0
    data = json.loads(out)
    legacy = data["legacy"]
    assert (
        legacy["fixed_full_tokens"] - legacy["legacy_full_tokens"]
        == legacy["tokens_lost_per_rank"]
        > 0
    )
    assert legacy["over_reserved_bytes_per_rank"] > 0
    pools = {p["name"]: p for p in data["plan"]["pools"]}
    assert pools["c4_indexer"]["bytes_per_token"] == 21 * 256
    assert data["budget"]["weights_estimated"] is True


def test_fp4_plan_reports_both_budgets(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--preset",
        "v4-pro",
        "--gpu-memory",
        "180GiB",
        "--tp",
        "8",
        "--index-dtype",
        "fp4",
    )
    assert code == 0
    assert (
        "index-K     68 B per compressed token per indexer layer (budgeted 132 B): "
        "SGLang 0.5.23 stores 68 B (fp4 e2m1 keys + e8m0 scale per 32)"
    ) in out
    assert "priced exactly (68 B)" in out


def test_model_config_file_works_like_the_preset(capsys, tmp_path):
    from dsv4_engine.presets import preset_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(preset_config("v4-flash")))
    _, from_file, _ = run(
        capsys, "plan", "--model-config", str(path), *DONE_WHEN[3:], "--output", "json"
    )
    _, from_preset, _ = run(capsys, *DONE_WHEN, "--output", "json")
    assert json.loads(from_file)["plan"] == json.loads(from_preset)["plan"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--page-size", "192"],
            "page_size: DeepSeek-V4 compressed attention needs a multiple of 128",
        ),
        (["--gpu-memory", "180"], "--gpu-memory: expected a size with a unit"),
        (["--gpu-memory", "30GiB"], "no memory is left for the KV pools"),
        (["--gpu-memory", "40GiB", "--weights-memory", "35.99GiB"], "too small for one request"),
        (["--hicache-ratio", "0.5"], "hicache ratio: expected a value greater than 1"),
        (["--engine", "sglang"], "indexDtype bf16: SGLang 0.5.23 stores DeepSeek-V4 index-K only"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, extra, message):
    code, out, err = run(capsys, *DONE_WHEN, *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_unknown_model_and_missing_file(capsys, tmp_path):
    cfg = tmp_path / "llama.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    code, _, err = run(capsys, "plan", "--model-config", str(cfg), "--gpu-memory", "80GiB")
    assert (
        code == 2
        and "unknown model architecture 'LlamaForCausalLM'" in err
        and err.count("\n") == 1
    )
    code, _, err = run(
        capsys, "plan", "--model-config", str(tmp_path / "nope.json"), "--gpu-memory", "80GiB"
    )
    assert code == 2 and "nope.json: file not found" in err and err.count("\n") == 1


def test_plan_imports_no_other_subcommand():
    """`dsv4ctl plan` stays interactive: heavy subcommands (HTTP clients, Kubernetes) are
    not imported to run it."""
    code = (
        "import sys, contextlib, io\n"
        "from dsv4_operator.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['plan', '--preset', 'v4-flash', '--gpu-memory', '180GiB']) == 0\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('dsv4_operator.cli.'))\n"
        "assert loaded == ['dsv4_operator.cli.main', 'dsv4_operator.cli.plan'], loaded\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hicache_size_is_taken_as_given_with_sglangs_v4_limit_noted(capsys):
    code, out, _ = run(capsys, *DONE_WHEN, "--hicache-size", "300GiB")
    assert code == 0
    assert "host memory 300.00 GiB per rank, 1,200.00 GiB for 4 rank(s)" in out
    assert "refuses --hicache-size for DeepSeek-V4" in out
