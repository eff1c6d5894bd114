"""Frequency policies: LFU."""
