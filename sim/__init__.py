"""The trace simulator: trace parsers (`traces`), the replayer (`replay`), the burst scenario
(`burst`) and the `cachemesh replay` command (`cli`). Imports `policies`, never a service."""
