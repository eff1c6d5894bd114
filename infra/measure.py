"""Times the embedded servers' bring-up: jar fetch, first start, restart, stop (`python -m infra.measure`).

`--cold` uses an empty cachemesh cache (so the jars are copied and the class archive rebuilt); add
`--cold-maven` to bypass ~/.m2 as well, which is what a fresh machine pays.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

from infra.kafka_broker import ApacheKafkaBroker
from infra.postgres import EmbeddedPostgres
from infra.process import ManagedServer
from infra.tansu_broker import TansuBroker


def _timed(action: Callable[[], None]) -> float:
    began = time.monotonic()
    action()
    return time.monotonic() - began


def measure(make: Callable[[], ManagedServer]) -> dict[str, float]:
    """First start (with storage format / initdb), restart, stop, then a second fresh start."""
    server = make()
    figures: dict[str, float] = {}
    server.start()
    figures["first start"] = server.start_seconds
    if isinstance(server, ApacheKafkaBroker):
        figures["jar fetch"] = server.fetch_seconds
    server.restart()
    figures["restart"] = server.start_seconds
    figures["stop"] = _timed(server.stop)
    again = make()
    again.start()
    figures["second fresh start"] = again.start_seconds
    again.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cold", action="store_true", help="start from an empty cachemesh cache")
    parser.add_argument("--cold-maven", action="store_true", help="and an empty Maven repository")
    parser.add_argument("--only", choices=["kafka", "tansu", "postgres"], action="append")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="cachemesh-measure-")
    if args.cold or args.cold_maven:
        os.environ["CACHEMESH_CACHE_DIR"] = os.path.join(scratch.name, "cache")
    if args.cold_maven:
        os.environ["MAVEN_OPTS"] = f"-Dmaven.repo.local={os.path.join(scratch.name, 'm2')}"
    makers: dict[str, Callable[[], ManagedServer]] = {
        "kafka": ApacheKafkaBroker,
        "tansu": TansuBroker,
        "postgres": EmbeddedPostgres,
    }
    with scratch:
        for name, make in makers.items():
            if args.only and name not in args.only:
                continue
            figures = measure(make)
            print(
                f"{name:9}" + "  ".join(f"{key} {value:6.2f} s" for key, value in figures.items()), flush=True
            )


if __name__ == "__main__":
    main()
