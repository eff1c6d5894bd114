"""cachemesh as vLLM's KV tier: a `KVConnectorBase_V1` that saves the KV blocks vLLM computes into the tier
nodes and loads the blocks they hold into vLLM's paged memory, over the node's API (`POST /v1/prefix`,
`/v1/blocks/fetch`, `/v1/blocks/put`). Install this package into vLLM's venv (`pip install ./client`) and
serve with

    --kv-transfer-config '{"kv_connector": "CachemeshConnector",
        "kv_connector_module_path": "cachemesh_client.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"url": "http://127.0.0.1:8700"}}'

Extra config: `url` (the tier node), `model` (the model identity in block keys; default the served model
name, which the bridge and the gateway must use too), `token` (the node's API token), `lookup_timeout_ms`,
`load_timeout_ms`, `retry_ms` (how long a failed node is left alone), `max_request_bytes`,
`save_queue_blocks`, `shared_memory` (true: on the node's host, copy blocks out of its shared L2 pool).

Blocks are keyed by content (kvkeys.py) and carry model, dtype, shape (layers, kv heads, tokens, K|V)
and token range in their header (valuecodec.py): a block of anything else is a load error, never data
in the attention. What to load and save is decided in kvplan.py. The scheduler side asks the node how
much of a prompt it holds (short timeout; a node that fails is skipped for `retry_ms`); the worker side
loads synchronously before the step's forward pass, and anything that fails (node down, block missing or
corrupt, timeout) is reported through `get_block_ids_with_load_errors`, so vLLM recomputes those blocks
and the request still succeeds. Saves copy the blocks out of paged memory at the end of the step and are
sent by a background thread: the forward pass never waits on the network.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from cachemesh_client.blockframe import MEDIA_TYPE, FetchedBlock, encode_blocks
from cachemesh_client.bulk import NodeError, NodeLink
from cachemesh_client.kvload import BlockLoader, LoadStopped
from cachemesh_client.kvplan import BlockCopy, Planner
from cachemesh_client.valuecodec import CodecError, DType, ValueHeader, encode_parts

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("cachemesh.vllm")

_WIRE_DTYPE = {torch.bfloat16: DType.BFLOAT16, torch.float16: DType.FLOAT16, torch.float32: DType.FLOAT32}
# bfloat16 travels as its bits
_CARRIER = {torch.bfloat16: torch.uint16, torch.float16: torch.float16, torch.float32: torch.float32}
STAT_NAMES = (
    "blocks_loaded",
    "blocks_from_segment",  # of those, copied out of the node's shared L2 pool (same host)
    "load_errors",
    "blocks_saved",
    "save_errors",
    "saves_dropped",
)


@dataclass
class CachemeshMetadata(KVConnectorMetadata):
    """One step's work for the worker: blocks to load (by request) and blocks to save."""

    loads: dict[str, list[BlockCopy]] = field(default_factory=dict)
    saves: list[BlockCopy] = field(default_factory=list)


