"""How `dsv4ctl` commands reach the API server: a kubeconfig on a laptop, the pod's own
ServiceAccount inside a cluster (a probe Job)."""

from __future__ import annotations

from pathlib import Path

from dsv4_engine.cliutil import CommandError
from dsv4_operator.kube.client import ApiError, Kube

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def connect(kubeconfig: str | None, exit_code: int = 1) -> Kube:
    """Like kubectl: `--kubeconfig`, else $KUBECONFIG or ~/.kube/config, else (inside a pod,
    e.g. a probe Job) the pod's ServiceAccount."""
    import yaml
    from kubernetes import client, config

    try:
        return Kube(config.new_client_from_config(config_file=kubeconfig))
    except config.ConfigException as err:
        if kubeconfig is None:
            try:
                config.load_incluster_config()
                return Kube(client.ApiClient())
            except config.ConfigException:
                pass
        raise CommandError(f"cannot load kubeconfig: {err}", exit_code=exit_code) from None
    except (OSError, UnicodeError, yaml.YAMLError) as err:
        raise CommandError(f"cannot read kubeconfig {kubeconfig}: {err}", exit_code) from None
    except (TypeError, AttributeError, KeyError) as err:
        # The client indexes the parsed YAML as it expects a kubeconfig to be shaped.
        raise CommandError(
            f"kubeconfig {kubeconfig} is not a kubeconfig: {err}", exit_code
        ) from None


def default_namespace() -> str:
    """The pod's own namespace inside a cluster, else `default`."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def whoami(kube: Kube) -> str | None:
    """The user the API server authenticates these credentials as (a SelfSubjectReview, which
    every authenticated user may create), or None where it answers none: what a rollout
    control says of who asked (the admission fence checks it)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        review = kube.request("POST", SELF_SUBJECT_REVIEWS, body=body)
    except ApiError:
        return None
    return ((review or {}).get("status") or {}).get("userInfo", {}).get("username") or None
