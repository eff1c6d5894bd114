"""L3 on Postgres (`store`: the adapter of the value and descriptor ports in `tiers/ports.py`) and its
circuit breaker."""
