"""Helpers of the e2e control-plane harness (tests only; imported by cluster.py and conftest)."""
