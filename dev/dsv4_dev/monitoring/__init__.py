"""The local cluster's Prometheus: configured from the shipped monitors and rules."""
