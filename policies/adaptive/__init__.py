"""Adaptive policies that balance recency and frequency: ARC, LIRS, W-TinyLFU."""
