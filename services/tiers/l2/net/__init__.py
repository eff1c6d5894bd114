"""The L2 network: block frames, the TCP transport, the RDMA adapter and the peer clients."""
