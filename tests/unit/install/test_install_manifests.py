"""manifests/ fits the code it deploys: probes hit the endpoints runtime.py serves, the
arguments parse, the pod is locked down, the CRD is the generated one, samples validate."""

import asyncio
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.cache import Cache
from dsv4_operator.leader import Leadership, LeaseConfig
from dsv4_operator.rollout.job_executor import JobProbeExecutor
from dsv4_operator.runtime import OPERATOR_CONTAINER, Health, job_wiring, parse_args

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests"
SAMPLES = sorted((MANIFESTS / "samples").glob("*-*.yaml"))


def load(*parts):
    return [d for d in yaml.safe_load_all(MANIFESTS.joinpath(*parts).read_text()) if d]


@pytest.fixture(scope="module")
def pod():
    (deployment,) = load("base", "deployment.yaml")
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod):
    (container,) = pod["containers"]
    return container


def named_port(container, name):
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def test_the_deployment_arguments_parse_and_serve_health_on_the_probed_port(container):
    args = parse_args(container["args"])
    assert args.command == "run"
    assert args.namespace == []  # cluster-wide: matches the ClusterRole
    for probe in ("livenessProbe", "readinessProbe"):
        assert named_port(container, container[probe]["httpGet"]["port"]) == args.health_port


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


async def probe_answers(container):
    """Status codes runtime.Health gives the two probe paths: before and after it leads."""
    leadership = Leadership(LeaseConfig("l", "ns", "me"))
    health = Health(kube=None, leadership=leadership)
    runner = await health.start(0)
    port = runner.addresses[0][1]
    live = container["livenessProbe"]["httpGet"]["path"]
    ready = container["readinessProbe"]["httpGet"]["path"]
    try:
        before = [await asyncio.to_thread(get, port, p) for p in (live, ready)]
        leadership.renewed_at = time.monotonic()  # renewed just now: it leads
        health.watching.set()
        health.synced.set()
        after = [await asyncio.to_thread(get, port, p) for p in (live, ready)]
    finally:
        await runner.cleanup()
    return before, after


def test_the_probes_hit_the_endpoints_the_runtime_serves(container):
    before, after = asyncio.run(probe_answers(container))
    assert before == [200, 503]  # alive at once, ready once leading, watching and synced
    assert after == [200, 200]


def test_the_operator_pod_is_locked_down(pod, container):
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert "add" not in security["capabilities"]
    # The only writable path is an emptyDir at /tmp (HOME in the image).
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    resources = container["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert set(resources["limits"]) == {"cpu", "memory"}


def test_the_pod_user_is_the_image_user(pod):
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    user = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")][-1]
    uid, gid = user.split(":")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        int(uid),
        int(gid),
    )


def test_the_lease_namespace_is_the_pods_own(container):
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_the_installed_operator_probes_with_jobs_running_its_own_image(container):
    args = parse_args(container["args"])
    assert args.probe_image is None  # found from the pod itself, so image overrides carry
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["name"] == OPERATOR_CONTAINER
    # The image's wiring has no other executor (tests/e2e/test_install.py: from the pod).
    wiring = job_wiring(None, parse_args([*container["args"], "--probe-image", "op:1"]))
    executor = wiring.executor(lambda owner: None, Cache([]))
    assert isinstance(executor, JobProbeExecutor) and executor.image == "op:1"


