"""The contracts of cachemesh: events, the cache descriptor, the topic catalogue, SQL migrations."""

from schemas.descriptor import CacheDescriptor
from schemas.events import EVENT_TYPES, AnyEvent, Event
from schemas.topics import CATALOGUE, Topic, dlq_name
from schemas.wire import DecodeError, decode, encode

__all__ = [
    "CATALOGUE",
    "EVENT_TYPES",
    "AnyEvent",
    "CacheDescriptor",
    "DecodeError",
    "Event",
    "Topic",
    "decode",
    "dlq_name",
    "encode",
]
