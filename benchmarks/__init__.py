"""Benchmarks and load tests of vitpe (not part of the library): `python -m benchmarks.bench`,
`python -m benchmarks.load_test`; `benchmarks.harness` holds what they and the browser tests share."""