@dataclass
class CachemeshStats(KVConnectorStats):
    """Counts since the last report; vLLM sums them across workers and exports them (vllm:cachemesh_*)."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class CachemeshPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[tuple[int, str], Any] = {}
        for name in STAT_NAMES:
            counter = self._counter_cls(
                name=f"vllm:cachemesh_{name}",
                documentation=f"cachemesh KV connector: {name.replace('_', ' ')}",
                labelnames=labelnames,
            )
            for engine, values in per_engine_labelvalues.items():
                self._counters[(engine, name)] = counter.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            counter = self._counters.get((engine_idx, name))
            if counter is not None and value:
                counter.inc(value)


@dataclass(frozen=True)
class ConnectorConfig:
    url: str
    model: str
    token: str | None = None
    lookup_timeout_ms: int = 300
    load_timeout_ms: int = 5_000
    retry_ms: int = 2_000
    max_request_bytes: int = 8 << 20
    save_queue_blocks: int = 4_096
    # Copy blocks out of the node's shared L2 segment when the node is on this host (else HTTP).
    shared_memory: bool = True

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any], served_model: str) -> ConnectorConfig:
        if not extra.get("url"):
            raise ValueError("kv_connector_extra_config needs `url`, the tier node's API")
        known = {k: extra[k] for k in cls.__dataclass_fields__ if k in extra}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            log.warning(
                "cachemesh connector: unknown extra config %s (known: %s)",
                unknown,
                list(cls.__dataclass_fields__),
            )
        known.setdefault("model", served_model)
        return cls(**known)


class _Breaker:
    """Skip a node that failed for `retry_ms` (the scheduler must not pay a timeout per request)."""

    def __init__(self, retry_ms: int) -> None:
        self.retry_s = retry_ms / 1000
        self.until = 0.0

    def allow(self) -> bool:
        return time.monotonic() >= self.until

    def failed(self) -> None:
        self.until = time.monotonic() + self.retry_s


_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SAMPLE_BYTES = 1 << 20


def weights_fingerprint(model: str, revision: str | None, config_json: str) -> str:
    """12 hex digits that change when the weights served under a name change: sha256 over the model's
    config and, for a local directory (or the Hugging Face cache's copy), each weight file's name, size
    and 1 MiB read at its start, middle and end (every tensor of a fine-tune moves; reading a whole
    16 GB model at start-up would not do). Two copies of one model agree; another revision does not."""
    h = hashlib.sha256(config_json.encode())
    h.update((revision or "").encode())
    directory = Path(model)
    if not directory.is_dir():
        with contextlib.suppress(Exception):  # a hub id: the local snapshot, if there is one
            from huggingface_hub import snapshot_download

            directory = Path(snapshot_download(model, revision=revision, local_files_only=True))
    if directory.is_dir():
        for path in sorted(p for p in directory.rglob("*") if p.suffix in _WEIGHT_FILES):
            size = path.stat().st_size
            h.update(f"{path.relative_to(directory)}:{size}".encode())
            with open(path, "rb") as f:
                for offset in sorted(
                    {0, max(0, size // 2 - _SAMPLE_BYTES // 2), max(0, size - _SAMPLE_BYTES)}
                ):
                    f.seek(offset)
                    h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()[:12]


class CachemeshConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        served = vllm_config.model_config.served_model_name
        served_name = served[0] if isinstance(served, list | tuple) else str(served)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.config = ConnectorConfig.from_extra(extra, served_name)
        self.block_size = vllm_config.cache_config.block_size
        # Keys name the model as the bridge and the gateway do; the blocks themselves are tagged with
        # the weights too: another revision served under the same name never loads them (a lookup for
        # this tag misses them, and its own blocks replace them as they are saved).
        mc = vllm_config.model_config
        fingerprint = weights_fingerprint(mc.model, mc.revision, mc.hf_config.to_json_string())
        self.tag = f"{self.config.model}#{fingerprint}"
        self._breaker = _Breaker(self.config.retry_ms)
        self._link = NodeLink(
            self.config.url, token=self.config.token, timeout_s=self.config.load_timeout_ms / 1000
        )
        # scheduler side
        self.planner = Planner(model=self.config.model, block_size=self.block_size)
        # worker side
        self._layers: list[torch.Tensor] = []
        self._load_errors: set[int] = set()
        self._stats: dict[str, int] = {}
        self._stats_lock = threading.Lock()  # the saver thread counts too
        self._block_shape: tuple[int, ...] = ()
        self._saver: _Saver | None = None
        self._loader: BlockLoader | None = None
        log.info("cachemesh connector (%s) for %s at %s", role.name, self.tag, self.config.url)

    # --- scheduler side -------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        prompt = request.prompt_token_ids
        if not prompt or getattr(request, "mm_features", None) or getattr(request, "cache_salt", None):
            return 0, False  # multimodal inputs and salts change the KV beyond the token ids
        lora = getattr(request, "lora_request", None)
        keys = self.planner.keys_of(prompt, "" if lora is None else str(lora.lora_name))
        held = self._held(keys) if keys else 0
        return self.planner.matched(request.request_id, keys, held, len(prompt), num_computed_tokens), False

    def _held(self, keys: list[str]) -> int:
        """How many leading blocks of `keys` the node holds; 0 when it cannot say quickly."""
        if not self._breaker.allow():
            return 0
        try:
            answer = self._link.post_json(
                "/v1/prefix",
                {"keys": keys, "model": self.tag},
                timeout_s=self.config.lookup_timeout_ms / 1000,
            )
            return int(answer["prefix_blocks"])
        except (NodeError, ValueError, KeyError, TypeError) as exc:
            self._breaker.failed()
            log.warning("cachemesh prefix lookup failed (%r); computing without it", exc)
            return 0

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.planner.allocated(request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        scheduled: list[tuple[str, list[int] | None, int, int, bool]] = []
        tokens = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            scheduled.append(
                (new.req_id, list(new.block_ids[0]), new.num_computed_tokens, tokens[new.req_id], True)
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set())
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            ids = None if new_ids is None else list(new_ids[0])
            scheduled.append(
                (req_id, ids, cached.num_computed_tokens[i], tokens.get(req_id, 0), req_id in resumed)
            )
        plan = self.planner.step(scheduled)
        return CachemeshMetadata(plan.loads, plan.saves)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self.planner.finished(request.request_id)
        return False, None

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a save that never happens is a later miss, nothing more

    # --- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._layers = list(kv_caches.values())
        first = self._layers[0]
        if first.dtype not in _WIRE_DTYPE:
            log.warning("cachemesh connector: KV dtype %s is not supported; it stays idle", first.dtype)
            self._layers = []
            return
        self._block_shape = (len(self._layers), *first.shape[1:])
        block_bytes = first[0].numel() * first.element_size() * len(self._layers) + 512
        self._loader = BlockLoader(
            self.config.url,
            model=self.tag,
            token=self.config.token,
            block_bytes=block_bytes,
            shared_memory=self.config.shared_memory,
        )
        self._saver = _Saver(self.config, self.tag, self._count)
        log.info(
            "cachemesh connector: %d layers, block %s %s", len(self._layers), self._block_shape, first.dtype
        )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, CachemeshMetadata)
        for copies in meta.loads.values():
            if not self._layers:
                self._fail(copies, "no KV caches registered")
                continue
            self._load(copies)

    def _load(self, copies: list[BlockCopy]) -> None:
        assert self._loader is not None
        shared_before = self._loader.from_segment
        try:
            placed = self._loader.load(
                [c.key for c in copies],
                lambda i, _, array: self._place(copies[i], array),
                check=lambda i, header: self._check(copies[i], header),
                timeout_s=self.config.load_timeout_ms / 1000,
            )
        except LoadStopped as exc:
            placed = int(exc.args[1])
            log.warning("cachemesh load stopped (%s): vLLM recomputes from there", exc.args[0])
        if placed < len(copies):
            self._fail(copies[placed:], "not loaded")
        self._count("blocks_loaded", placed)
        self._count("blocks_from_segment", self._loader.from_segment - shared_before)

    def _check(self, copy: BlockCopy, header: ValueHeader) -> None:
        first = self._layers[0]
        want_range = (copy.index * self.block_size, (copy.index + 1) * self.block_size)
        if (
            header.kind != "kv_block"
            or header.model != self.tag
            or header.dtype != _WIRE_DTYPE[first.dtype]
            or tuple(header.shape) != self._block_shape
            or header.token_range != want_range
        ):
            raise CodecError(
                f"block {copy.key} is {header.model}/{header.dtype.name}/{header.shape}/{header.token_range}"
                f", not {self.tag}/{first.dtype}/{self._block_shape}/{want_range}"
            )

    def _place(self, copy: BlockCopy, array: np.ndarray) -> None:
        first = self._layers[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only buffer: only read from here
            data = torch.from_numpy(array).view(first.dtype)
        for layer, cache in enumerate(self._layers):
            cache[copy.block_id].copy_(data[layer])

    def _fail(self, copies: list[BlockCopy], why: str) -> None:
        self._load_errors.update(c.block_id for c in copies)
        self._count("load_errors", len(copies))
        log.info("cachemesh: %d blocks %s; vLLM recomputes them", len(copies), why)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are whole before the forward pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # saved once the step is done (wait_for_save), all layers at once

    def wait_for_save(self) -> None:
        if not self.has_connector_metadata() or self._saver is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, CachemeshMetadata)
        if not meta.saves:
            return
        ids = torch.tensor([c.block_id for c in meta.saves], dtype=torch.long)
        # One copy out of paged memory, now: the blocks may be reused as soon as the step ends.
        stacked = torch.stack([cache.index_select(0, ids) for cache in self._layers], dim=1)
        self._saver.submit(meta.saves, stacked)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self._stats[name] = self._stats.get(name, 0) + n

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        with self._stats_lock:
            if not any(self._stats.values()):
                return None
            stats, self._stats = self._stats, {}
        return CachemeshStats(data=stats)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return CachemeshStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVConnectorPromMetrics | None:
        return CachemeshPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._saver is not None:
            self._saver.close()
        if self._loader is not None:
            self._loader.close()
        self._link.close()


class _Saver:
    """Sends saved blocks to the node from a thread of its own; when the node falls behind, the oldest
    waiting blocks are dropped (and counted): a cache may miss, an engine must not wait."""

    def __init__(self, config: ConnectorConfig, tag: str, count: Any) -> None:
        self.config = config
        self.tag = tag
        self._count = count
        self._queue: queue.Queue[tuple[list[BlockCopy], torch.Tensor] | None] = queue.Queue()
        self._waiting = 0
        self._lock = threading.Lock()
        self._link = NodeLink(config.url, token=config.token, timeout_s=30.0)
        self._thread = threading.Thread(target=self._run, name="cachemesh-saver", daemon=True)
        self._thread.start()

    def submit(self, copies: list[BlockCopy], stacked: torch.Tensor) -> None:
        with self._lock:
            if self._waiting + len(copies) > self.config.save_queue_blocks:
                self._count("saves_dropped", len(copies))
                return
            self._waiting += len(copies)
        self._queue.put((copies, stacked))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            copies, stacked = item
            try:
                self._send(copies, stacked)
            except Exception as exc:  # the thread must live on; the blocks are a later miss
                self._count("save_errors", len(copies))
                log.warning("cachemesh save of %d blocks failed: %r", len(copies), exc)
            finally:
                with self._lock:
                    self._waiting -= len(copies)

    def _send(self, copies: list[BlockCopy], stacked: torch.Tensor) -> None:
        dtype = stacked.dtype
        bits = stacked.view(_CARRIER[dtype]).numpy()
        size = stacked.shape[-2]  # tokens per block
        batch: list[FetchedBlock] = []
        nbytes = 0
        for i, copy in enumerate(copies):
            header, payload = encode_parts(
                np.ascontiguousarray(bits[i]),
                kind="kv_block",
                model=self.tag,
                layer_range=(0, bits.shape[1]),
                token_range=(copy.index * size, (copy.index + 1) * size),
                dtype=_WIRE_DTYPE[dtype],
            )
            value = header + payload.tobytes()
            if batch and nbytes + len(value) > self.config.max_request_bytes - 4096:
                self._post(batch)
                batch, nbytes = [], 0
            batch.append(FetchedBlock(copy.key, "hit", None, value))
            nbytes += len(value) + len(copy.key) + 8
        if batch:
            self._post(batch)

    def _post(self, batch: list[FetchedBlock]) -> None:
        self._link.post("/v1/blocks/put", encode_blocks(batch), MEDIA_TYPE)
        self._count("blocks_saved", len(batch))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._link.close()
