"""The canary rollout of engine feature flags: decisions as data (`decide`), I/O elsewhere."""
