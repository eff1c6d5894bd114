"""`cachemesh`: the one entry point for people. Bring the mesh up, ask how it is, export schemas,
create topics, migrate, replay traces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import aiohttp
import typer
from pydantic import SecretStr
from rich.console import Console
from rich.live import Live
from rich.table import Table

from sim import cli as replay_cli

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
schemas_app = typer.Typer(help="Event contracts: JSON Schema and golden payloads.", no_args_is_help=True)
app.add_typer(schemas_app, name="schemas")

console = Console(stderr=True)

_STYLE = {"healthy": "green", "degraded": "yellow", "starting": "yellow", "down": "red", "unhealthy": "red"}


def _where(addresses: list[tuple[str, str]]) -> Table:
    table = Table(title="where", title_justify="left", expand=False, show_header=False, box=None)
    table.add_column("what")
    table.add_column("URL")
    for what, url in addresses:
        table.add_row(what, f"[link={url}]{url}[/link]")
    return table


def _table(rows: list[tuple[str, str, str]], title: str) -> Table:
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("component")
    table.add_column("state")
    table.add_column("detail", overflow="fold")
    for name, state, detail in rows:
        table.add_row(name, f"[{_STYLE.get(state, 'white')}]{state}[/]", detail)
    return table


@app.command()
def up(
    broker: Annotated[
        str | None, typer.Option(help="kafka (default) or tansu; ignored when KAFKA_BOOTSTRAP is set")
    ] = None,
    service: Annotated[
        list[str] | None, typer.Option("--service", "-s", help="Run only these services (default: all)")
    ] = None,
    for_seconds: Annotated[
        float | None, typer.Option(help="Stop by itself this long after all components are healthy")
    ] = None,
    vllm: Annotated[
        int,
        typer.Option(
            min=0, max=4, help="Also serve this many local vLLM instances (a small model) behind the gateway"
        ),
    ] = 0,
) -> None:
    """Start broker, Postgres and every service; show their status; Ctrl-C stops everything."""
    from infra.launcher import discover_services, existing_launcher, mesh_from_env

    began = time.monotonic()
    running = existing_launcher()
    if running is not None:
        console.print(f"[red]cachemesh is already up (launcher pid {running}); stop it first.[/]")
        raise typer.Exit(1)
    unknown = sorted(set(service or []) - set(discover_services()))
    if unknown:
        console.print(f"[red]unknown service(s) {unknown}; known: {discover_services()}[/]")
        raise typer.Exit(2)
    mesh = mesh_from_env(broker, service, vllm=vllm)
    stop = asyncio.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        with console.status("starting") as status:
            await mesh.up(on_progress=lambda step: status.update(step))
        for notice in mesh.notices:
            console.print(f"[yellow]{notice}[/]")
        healthy_at: float | None = None
        async with aiohttp.ClientSession() as session:
            with Live(_table(mesh.rows(), "cachemesh"), console=console, refresh_per_second=4) as live:
                while not stop.is_set():
                    await mesh.poll_health(session)
                    if healthy_at is None and mesh.all_healthy():
                        healthy_at = time.monotonic()
                        mesh.timings["all_healthy_s"] = healthy_at - began
                        live.console.print(
                            f"[green]all up in {healthy_at - began:.1f} s[/] "
                            f"(broker {mesh.timings['broker_start_s']:.1f} s, "
                            f"Postgres {mesh.timings['postgres_start_s']:.1f} s); Ctrl-C stops everything"
                        )
                        for s in mesh.services:  # up, but a client does not get everything: say what
                            if s.state == "degraded":
                                live.console.print(f"[yellow]{s.name} degraded: {s.detail}[/]")
                        live.console.print(_where(mesh.addresses()))
                    live.update(_table(mesh.rows(), "cachemesh"))
                    if for_seconds is not None and healthy_at is not None:
                        if time.monotonic() - healthy_at >= for_seconds:
                            break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.5)

    try:
        asyncio.run(main())
    finally:
        console.print("stopping: services, then Postgres, then the broker")
        mesh.down()
        console.print("stopped")
    print(json.dumps({"timings": mesh.timings}))


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output")] = False) -> None:
    """Health of every component of the mesh `cachemesh up` started: healthy, degraded (up, serving
    what it can; the detail says what not), unhealthy or down. Exit 0 when none is unhealthy or down."""
    from infra.launcher import addresses, state_path

    try:
        state = json.loads(state_path().read_text())
    except FileNotFoundError:
        message = "cachemesh is not up (no state file at " + str(state_path()) + ")"
        console.print(message)  # stderr
        if as_json:
            # stdout stays JSON of the same shape for a script: no components (exit code 3 says why)
            print(json.dumps([]))
        raise typer.Exit(3) from None
    rows, where = asyncio.run(_status_rows(state))
    if as_json:
        print(
            json.dumps(
                [{"component": n, "state": s, "detail": d, "endpoints": where.get(n, {})} for n, s, d in rows]
            )
        )
    else:
        out = Console()
        out.print(_table(rows, "cachemesh status"))
        out.print(_where(addresses(list(where.items()))))
    raise typer.Exit(0 if all(s in ("healthy", "degraded") for _, s, _ in rows) else 1)


async def _status_rows(
    state: dict[str, object],
) -> tuple[list[tuple[str, str, str]], dict[str, dict[str, str]]]:
    """The rows of the status table, and each service's endpoints."""
    import asyncpg

    from infra.kafka_probe import broker_count
    from infra.launcher import http_health

    rows: list[tuple[str, str, str]] = []
    where: dict[str, dict[str, str]] = {}
    broker = state["broker"]
    assert isinstance(broker, dict)
    try:
        count = await asyncio.to_thread(broker_count, broker["bootstrap"], 2.0)
        rows.append(("broker", "healthy" if count else "down", f"{broker['name']} at {broker['bootstrap']}"))
    except OSError as exc:
        rows.append(("broker", "down", f"{broker['bootstrap']}: {exc}"))
    pg = state["postgres"]
    assert isinstance(pg, dict)
    dsn = pg.get("dsn") or os.environ.get("DATABASE_URL")
    try:
        conn = await asyncpg.connect(dsn, timeout=3)
        await conn.fetchval("SELECT 1")
        await conn.close()
        rows.append(("postgres", "healthy", pg["dsn_redacted"]))
    except Exception as exc:
        rows.append(("postgres", "down", f"{pg['dsn_redacted']}: {type(exc).__name__}"))
    services = state.get("services") or []
    assert isinstance(services, list)
    async with aiohttp.ClientSession() as session:
        for svc in services:
            found, detail, endpoints = await http_health(session, svc["health_url"], "unreachable")
            rows.append((svc["name"], found, f"{detail} ({svc['health_url']})"))
            where[svc["name"]] = endpoints
        engines = state.get("engines") or []
        assert isinstance(engines, list)
        for engine in engines:
            rows.append((engine["name"], await _engine_state(session, engine["url"]), str(engine["model"])))
            where[engine["name"]] = {f"{engine['name']}, vLLM (OpenAI base_url)": f"{engine['url']}/v1"}
    return rows, where


