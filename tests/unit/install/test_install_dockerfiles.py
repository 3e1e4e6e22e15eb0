"""Static checks of images/*/Dockerfile (no Docker engine here): pinned bases, non-root,
entrypoints that exist in the packages the image installs, build inputs that exist."""

import json
import re
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from dsv4_operator.runtime import parse_args

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ("engine", "operator")


def instructions(image):
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (ROOT / "images" / image / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def final_stage(image):
    steps = instructions(image)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def exec_form(image, word):
    (args,) = [rest for w, rest in final_stage(image) if w == word]
    return json.loads(args)


def copied_projects(image):
    """Project folders (with a pyproject.toml) the image copies in and installs."""
    sources = [rest.split()[0] for word, rest in instructions(image) if word == "COPY"]
    return {Path(s).parent for s in sources if s.endswith("pyproject.toml")}


def console_scripts(project):
    pyproject = tomllib.loads((ROOT / project / "pyproject.toml").read_text())
    return set(pyproject["project"]["scripts"])


def global_args(image):
    """The ARGs declared before the first FROM, with their defaults: what a FROM may name
    (the production base unless `make images` passes another)."""
    args = {}
    for word, rest in instructions(image):
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def froms(image):
    """(base reference with ARG defaults filled in, stage alias or None) of every FROM."""
    defaults = global_args(image)
    out = []
    for word, rest in instructions(image):
        if word == "FROM":
            named, *alias = rest.split()
            ref = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], named)
            out.append((ref, alias[-1] if alias else None))
    return out


@pytest.mark.parametrize("image", IMAGES)
def test_every_base_image_is_pinned_by_a_tag_and_never_latest(image):
    stages = set()
    for ref, alias in froms(image):
        if alias:
            stages.add(alias)
        if ref in stages:
            continue
        name, sep, tag = ref.rpartition(":")
        assert sep and "/" not in tag, f"{image}: FROM {ref} has no tag"
        assert "latest" not in tag, f"{image}: FROM {ref} floats"
        assert re.search(r"\d", tag), f"{image}: FROM {ref} names no version"


@pytest.mark.parametrize("image", IMAGES)
def test_the_image_runs_as_a_non_root_user(image):
    users = [rest for word, rest in final_stage(image) if word == "USER"]
    assert users, f"{image}: no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # Numeric, so `runAsNonRoot: true` can verify it without reading /etc/passwd.
    assert user.isdigit()


def test_the_engine_image_is_sglang_of_the_pinned_version_on_cuda_13():
    pinned = re.search(r"^sglang==(\S+)$", (ROOT / "requirements" / "sglang.txt").read_text(), re.M)
    ((base, _),) = froms("engine")
    assert base == f"lmsysorg/sglang:v{pinned.group(1)}-cu130"


@pytest.mark.parametrize("image", IMAGES)
def test_the_entrypoint_is_a_console_script_the_image_installs(image):
    scripts = set().union(*(console_scripts(p) for p in copied_projects(image)))
    entrypoint = exec_form(image, "ENTRYPOINT")
    assert entrypoint[0] in scripts, (entrypoint, scripts)


def test_the_operator_image_runs_the_operator_and_carries_dsv4ctl():
    assert exec_form("operator", "ENTRYPOINT") == ["dsv4-operator"]
    # The default command parses as `dsv4-operator run` (argparse exits on anything else).
    assert parse_args(exec_form("operator", "CMD")).command == "run"
    scripts = set().union(*(console_scripts(p) for p in copied_projects("operator")))
    assert "dsv4ctl" in scripts  # the probe Jobs of a rollout run it from this image


def test_the_engine_entrypoint_is_what_the_operator_runs_in_engine_pods():
    from dsv4_operator.api.samples import load_sample
    from dsv4_operator.api.spec import DSV4DeploymentSpec
    from dsv4_operator.render import render_all
    from dsv4_operator.render.meta import Owner

    spec = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
    objs = render_all(Owner("x", "ns", "uid"), spec)
    engine_sts = [o for o in objs if o["kind"] == "StatefulSet"]
    commands = {
        tuple(c["command"][:2])
        for o in engine_sts
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert commands == {tuple(exec_form("engine", "ENTRYPOINT"))}


def test_the_engine_entrypoint_subcommand_exists():
    from dsv4_engine.cli import main as engine_main

    subcommand = exec_form("engine", "ENTRYPOINT")[1]
    with pytest.raises(SystemExit) as exited:  # argparse: 0 after --help, 2 for a bad choice
        engine_main([subcommand, "--help"])
    assert exited.value.code == 0


@pytest.mark.parametrize("image", IMAGES)
def test_everything_the_build_copies_exists_and_is_not_dockerignored(image):
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for word, rest in instructions(image):
        if word != "COPY" or rest.startswith("--from"):
            continue
        source = rest.split()[0]
        assert (ROOT / source).exists(), f"{image}: COPY {source} does not exist"
        top = source.split("/")[0]
        assert not any(fnmatch(source, p) or fnmatch(top, p) for p in ignored), source


def test_the_operator_image_needs_no_engine_runtime():
    """The operator image installs dsv4-engine without its `runtime` extra: the operator and
    every dsv4ctl subcommand must import without torch, numpy, scipy, triton or SGLang."""
    code = (
        "import sys, dsv4_operator.runtime\n"
        "from dsv4_engine.cliutil import build_parser\n"
        "from dsv4_operator import cli\n"
        "build_parser('dsv4ctl', '', cli)\n"
        "heavy = ('torch', 'numpy', 'scipy', 'triton', 'sglang')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    assert json.loads(out.stdout) == []


def test_the_engine_image_enables_the_plugin_the_engine_package_registers():
    """SGLang loads only whitelisted plugins; the image must name dsv4-engine's entry point."""
    pyproject = tomllib.loads((ROOT / "engine" / "pyproject.toml").read_text())
    registered = set(pyproject["project"]["entry-points"]["sglang.srt.plugins"])
    env = " ".join(rest for word, rest in final_stage("engine") if word == "ENV")
    (enabled,) = re.findall(r"SGLANG_PLUGINS=(\S+)", env)
    assert set(enabled.split(",")) == registered


def test_the_engine_build_fails_unless_sglang_gates_every_pool_read():
    """The build runs the gate check (tests/sglang/test_sglang_gate.py runs the same check on
    the pinned SGLang and shows it exits 1 when a getter's wait is patched out) on the
    installed package, after the install and before the sources are removed."""
    import importlib.util

    (install,) = [
        rest for word, rest in final_stage("engine") if word == "RUN" and "pip install" in rest
    ]
    steps = [s.strip() for s in install.split("&&")]
    check = "python3 -m dsv4_engine.sglang_plugin.gate_check"
    assert check in steps
    assert steps.index(check) > next(i for i, s in enumerate(steps) if "pip install" in s)
    assert steps.index(check) < next(i for i, s in enumerate(steps) if s.startswith("rm -rf"))
    spec = importlib.util.find_spec("dsv4_engine.sglang_plugin.gate_check")
    assert spec is not None and (ROOT / "engine").resolve() in Path(spec.origin).resolve().parents
