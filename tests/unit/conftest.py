"""Unit tests run torch on one thread: the matrices are tiny and the cores are shared."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
