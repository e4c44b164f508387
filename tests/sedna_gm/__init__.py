"""A stand-in for Sedna's global manager that behaves as it does: the job controller's stage
machine with its stale status write-back, informer lag, the websocket's latest-wins queues,
both routings, Go re-marshalling, and pods that run real workers (see `gm`)."""
