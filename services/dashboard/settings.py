"""Settings of the dashboard (env prefix CACHEMESH_DASHBOARD_): where the tier nodes are, how often
their stats are sampled and how much history the page keeps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from services.runtime.settings import ServiceSettings


def default_state_file() -> Path:
    """The launcher's state file (`infra.launcher.state_path()`, the same rule; services do not import
    infra): it names every service's health URL, and so the tier nodes' API."""
    configured = os.environ.get("CACHEMESH_CACHE_DIR")
    base = Path(configured).expanduser() if configured else Path.home() / ".cache" / "cachemesh"
    return base / "run" / "state.json"


class DashboardSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CACHEMESH_DASHBOARD_", frozen=True, extra="ignore")

    # Tier node API base URLs ("http://127.0.0.1:8700,..."); empty: found through the state file.
    tiers_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Gateway health URLs ("http://127.0.0.1:8712/healthz,..."), whose reports carry the routing over
    # engine instances; empty: found through the state file.
    gateway_health_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    state_file: Path = Field(default_factory=default_state_file)
    # A port people can remember for the page (it is served on the metrics port too, 8711 under the
    # launcher). 0 picks a free port, None serves it on the metrics port only.
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = 8790
    poll_interval_ms: Annotated[int, Field(gt=0)] = 1_000
    # Points per series the page can draw: 600 samples at 1 s are the last ten minutes.
    max_points: Annotated[int, Field(gt=0)] = 600
    max_rows: Annotated[int, Field(gt=0)] = 20
    request_timeout_s: Annotated[float, Field(gt=0)] = 2.0

    @field_validator("tiers_urls", "gateway_health_urls", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
        return value
