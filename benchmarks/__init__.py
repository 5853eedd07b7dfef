"""slate's speed harness: ``python -m benchmarks`` writes ``benchmarks/RESULTS.md``."""
