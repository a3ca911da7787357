"""Benchmarks that print ours, a reference and their ratio in one run. Every module with a
`main` takes `--smoke`: its smallest run through the same code (tests/bench/test_bench_smoke.py
runs each)."""

HELP_SMOKE = "the smallest run of the real code path, for the smoke test; flags given still win"
