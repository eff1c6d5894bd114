"""`make bench`: runs every benchmark in turn with its default options (each prints its own table), then
writes docs/benchmark-results.md from bench/results/ (bench/report.py).

`python -m bench broker policies` runs only those; `python -m bench --docs` only writes the page."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

from bench import report


def benchmarks() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_") and m.name != "report"
    )


def main(argv: list[str]) -> int:
    if argv == ["--docs"]:
        print(f"wrote {report.write()}")
        return 0
    chosen = argv or benchmarks()
    unknown = sorted(set(chosen) - set(benchmarks()))
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {benchmarks()}", file=sys.stderr)
        return 2
    failed = []
    for name in chosen:
        print(f"\n=== bench.{name} ===", flush=True)
        # Each in its own interpreter: benchmarks start servers and set process-wide state.
        if subprocess.call([sys.executable, "-m", f"bench.{name}"]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    print(f"wrote {report.write()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
