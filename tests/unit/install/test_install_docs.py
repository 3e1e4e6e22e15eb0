"""docs/ stays true to the code: the API reference is the generated one, the feature-flag
page names every flag and value, no link or path in the docs points nowhere, and the scale
section's defaults are the code's."""

import datetime as dt
import importlib.util
import re
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dsv4_engine.features import EngineFeatures, HiCacheFeature
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.reconcile.controller import SETTLE_S, WORKERS
from dsv4_operator.reconcile.desired import Desired
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.decide import first_status
from dsv4_operator.rollout.slices import spec_revision
from dsv4_operator.runtime import parse_args

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


def hack(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "hack" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rollout_class_table_is_generated_from_the_typed_spec():
    committed = (DOCS / "rollout.md").read_text()
    assert committed == hack("rollout_classes").rewrite(committed), "stale: run `make manifests`"


def test_the_known_issues_table_is_generated_from_the_registry():
    committed = (DOCS / "known-issues.md").read_text()
    assert committed == hack("known_issues").rewrite(committed), "stale: run `make manifests`"


def test_the_committed_api_reference_is_generated_from_the_committed_crd():
    expected = hack("api_reference").render(yaml.safe_load(CRD_PATH.read_text()))
    committed = (DOCS / "api-reference.md").read_text()
    assert committed == expected, "stale: run `make manifests`"


def test_the_api_reference_covers_every_spec_field_and_cel_message():
    reference = (DOCS / "api-reference.md").read_text()
    crd = yaml.safe_load(CRD_PATH.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    module = hack("api_reference")
    for path, _, _ in module.fields(schema, "spec", True):
        if path != "spec":
            assert f"`{path}`" in reference, path
    for _, rule in module.rules(schema, "spec"):
        assert rule["message"].replace("|", "\\|") in reference


def aliases(model):
    return [field.alias or name for name, field in model.model_fields.items()]


def test_the_feature_flag_page_names_every_flag_and_value():
    page = (DOCS / "feature-flags.md").read_text()
    for name in aliases(EngineFeatures):
        assert f"`{name}" in page, name
    for name in aliases(HiCacheFeature):
        assert f"`hicache.{name}`" in page, name
    for model in (EngineFeatures, HiCacheFeature):
        for field in model.model_fields.values():
            enum = getattr(field.annotation, "__members__", None)
            for member in (enum or {}).values():
                assert f"`{member.value}`" in page, member


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_and_repository_paths_in_the_docs_exist(page):
    text = page.read_text()
    prose = re.sub(r"`[^`\n]*`", "", text)  # no link inside a code span (a regex pattern)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name}: link to {target}"
    for path in re.findall(r"`((?:manifests|images|crds|docs|hack)/[\w./-]+)`", text):
        assert (ROOT / path.rstrip("/")).exists(), f"{page.name}: {path}"


def test_the_metrics_page_lists_every_operator_metric_and_alert():
    page = (DOCS / "metrics-and-alerts.md").read_text()
    source = (ROOT / "operator" / "dsv4_operator" / "metrics.py").read_text()
    metrics = set(re.findall(r'"(dsv4_operator_[a-z_]+)"', source))
    assert metrics, "no metric names found in metrics.py"
    documented = set(re.findall(r"`(dsv4_operator_[a-z_]+)`", page))
    assert documented == metrics
    rules = yaml.safe_load((ROOT / "manifests" / "monitoring" / "prometheusrule.yaml").read_text())
    alerts = {r["alert"] for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert set(re.findall(r"`(DSV4[A-Za-z]+)`", page)) == alerts


def review_table() -> list[list[str]]:
    """The cells of each row of install.md's "Security review" table."""
    page = (DOCS / "install.md").read_text()
    table = page.split("### Security review", 1)[1].split("\n\n")[2]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def review_rows() -> set[tuple[frozenset[str], frozenset[str]]]:
    """(resources, verbs) of each row of install.md's "Security review" table."""
    rows = set()
    for cells in review_table():
        resources = frozenset(re.findall(r"`([\w/]+)`", cells[1]))
        rows.add((resources, frozenset(v.strip() for v in cells[2].split(","))))
    return rows


def test_every_row_of_the_security_review_names_tests_that_exist():
    """Its last column, "proven by": `FILE::TEST` of a test function defined in that file."""
    tests = {path.name: path.read_text() for path in (ROOT / "tests").rglob("test_*.py")}
    for cells in review_table():
        named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", cells[-1])
        assert named, f"row {cells[1]} {cells[2]} names no test"
        for file, test in named:
            assert file in tests and f"def {test}(" in tests[file], f"{file}::{test}"


def test_the_security_review_lists_every_rule_of_the_shipped_rbac():
    manifests = ROOT / "manifests"
    files = [
        manifests / "base" / "rbac.yaml",
        *(manifests / "namespaced" / f for f in ("serving.yaml", "self.yaml", "cluster-role.yaml")),
    ]
    rules = [
        rule
        for path in files
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] in ("Role", "ClusterRole")
        for rule in doc["rules"]
    ]
    assert len(rules) > 20
    rows = review_rows()
    for rule in rules:
        assert (frozenset(rule["resources"]), frozenset(rule["verbs"])) in rows, rule


def scale_section() -> str:
    page = (DOCS / "dsv4deployment.md").read_text()
    return page.split("\n## Scale\n", 1)[1].split("\n## ", 1)[0]


def test_the_scale_section_states_the_operators_defaults():
    section = " ".join(scale_section().split())
    args = parse_args(["run"])
    assert args.workers == WORKERS
    assert f"settle window of {SETTLE_S:g} s" in section
    assert f"`--workers` (default {WORKERS})" in section
    assert f"`--resync-seconds`, default {args.resync_seconds:g} s" in section


def bench_scale():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "bench_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_scale_figures_are_for_what_the_benchmark_runs_by_default():
    module = bench_scale()
    args = module.parse_args([])
    section = " ".join(scale_section().split())
    assert f"{args.deployments} deployments on {args.nodes:,} nodes" in section
    assert f"flag change on {args.changed}" in section


@pytest.mark.parametrize("changed", ["0", "501"])
def test_the_scale_bench_refuses_a_flag_change_it_cannot_time(changed, capsys):
    """The flag change is the run's third part: none at all used to end the run in a
    traceback after its convergence had been measured, not in a usage error before it."""
    with pytest.raises(SystemExit):
        bench_scale().parse_args(["--changed", changed])
    assert "--changed: from 1 to --deployments" in capsys.readouterr().err


def test_the_scale_floor_holds_the_operators_children_owned_by_the_created_deployments():
    """The floor applies what the operator's first pass applies for a deployment, each
    child owned by the deployment the bench created (its uid, not render's stand-in): the
    garbage collector keeps them and follows their owners as it does the operator's, so
    the two runs hold the same objects and their ratio is what the operator adds."""
    module = bench_scale()
    doc = module.deployment("scale-3", "d0003")
    uid = "6a1f4c2e-0d1b-4c7e-9a53-2f8e7d9b0c11"
    created = {**doc, "metadata": {**doc["metadata"], "uid": uid}}
    floor = module.children_of(created)
    spec = DSV4DeploymentSpec.model_validate(doc["spec"])
    owner = Owner(name="d0003", namespace="scale-3", uid=uid)
    status = first_status(spec_revision(spec), dt.datetime.now(dt.UTC)).status
    assert floor == Desired(owner, spec, pod_memory).children(status)
    assert all(ref["uid"] == uid for o in floor for ref in o["metadata"]["ownerReferences"])


def speed_line(out: str) -> str:
    """What the bench prints after "at the floor's speed"."""
    line = next(line for line in out.splitlines() if "at the floor's speed" in line)
    return line.split("at the floor's speed", 1)[1].strip()


def test_the_scale_bench_reports_the_machine_cpu_each_phase_took(capsys):
    """The section says the bench prints the CPU every process on the machine used in each
    phase, and the ratio of the two beside the ratio of the times: the machine's count
    includes at least what this process burns, and the last line holds that ratio."""
    module = bench_scale()
    before, mine = module.machine_cpu_s(), time.process_time()
    while time.process_time() - mine < 0.5:
        pass
    burned = time.process_time() - mine
    assert module.machine_cpu_s() - before >= burned - 0.05  # /proc/stat ticks are 10 ms
    args = module.parse_args([])
    speed = {"kube-controller-manager": 30.0, "kube-scheduler": 20.0, "kube-apiserver": 9.0}
    run = {
        "ready_s": 110.0,
        "passes": 1300,
        "steady_requests": {},
        "machine_cpu": (220.0, 110.0),
        "cluster_cpu": Counter(speed),
    }
    floor = {"settled_s": 76.0, "machine_cpu": (152.0, 76.0), "cluster_cpu": Counter(speed)}
    module.report_goals(args, [floor], [run])
    out = capsys.readouterr().out
    assert "median 1.45 of 1 rounds (median times 110.0 s / 76.0 s)" in out
    assert "220 / 152 CPU-s = 1.45 (2.00 and 2.00 of" in out
    assert "each round" not in out
    assert speed_line(out).startswith("1.45 (kube-controller-manager and kube-scheduler")
    assert "machine's CPU each run took" in " ".join(scale_section().split())


def test_the_scale_bench_over_rounds_takes_the_median_ratio_and_shows_each_rounds(capsys):
    """`--rounds 3` (the default): floor, operator, then operator, floor, ...; the goal line
    is the median of the rounds' ratios (one round the machine slowed in moves a mean, not
    the median), the worst round's passes and steady requests count, and each round's own
    ratio is shown beside, also at the floor's speed: the controller manager and the
    scheduler do the same work in both runs, so where they took a quarter more CPU the
    machine was a quarter slower."""
    module = bench_scale()
    assert module.in_rounds(["floor", "operator"], 3) == [
        "floor", "operator", "operator", "floor", "floor", "operator"
    ]  # fmt: skip
    args = module.parse_args([])
    assert args.rounds == 3

    def cpu(controllers, scheduler):
        return Counter({"kube-controller-manager": controllers, "kube-scheduler": scheduler})

    def run(ready_s, passes, steady, controllers, scheduler):
        return {
            "ready_s": ready_s,
            "passes": passes,
            "steady_requests": steady,
            "machine_cpu": (2 * ready_s, ready_s),
            "cluster_cpu": cpu(controllers, scheduler),
        }

    def floor(settled_s):
        return {
            "settled_s": settled_s,
            "machine_cpu": (2 * settled_s, settled_s),
            "cluster_cpu": cpu(24.0, 16.0),
        }

    runs = [run(110.0, 1300, {}, 30.0, 20.0), run(90.0, 1400, {"patch": 2}, 24.0, 16.0)]
    runs.append(run(200.0, 1000, {}, 24.0, 16.0))  # a round the operator's run went slow
    floors = [floor(100.0), floor(80.0), floor(100.0)]
    module.report_goals(args, floors, runs)
    out = capsys.readouterr().out
    assert "median 1.12 of 3 rounds (median times 110.0 s / 100.0 s)  (meets <= 1.15)" in out
    assert "2.80  (meets <= 3)" in out
    assert "steady requests beyond leases and watches  2  (MISSES 0)" in out
    assert "each round" in out and "1.10, 1.12, 2.00" in out
    assert speed_line(out).startswith("0.88, 1.12, 2.00 (")
    assert "took 50 / 40, 40 / 40, 40 / 40 CPU-s" in out
    assert "800 / 560 CPU-s = 1.43" in out
    assert "--rounds" in " ".join(scale_section().split())
