"""Topic names, internal topics sized like faust expects, and the hand-off records on the wire."""

from __future__ import annotations

import json

from schemas.events import CacheAccessed
from services.runtime.settings import KafkaSettings
from streams.records import Partial, Progress, decode_handoff, parse_table_key, table_key
from streams.settings import StreamsSettings
from streams.topology import internal_topics, names
from streams.windows import PaneAggregate


def test_names_carry_the_namespace_and_the_app_id() -> None:
    s = StreamsSettings(kafka=KafkaSettings(topic_namespace="t1."))
    n = names(s)
    assert (n.app_id, n.access, n.window, n.drift) == (
        "t1.cachemesh-streams",
        "t1.cache.access.v1",
        "t1.stream.window.v1",
        "t1.stream.drift.v1",
    )
    assert n.ingest_table == "t1.cachemesh-streams-ingest-changelog"
    assert n.dlq(n.access) == "t1.cache.access.dlq.v1"


def test_internal_topics_match_the_partitions_faust_checks() -> None:
    s = StreamsSettings(partitions=4)
    by_name = {t.name: t for t in internal_topics(s, source_count=6)}
    assert by_name["cachemesh-streams-ingest-changelog"].partitions == 6  # as the source topic
    assert by_name["cachemesh-streams-merge-changelog"].partitions == 4  # as the hand-off topic
    assert by_name["cachemesh-streams-handoff"].partitions == 4
    assert by_name["cachemesh-streams-__assignor-__leader"].partitions == 1
    changelog = by_name["cachemesh-streams-merge-changelog"].configs()
    assert changelog["cleanup.policy"] == "compact" and "retention.ms" not in changelog
    assert int(changelog["max.message.bytes"]) >= 1024 * 1024


def test_hand_off_records_round_trip_through_json() -> None:
    agg = PaneAggregate.for_group(("s0", None))
    agg.add(CacheAccessed(key="k", hit=False, tier="l2", layer="token", latency_ms=400.0, service="svc"))
    partial = Partial(3, ("s0", None), 1_000, agg)
    back = decode_handoff(json.loads(json.dumps(partial.to_json())))
    assert isinstance(back, Partial) and back.group == ("s0", None) and back.pane_start_ms == 1_000
    assert back.aggregate.to_json() == agg.to_json()
    progress = Progress(6, {0: 5_000, 5: 4_000})
    assert decode_handoff(json.loads(json.dumps(progress.to_json()))) == progress


def test_table_keys_are_unambiguous_whatever_the_names() -> None:
    key = table_key("pane", 2, "s|0", None, 1_000)
    assert parse_table_key(key) == ["pane", 2, "s|0", None, 1_000]
