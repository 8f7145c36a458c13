"""Moved: `python -m benchmarks.bench` (benchmarks/bench.py, beside this package); this alias forwards to it."""
import sys

if __name__ == "__main__":
    print("note: vitpe_core.bench moved: running `python -m benchmarks.bench`", file=sys.stderr)
    from benchmarks.bench import main
    sys.exit(main())
