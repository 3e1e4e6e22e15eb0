"""The probe's reading of `dsv4:kv_canary_violations_total`: what grew between two reads,
per engine, launch tag and fail reason."""

from dsv4_engine.kv_canary import METRIC, Violations, new_violations, read

PAGE = (
    f"# TYPE {METRIC} counter\n"
    f'{METRIC}{{launch_tag="HEAD_K_FULL",fail_reason="verify_chain_hash",worker_addr="http://a"}} 2.0\n'
    f'{METRIC}{{launch_tag="HEAD_K_FULL",fail_reason="verify_chain_hash",worker_addr="http://b"}} 5.0\n'
    'dsv4:kv_canary_violations_created{launch_tag="HEAD_K_FULL"} 1.7e9\n'
)


def test_each_engine_is_read_apart_and_other_series_are_ignored():
    assert read(PAGE) == {
        ("http://a", "HEAD_K_FULL", "verify_chain_hash"): 2,
        ("http://b", "HEAD_K_FULL", "verify_chain_hash"): 5,
    }


def test_only_growth_counts_and_an_engine_that_restarted_counts_from_zero():
    before = {("http://a", "T", "r"): 2, ("http://b", "T", "r"): 5}
    after = {("http://a", "T", "r"): 2, ("http://b", "T", "r"): 1, ("http://c", "T", "r"): 3}
    assert new_violations(before, after) == (
        Violations("http://b", "T", "r", 1),
        Violations("http://c", "T", "r", 3),
    )
