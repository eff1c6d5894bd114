"""First-token latency as a function of the cache miss rate (docs/design.md §2.1): FTL = base + m * delta.

`FtlFit` fits base and delta online by ordinary least squares from observed (m, FTL) pairs, one fit
per model, from running sums (O(1) memory, exact). `kv_miss_rate` estimates m from the KV capacity;
unlike the source's formula it counts the KV heads (grouped-query attention keeps fewer KV heads than
query heads, so a GQA model needs `kv_heads` times the source's per-head figure, not all heads).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FtlFit:
    """Least squares of FTL on m from running sums; `forget` < 1 weights recent pairs more."""

    n: float = 0.0
    sum_m: float = 0.0
    sum_mm: float = 0.0
    sum_f: float = 0.0
    sum_mf: float = 0.0
    forget: float = 1.0

    def observe(self, miss_rate: float, ftl_ms: float, weight: float = 1.0) -> None:
        if not (0.0 <= miss_rate <= 1.0) or ftl_ms < 0 or weight <= 0:
            raise ValueError(f"bad FTL observation m={miss_rate} ftl={ftl_ms} weight={weight}")
        f = self.forget
        self.n = f * self.n + weight
        self.sum_m = f * self.sum_m + weight * miss_rate
        self.sum_mm = f * self.sum_mm + weight * miss_rate * miss_rate
        self.sum_f = f * self.sum_f + weight * ftl_ms
        self.sum_mf = f * self.sum_mf + weight * miss_rate * ftl_ms

    @property
    def fitted(self) -> bool:
        """Two distinct miss rates are needed before the slope means anything."""
        return self.n > 0 and self._var_m() > 1e-9

    def _var_m(self) -> float:
        return self.sum_mm / self.n - (self.sum_m / self.n) ** 2 if self.n > 0 else 0.0

    def params(self) -> tuple[float, float]:
        """(base_ms, delta_ms); before a fit, (mean FTL, 0)."""
        if self.n <= 0:
            return 0.0, 0.0
        mean_m, mean_f = self.sum_m / self.n, self.sum_f / self.n
        var = self._var_m()
        if var <= 1e-9:
            return mean_f, 0.0
        cov = self.sum_mf / self.n - mean_m * mean_f
        delta = cov / var
        return mean_f - delta * mean_m, delta

    def predict(self, miss_rate: float) -> float:
        base, delta = self.params()
        return base + miss_rate * delta

    def to_dict(self) -> dict[str, float]:
        return {
            "n": self.n,
            "sum_m": self.sum_m,
            "sum_mm": self.sum_mm,
            "sum_f": self.sum_f,
            "sum_mf": self.sum_mf,
            "forget": self.forget,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, float]) -> FtlFit:
        return cls(**{k: float(raw[k]) for k in ("n", "sum_m", "sum_mm", "sum_f", "sum_mf", "forget")})


@dataclass(frozen=True, slots=True)
class KvShape:
    """What one token's KV costs: layers x kv_heads x head_dim, at `bytes_per_value` (fp16 = 2)."""

    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_value: int = 2

    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value  # 2: K and V


def kv_bytes_needed(seq_len: int, shape: KvShape) -> int:
    return seq_len * shape.bytes_per_token()


def kv_miss_rate(seq_len: int, shape: KvShape, capacity_bytes: int) -> float:
    """m = clamp((need - capacity) / need, 0, 1) with need counting every KV head."""
    need = kv_bytes_needed(seq_len, shape)
    if need <= 0:
        return 0.0
    return min(1.0, max(0.0, (need - capacity_bytes) / need))


def seed_miss_rate(seq_len: int, shape: KvShape, capacity_bytes: int) -> float:
    """The source's estimate (docs/design.md §2.1), which leaves the heads out (kept to show how far off
    it is)."""
    need = 2 * seq_len * shape.head_dim * shape.layers * shape.bytes_per_value
    return min(1.0, max(0.0, (need - capacity_bytes) / need)) if need > 0 else 0.0


class FtlModels:
    """One `FtlFit` per model name; the checkpoint is plain JSON."""

    def __init__(self, forget: float = 1.0) -> None:
        self.forget = forget
        self.fits: dict[str, FtlFit] = {}

    def observe(self, model: str, miss_rate: float, ftl_ms: float, weight: float = 1.0) -> FtlFit:
        fit = self.fits.get(model)
        if fit is None:
            fit = self.fits[model] = FtlFit(forget=self.forget)
        fit.observe(miss_rate, ftl_ms, weight)
        return fit

    def to_dict(self) -> dict[str, dict[str, float]]:
        return {model: fit.to_dict() for model, fit in self.fits.items()}

    def load(self, raw: dict[str, dict[str, float]]) -> None:
        self.fits = {model: FtlFit.from_dict(values) for model, values in raw.items()}
