"""FIFO-based policies with lazy promotion: S3-FIFO and SIEVE."""
