"""The semantic match decision: near-miss guards, a learned per-entry threshold, one decide()."""
