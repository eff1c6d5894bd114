"""The warmup service (docs/design.md §3): predicts the next burst from stream windows, drift clusters,
penetrations, KV events and heat, and warms the tier nodes before it arrives."""
