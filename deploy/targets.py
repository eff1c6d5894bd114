"""Writes the Prometheus file_sd targets of the running mesh from the launcher's state file, for
deploy/prometheus.yml: the services not on their fixed metrics port (a fallback or an override), which the
config's static list cannot name. `python -m deploy.targets [OUT]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from infra.launcher import METRICS_PORTS, state_path

DEFAULT_OUT = Path(__file__).resolve().parent / "targets" / "cachemesh.json"


def targets(state: dict[str, object]) -> list[dict[str, object]]:
    """file_sd groups from the launcher's state, one per service whose metrics port (named by its health
    URL) is not the fixed one deploy/prometheus.yml lists already."""
    services = state.get("services")
    assert isinstance(services, list)
    out: list[dict[str, object]] = []
    for svc in services:
        url = urlsplit(svc["health_url"])
        if url.hostname == "127.0.0.1" and url.port == METRICS_PORTS.get(svc["name"]):
            continue  # scraped through the static list
        out.append(
            {
                "targets": [url.netloc],
                "labels": {"service": svc["name"], "namespace": str(state.get("namespace") or "")},
            }
        )
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    try:
        state = json.loads(state_path().read_text())
    except FileNotFoundError:
        print(
            f"cachemesh is not up (no state file at {state_path()}); start it with `make run`",
            file=sys.stderr,
        )
        return 3
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    groups = targets(state)
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    tmp.replace(out)  # Prometheus may read it at any time: never half written
    moved = ", ".join(g["labels"]["service"] for g in groups) or "none"  # type: ignore[index]
    print(f"{len(groups)} targets off their fixed metrics port ({moved}) written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
