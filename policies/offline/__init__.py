"""Offline bounds that read the future: Belady (OPT)."""
