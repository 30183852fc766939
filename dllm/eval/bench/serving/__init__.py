"""``dllm bench serve``: the load generator (``serve``), the servers it starts (``servers``: a process
per mode, or a thread), the loopback transport (``loopback``) and its tables (``serve_table``)."""
