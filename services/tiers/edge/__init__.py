"""The edges of a tier node: the HTTP API, the Python client, and the text embedder the API uses."""
