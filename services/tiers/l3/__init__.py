"""L3 on Postgres (`store`: the value and descriptor ports and their adapter) and its circuit breaker."""
