"""Admission, apart from eviction: the count-min frequency sketch and the TinyLFU duel over it."""

from policies.admission.sketch import FrequencySketch, stable_hash
from policies.admission.tinylfu import HASHDOS_THRESHOLD, TinyLFU

__all__ = ["HASHDOS_THRESHOLD", "FrequencySketch", "TinyLFU", "stable_hash"]
