"""Transient API failures are retried with backoff; others surface at once."""

import random

import pytest

from dsv4_operator.kube.client import ApiError, Backoff, path, retrying


class FailingThenOk:
    """Fault injection: raise the given statuses in order, then answer."""

    def __init__(self, *statuses):
        self.statuses = list(statuses)
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.statuses:
            raise ApiError(self.statuses.pop(0), "injected")
        return "ok"


def run(call, attempts=4):
    slept = []
    result = retrying(
        call, Backoff(attempts=attempts, base=0.1, cap=1.0), random.Random(0), slept.append
    )
    return result, slept


def test_throttling_and_5xx_are_retried_with_growing_bounded_pauses():
    call = FailingThenOk(429, 503, 500)
    result, slept = run(call)
    assert result == "ok" and call.calls == 4
    assert len(slept) == 3 and all(
        0 <= s <= bound for s, bound in zip(slept, (0.1, 0.2, 0.4), strict=True)
    )


@pytest.mark.parametrize("status", [422, 409])
def test_a_client_error_or_a_failed_precondition_is_not_retried(status):
    """409 answers a precondition (a resourceVersion that moved, a name that exists): the
    same request again cannot succeed; the caller must read again and decide again."""
    call = FailingThenOk(status)
    with pytest.raises(ApiError) as err:
        run(call)
    assert err.value.status == status and call.calls == 1


def test_retries_are_bounded():
    call = FailingThenOk(*[503] * 10)
    with pytest.raises(ApiError):
        run(call, attempts=3)
    assert call.calls == 3


def test_paths():
    assert path("StatefulSet", "ns", "a") == "/apis/apps/v1/namespaces/ns/statefulsets/a"
    assert path("Node", None) == "/api/v1/nodes"
    assert path("DSV4Deployment", None) == "/apis/inference.dsv4.dev/v1alpha1/dsv4deployments"
