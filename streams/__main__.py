"""`python -m streams`: one faust worker, configured from the environment (see `StreamsSettings`).

Creates the catalogue and the worker's internal topics first (partition counts matching what faust
checks), then runs the worker until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile

import faust
from aiokafka.admin import AIOKafkaAdminClient

from infra.topics import ensure_topics
from schemas.topics import BY_NAME
from services.runtime.logs import configure_logging
from streams.app import StreamsApp
from streams.settings import StreamsSettings
from streams.topology import internal_topics, names

log = logging.getLogger("streams")


async def prepare(settings: StreamsSettings) -> int:
    """Creates the topics; returns the partition count of the source topic."""
    bootstrap, namespace = settings.kafka.bootstrap, settings.kafka.topic_namespace
    if settings.create_topics:
        await ensure_topics(bootstrap, namespace)
    count = settings.source_partitions or await _partitions_of(bootstrap, names(settings).access)
    count = count or BY_NAME["cache.access.v1"].partitions
    if settings.create_topics:
        await ensure_topics(bootstrap, namespace, internal_topics(settings, count))
    changelog = names(settings).ingest_table
    have = await _partitions_of(bootstrap, changelog)
    if have and have != count:
        raise SystemExit(
            f"{changelog} has {have} partitions but the source topic has {count}; "
            "they must match (delete the changelog or set CACHEMESH_STREAMS_SOURCE_PARTITIONS)"
        )
    return count


async def _partitions_of(bootstrap: str, topic: str) -> int | None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="cachemesh-streams-setup")
    await admin.start()
    try:
        for desc in await admin.describe_topics([topic]):
            if desc.get("topic") == topic and not desc.get("error_code"):
                return len(desc.get("partitions", [])) or None
        return None
    finally:
        await admin.close()


def main() -> None:
    settings = StreamsSettings()
    configure_logging("streams", settings.log_level)
    source_count = asyncio.run(prepare(settings))
    asyncio.set_event_loop(asyncio.new_event_loop())
    with contextlib.ExitStack() as stack:
        # The tables live in memory and come back from their changelogs: a scratch directory will do.
        data_dir = settings.data_dir or stack.enter_context(
            tempfile.TemporaryDirectory(prefix="cachemesh-streams-")
        )
        streams = StreamsApp(settings, source_count=source_count, data_dir=data_dir)
        log.info(
            "starting the streams worker",
            extra={"app_id": streams.names.app_id, "web_port": streams.web_port, "data_dir": data_dir},
        )
        worker = faust.Worker(
            streams.app, loglevel=settings.log_level.lower(), quiet=True, override_logging=False
        )
        worker.execute_from_commandline()


if __name__ == "__main__":
    main()
