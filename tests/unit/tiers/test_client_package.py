"""The light client package (client/): one implementation the server re-exports, its wire dtype table
equal to the server codec's, and nothing imported beyond httpx, numpy and the standard library."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import cachemesh_client
import numpy as np
from cachemesh_client import client as light

from services.tiers import codec
from services.tiers.edge import client as server_side

CLIENT_DIR = Path(__file__).resolve().parents[3] / "client"


def test_the_server_re_exports_the_client_package() -> None:
    assert server_side.AsyncTiersClient is light.AsyncTiersClient
    assert server_side.TiersClient is cachemesh_client.TiersClient


def test_wire_dtypes_match_the_codec() -> None:
    assert {k: np.dtype(v) for k, v in light.CARRIER.items()} == {
        d.name.lower(): codec.CARRIER[d] for d in codec.DType
    }


# Modules of the package's extras, imported only by those who need them: the value codec (tensors) and
# the vLLM connector (inside vLLM's venv, which has torch); every other module is httpx and stdlib.
EXTRA_IMPORTS = {
    "valuecodec.py": {"numpy"},
    "kvload.py": {"numpy"},
    "vllm.py": {"numpy", "torch", "vllm", "huggingface_hub"},
}


def test_the_package_imports_only_httpx_numpy_and_the_standard_library() -> None:
    # numpy only under TYPE_CHECKING or imported lazily (tensors): text answers need httpx alone
    allowed = {"httpx", "cachemesh_client"} | set(sys.stdlib_module_names)
    for path in (CLIENT_DIR / "cachemesh_client").glob("*.py"):
        imported: set[str] = set()
        tree = ast.parse(path.read_text())
        tree.body = [
            n for n in tree.body if not (isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
        extra = imported - allowed
        assert extra <= EXTRA_IMPORTS.get(path.name, set()), (path.name, extra)
    project = tomllib.loads((CLIENT_DIR / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0] for d in project["dependencies"]] == ["httpx"]
    assert [d.split(">")[0] for d in project["optional-dependencies"]["tensors"]] == ["numpy"]
