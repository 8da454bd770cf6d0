"""Load tests: scheduler requeue latency per unblocking event and DRA scheduling throughput, driven by
locust against a real 1.37 control plane. See docs/load.md."""
