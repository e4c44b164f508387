"""The imperative shell around the pure core: decode -> ingress -> lease -> load ->
transition -> commit -> effects -> ack, one collaborator per responsibility, wired by
`replica.Replica`."""

from service.runtime.replica import Replica, Tuning

__all__ = ["Replica", "Tuning"]