async def _engine_state(session: aiohttp.ClientSession, url: str) -> str:
    """A vLLM instance's state from its /health: healthy (200), unhealthy (other), down (no answer)."""
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=3)) as response:
            return "healthy" if response.status == 200 else "unhealthy"
    except (aiohttp.ClientError, TimeoutError):
        return "down"


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="How long the traffic runs")] = 30.0,
    trace_s: Annotated[float, typer.Option(help="Mooncake trace time replayed in that span")] = 600.0,
    pairs: Annotated[int, typer.Option(help="Q&A paraphrase pairs put and asked (at most)")] = 300,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (stdout) only")] = False,
) -> None:
    """Drive realistic traffic through the running mesh (Mooncake KV events, semantic Q&A); print the
    dashboard URL and a summary. Finds the mesh from `cachemesh up`'s state file."""
    from infra.demo import DemoPlan, main

    raise typer.Exit(main(DemoPlan(seconds=seconds, trace_s=trace_s, pairs=pairs), as_json=as_json))


# The replayer imports torch only when the heat policy is asked for.
app.command("replay")(replay_cli.replay)


@schemas_app.command("export")
def schemas_export(
    jsonschema_dir: Annotated[Path | None, typer.Option(help="Where to write JSON Schema files")] = None,
    golden_dir: Annotated[Path | None, typer.Option(help="Where to write golden payloads")] = None,
) -> None:
    """Write a JSON Schema file per event type and a golden payload for new types."""
    from schemas.export import GOLDEN_DIR, JSONSCHEMA_DIR, export

    written = export(jsonschema_dir or JSONSCHEMA_DIR, golden_dir or GOLDEN_DIR)
    for path in written:
        print(path)


@app.command()
def topics(
    bootstrap: Annotated[str, typer.Option(envvar="KAFKA_BOOTSTRAP", help="Kafka bootstrap servers")],
    namespace: Annotated[str, typer.Option(envvar="KAFKA_TOPIC_NAMESPACE", help="Topic name prefix")] = "",
    replication_factor: Annotated[int, typer.Option(help="Replicas per partition")] = 1,
) -> None:
    """Create the catalogue's topics on a cluster (idempotent)."""
    from services.runtime.topics import ensure_topics

    created = asyncio.run(ensure_topics(bootstrap, namespace, replication_factor=replication_factor))
    print(json.dumps({"created": created}))


@app.command()
def migrate() -> None:
    """Apply the SQL migrations to DATABASE_URL (idempotent)."""
    from services.runtime.postgres import Database, apply_migrations
    from services.runtime.settings import PostgresSettings

    if not os.environ.get("DATABASE_URL"):
        console.print("[red]DATABASE_URL is not set[/]")
        raise typer.Exit(2)

    async def run() -> list[str]:
        settings = PostgresSettings(database_url=SecretStr(os.environ["DATABASE_URL"]))
        db = Database(settings)
        await db.start()
        try:
            return await apply_migrations(db, settings.cachemesh_embedding_dim)
        finally:
            await db.stop()

    print(json.dumps({"applied": asyncio.run(run())}))


if __name__ == "__main__":
    app()
