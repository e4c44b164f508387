"""Local servers and controllers as child processes: mosquitto and redis-server on free ports
(`serve --embedded`, the demo, tests), the replicated Redis topologies built from them, and
controller replicas (the demo, tests, benchmarks).

- `processes`: `Server`, a child process on a fixed port that can be stopped, restarted,
  frozen (SIGSTOP) and thawed, which is what fault tests need; free ports; binaries; a
  mosquitto broker and a redis-server; `ControllerProcess`, one `lifelong serve` replica as a
  child process.
- `topologies`: the replicated Redis topologies tests and the benchmark build from them: a
  master with replicas watched by sentinels, and a Redis Cluster.
"""
