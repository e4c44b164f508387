"""Local mosquitto and redis-server processes on free ports (`serve --embedded`, tests), and
controller replicas as child processes (the demo, tests, benchmarks).

- `process`: `Server`, a child process on a fixed port that can be stopped, restarted,
  frozen (SIGSTOP) and thawed, which is what fault tests need; free ports; binaries.
- `servers`: a mosquitto broker and a redis-server.
- `sentinel`, `cluster`: the replicated Redis topologies tests and the benchmark build from
  them: a master with replicas watched by sentinels, and a Redis Cluster; `replicated` holds
  what they share.
- `controller`: `ControllerProcess`, one `lifelong serve` replica as a child process.

The names other code uses are importable from this package.
"""

from service.embedded.cluster import ClusterTopology, cluster_topology
from service.embedded.controller import ControllerProcess, serve_command
from service.embedded.process import Server, find_binary, free_port, running, wait_port
from service.embedded.sentinel import (
    SENTINEL_FAILOVER_TIMEOUT_MS,
    SentinelTopology,
    sentinel_topology,
)
from service.embedded.servers import mosquitto_server, redis_server

__all__ = [
    "SENTINEL_FAILOVER_TIMEOUT_MS",
    "ClusterTopology",
    "ControllerProcess",
    "SentinelTopology",
    "Server",
    "cluster_topology",
    "find_binary",
    "free_port",
    "mosquitto_server",
    "redis_server",
    "running",
    "sentinel_topology",
    "serve_command",
    "wait_port",
]
