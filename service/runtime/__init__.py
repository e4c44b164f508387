"""The imperative shell around the pure core, one module per stage of an event's path:
intake (decode -> durable ingress -> ack), processor (lease -> load -> transition -> fenced
commit), executor (effects), outbox (upstream, to MQTT and the GM), with rejections and
leases beside them and the processor's in-process inbox (handoff) between them, wired by
`replica.Replica`."""

from service.runtime.replica import Replica, Tuning

__all__ = ["Replica", "Tuning"]