@pytest.mark.parametrize(
    "flag", ["--local-endpoints", "--probe-mode=local", "--crash-after-writes=3"]
)
def test_the_image_operator_has_no_development_switches(flag, capsys):
    """In-process probes, the local endpoint map and crash injection belong to the
    development launcher (dsv4_dev.operator), which the image does not install."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["run", flag])
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "0"], "--workers: at least 1 (got 0)"),
        (["--resync-seconds", "0"], "--resync-seconds: more than 0 (got 0)"),
    ],
)
def test_a_loop_that_could_never_run_a_pass_is_refused_naming_its_flag(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["run", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_metrics_service_and_service_monitor_line_up(container):
    (service,) = load("base", "service.yaml")
    (monitor,) = load("monitoring", "servicemonitor.yaml")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == [port["name"]]
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_base_installs_the_generated_crd_itself():
    """No copy to drift: base includes crds/, which lists the file `make manifests` writes."""
    (base,) = load("base", "kustomization.yaml")
    assert "../../crds" in base["resources"]
    crds = yaml.safe_load((CRD_PATH.parent / "kustomization.yaml").read_text())
    assert crds["resources"] == [CRD_PATH.name]


def test_monitoring_extends_base_with_the_monitors_and_the_prometheus_rule():
    (monitoring,) = load("monitoring", "kustomization.yaml")
    assert monitoring["resources"] == [
        "../base",
        "servicemonitor.yaml",
        "podmonitor.yaml",
        "prometheusrule.yaml",
    ]
    (rule,) = load("monitoring", "prometheusrule.yaml")
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"]


@pytest.fixture(scope="module")
def crd_schema():
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    return version["schema"]["openAPIV3Schema"]


def engine_of(path) -> str:
    return yaml.safe_load(path.read_text())["spec"].get("engine", "sglang")


def test_there_are_the_samples_the_docs_promise():
    """Two GPU deployments on SGLang (the kustomization applies both) and the CPU reference
    engine's, for the local playground and CI (each applied on its own: each is `flash`):
    the random model's that the README tour applies, and the echo model's that `make demo`
    applies."""
    gpu = [p for p in SAMPLES if engine_of(p) == "sglang"]
    names = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in gpu}
    assert names == {"flash", "pro"}
    (kustomization,) = load("samples", "kustomization.yaml")
    assert sorted(kustomization["resources"]) == [p.name for p in gpu]
    reference = {
        p.name: yaml.safe_load(p.read_text())["spec"]["model"].get("referenceModel", "random")
        for p in SAMPLES
        if engine_of(p) == "reference"
    }
    assert reference == {"flash-reference.yaml": "random", "flash-echo.yaml": "echo"}


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_each_sample_validates_against_the_generated_crd(path, crd_schema):
    """The schema (structure, enums, ranges) and the typed model (which mirrors the CEL
    rules); the end-to-end test has the real API server check both."""
    sample = yaml.safe_load(path.read_text())
    # OpenAPI v3.0 schemas are draft-4 shaped (boolean exclusiveMinimum).
    jsonschema.Draft4Validator(crd_schema).validate(sample)
    DSV4DeploymentSpec.model_validate(sample["spec"])


def test_the_pro_sample_is_multi_node_on_gb200_in_one_nvlink_domain():
    (pro,) = [yaml.safe_load(p.read_text()) for p in SAMPLES if "pro" in p.name]
    spec = DSV4DeploymentSpec.model_validate(pro["spec"])
    assert spec.placement.gpu_products == ("NVIDIA-GB200",)
    assert spec.model.preset.value == "v4-pro"  # KV pools and HiCache memory sized for Pro
    assert spec.placement.topology_key == "nvidia.com/gpu.clique"
    assert spec.prefill.nodes_per_replica > 1 and spec.decode.nodes_per_replica > 1
    gpus = sum(r.replicas * r.gpus_per_replica for r in (spec.prefill, spec.decode))
    assert gpus <= 72  # one NVL72 rack


def test_the_flash_sample_is_one_prefill_and_one_decode_on_b200():
    (flash,) = [yaml.safe_load(p.read_text()) for p in SAMPLES if "flash-b200" in p.name]
    spec = DSV4DeploymentSpec.model_validate(flash["spec"])
    assert spec.placement.gpu_products == ("NVIDIA-B200",)
    assert spec.model.preset.value == "v4-flash"
    assert (spec.prefill.replicas, spec.decode.replicas) == (1, 1)
    assert spec.prefill.gpus_per_replica == spec.decode.gpus_per_replica == 8


async def metrics_answer():
    health = Health(kube=None, leadership=Leadership(LeaseConfig("l", "ns", "me")))
    runner = await health.start(0)
    try:
        port = runner.addresses[0][1]
        return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
    finally:
        await runner.cleanup()


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


def test_the_metrics_service_port_serves_the_operator_registry(container):
    """The Service and ServiceMonitor scrape /metrics on the container's `http` port."""
    status, body = asyncio.run(metrics_answer())
    assert status == 200
    assert "dsv4_operator_reconcile_total" in body
