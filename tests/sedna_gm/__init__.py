"""A stand-in for Sedna's global manager that behaves as it does: the lifelong- and
incremental-learning job controllers' stage machines with their stale status write-back,
informer lag, the websocket's latest-wins queues, the routings, Go re-marshalling, and pods
that run real workers (see `gm`)."""
