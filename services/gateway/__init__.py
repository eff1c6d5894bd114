"""The OpenAI-compatible gateway (issue 18): answers `/v1/chat/completions` and `/v1/completions` from
the cache when it can, forwards a miss to the upstream model server and stores its answer."""
