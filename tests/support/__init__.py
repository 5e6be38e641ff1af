"""Helpers the tests (and benchmarks) share; never shipped."""
