"""Writes the Prometheus file_sd targets of the running mesh (one per service: its metrics port, labelled
`service`) from the launcher's state file, for deploy/prometheus.yml: `python -m deploy.targets [OUT]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from infra.launcher import state_path

DEFAULT_OUT = Path(__file__).resolve().parent / "targets" / "cachemesh.json"


def targets(state: dict[str, object]) -> list[dict[str, object]]:
    """file_sd groups from the launcher's state: each service's health URL names its metrics port."""
    services = state.get("services")
    assert isinstance(services, list)
    out: list[dict[str, object]] = []
    for svc in services:
        url = urlsplit(svc["health_url"])
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
    print(f"{len(groups)} targets written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
