"""`dsv4-engine launch`: engine.yaml in, the engine's exact command line out (dry run)."""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points

import pytest

from dsv4_engine.cliutil import CommandError
from dsv4_engine.commands import launch, serve
from dsv4_engine.engine_config import CANARY_ARG, EngineConfig, dump_engine_yaml, to_sglang_args
from dsv4_engine.features import (
    EngineFeatures,
    FaultInjection,
    HiCacheFeature,
    IndexDtype,
    KvCanary,
    Role,
)


def config(**kw) -> EngineConfig:
    base = dict(
        role=Role.DECODE,
        model_path="/models/flash",
        served_model_name="flash",
        features=EngineFeatures(
            hicache=HiCacheFeature(enabled=True, ratio=3.0), index_dtype=IndexDtype.BF16
        ),
    )
    return EngineConfig(**(base | kw))


def test_reference_command_parses_into_the_intended_serve_settings():
    argv, env = launch.command(config(backend="reference", port=31000))
    assert argv[1:4] == ["-m", "dsv4_engine.cli", "serve"] and env == {}
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    settings = serve.settings_from_args(parser.parse_args(argv[4:]))
    assert settings.port == 31000 and settings.served_model_name == "flash"
    assert settings.index_dtype is IndexDtype.BF16
    assert settings.enable_hierarchical_cache and settings.hicache_ratio == 3.0
    assert settings.disaggregation_mode.value == "decode"
    assert settings.reference_model.value == "random"


@pytest.mark.parametrize("mode", list(KvCanary))
def test_kv_canary_reaches_the_reference_engine_by_sglangs_flag(mode):
    argv, _ = launch.command(config(backend="reference", features=EngineFeatures(kv_canary=mode)))
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    assert serve.settings_from_args(parser.parse_args(argv[4:])).kv_canary == CANARY_ARG[mode]


def test_the_reference_model_and_the_aimed_fault_reach_the_reference_engine():
    faulty = EngineFeatures(fault_injection=FaultInjection(ungated_index_k=True, ungated_share=0.2))
    argv, env = launch.command(config(backend="reference", reference_model="echo", features=faulty))
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    assert serve.settings_from_args(parser.parse_args(argv[4:])).reference_model.value == "echo"
    assert env == {launch.UNGATED_INDEX_K_ENV: "0.2"}


def test_sglang_command_is_to_sglang_args_with_the_plugin_enabled():
    cfg = config(features=EngineFeatures(index_dtype=IndexDtype.FP4))
    argv, env = launch.command(cfg)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[3:] == to_sglang_args(cfg)
    plugins = {ep.name for ep in entry_points(group="sglang.srt.plugins")}
    assert env["SGLANG_PLUGINS"] in plugins
    from dsv4_engine.sglang_plugin import ENV_INDEX_DTYPE

    assert env[ENV_INDEX_DTYPE] == "fp4"
    assert "--enable-deepseek-v4-fp4-indexer" in argv


def test_sglang_is_not_started_for_an_index_k_dtype_it_does_not_store():
    with pytest.raises(CommandError, match=r"^features\.indexDtype bf16: SGLang 0\.5\.23 stores"):
        launch.command(config())


def test_reference_backend_refuses_parallelism():
    with pytest.raises(CommandError, match="tp=dp=ep=1"):
        launch.command(config(backend="reference", tp=8))


def test_invalid_yaml_is_one_line_naming_the_field(tmp_path, capsys):
    path = tmp_path / "engine.yaml"
    path.write_text(dump_engine_yaml(config()).replace("role: decode", "role: both"))
    from dsv4_engine.cli import main

    assert main(["launch", "--config", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dsv4-engine launch: error: --config {path}: role:")
    assert "\n" not in err


def test_dry_run_prints_environment_and_command(tmp_path, capsys):
    path = tmp_path / "engine.yaml"
    path.write_text(dump_engine_yaml(config(backend="reference")))
    from dsv4_engine.cli import main

    assert main(["launch", "--config", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "serve --host 0.0.0.0 --port 30000" in out and "--index-dtype bf16" in out


def test_fault_injection_reaches_only_the_reference_engine():
    from dsv4_engine.features import FaultInjection
    from dsv4_engine.pools.device_pool import UNGATED_INDEX_K_ENV

    features = EngineFeatures(fault_injection=FaultInjection(ungated_index_k=True))
    _, env = launch.command(config(backend="reference", features=features))
    assert env == {UNGATED_INDEX_K_ENV: "1"}
    with pytest.raises(CommandError, match="faultInjection.ungatedIndexK"):
        launch.command(config(features=features))


def test_benign_nondeterminism_reaches_only_the_reference_engine():
    features = EngineFeatures(fault_injection=FaultInjection(benign_nondeterminism=0.03))
    argv, _ = launch.command(config(backend="reference", features=features))
    parser = argparse.ArgumentParser()
    serve.add_serve_arguments(parser)
    assert serve.settings_from_args(parser.parse_args(argv[4:])).benign_nondeterminism == 0.03
    with pytest.raises(CommandError, match="faultInjection.benignNondeterminism"):
        launch.command(config(features=features))


def test_without_a_gpu_sglang_is_not_started_and_the_device_is_named(tmp_path, capsys, monkeypatch):
    """SGLang would end in a traceback deep in its start; the launcher says what is missing."""
    path = tmp_path / "engine.yaml"
    path.write_text(dump_engine_yaml(config(features=EngineFeatures())))
    monkeypatch.setattr(launch, "NVIDIA_DEVICES", str(tmp_path / "nvidia[0-9]*"))
    execs = []
    monkeypatch.setattr(launch.os, "execve", lambda *a: execs.append(a))
    from dsv4_engine.cli import main

    assert main(["launch", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsv4-engine launch: error: backend: sglang needs NVIDIA GPUs")
    assert f"(no {tmp_path}/nvidia[0-9]*)" in err and err.count("\n") == 1 and not execs
    (tmp_path / "nvidia0").touch()  # a GPU, as the NVIDIA container runtime gives a pod one
    assert main(["launch", "--config", str(path)]) == 0
    ((_, argv, _),) = execs
    assert argv[1:3] == ["-m", "sglang.launch_server"]


def test_check_runs_the_reference_engines_own_parser(tmp_path, capsys):
    path = tmp_path / "engine.yaml"
    path.write_text(dump_engine_yaml(config(backend="reference")))
    from dsv4_engine.cli import main

    assert main(["launch", "--config", str(path), "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "serve --host 0.0.0.0 --port 30000" in out[-2]
    assert out[-1] == "# accepted by dsv4-engine serve's parser; not started"
