"""`pip install ./client` into a fresh venv (real pip, from PyPI or pip's wheel cache): it stays under
100 MB (about 30: httpx and pip) with no server dependency (no torch, no numpy), and the README's quick
start, pasted as it is with only the node's URL changed, runs against a real tier node on real Kafka
and Postgres."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.nodes import running, until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "client"
MAX_BYTES = 100 * 1024 * 1024


def _quickstart() -> str:
    readme = (CLIENT / "README.md").read_text()
    block = re.search(r"<!-- quickstart -->\s*```python\n(.*?)```\s*<!-- /quickstart -->", readme, re.S)
    assert block, "client/README.md lost its quick start block"
    return block.group(1)


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.timeout(600)
async def test_client_installs_light_and_its_quick_start_runs(
    kafka, topics_on, node_settings, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "venv", str(venv)], check=True, timeout=120
    )
    py = venv / "bin" / "python"
    # built from a copy of the sources, to check the build leaves nothing beside them
    source = tmp_path / "client"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = await asyncio.to_thread(
        subprocess.run,
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(source)],
        capture_output=True,
        text=True,
        timeout=480,
        env=env,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    assert not {"build", "cachemesh_client.egg-info"} & {p.name for p in source.iterdir()}  # a clean checkout
    size = _size(venv)
    assert size < MAX_BYTES, f"the client's venv is {size / 2**20:.0f} MB"
    site = next(venv.glob("lib/python*/site-packages"))
    installed = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"cachemesh_client", "httpx"} <= installed
    # numpy comes with the `tensors` extra only; nothing of the server comes at all
    assert not installed & {"numpy", "torch", "fastapi", "aiokafka", "asyncpg", "cachemesh"}, installed

    await topics_on(kafka)
    # the quick start looks up by text: this node embeds with the real MiniLM model
    async with running(node_settings("client", embedder_preload=True)) as node:
        # a person runs the quick start on a node that is up: its model loaded (slow on a busy machine)
        await until(lambda: node.embedder.health()["state"] == "ready", timeout_s=120, step_s=0.1)
        script = _quickstart().replace("http://127.0.0.1:8700", node.api_url)
        done = await asyncio.to_thread(
            subprocess.run,
            [str(py), "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    same, paraphrase, by_key, rate = done.stdout.strip().splitlines()
    assert same == "Paris"
    # a new node serves nothing by similarity: the paraphrase misses and is offered for exploration
    hit, rule, similarity = paraphrase.split()
    assert hit == "False" and rule == "uncertain" and float(similarity) > 0.9, paraphrase
    assert by_key == "Paris"
    assert 0 < float(rate) <= 1
    print(f"client venv: {size / 2**20:.1f} MB; quick start printed {done.stdout!r}")
