"""The vLLM KV-event bridge: vLLM KV events (ZMQ) in, kv.events.v1 out."""
