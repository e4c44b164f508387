"""Sedna global manager (GM) link: one websocket to the GM, spoken as Sedna's local controller.

The GM sends ``insert`` and ``delete`` of datasets and lifelong-learning jobs (an update is
sent as ``insert``; the informers' resyncs, every 30-60 s by default, re-send every
resource); ``content`` is the whole resource, also on delete. The local controller sends
``status`` frames. Nothing is acknowledged in either direction. The GM replaces a dataset's
status with each dataset status it reads, but appends one condition to a lifelong-learning
job's status per job status it reads (so one read twice shows twice, and one whose
``status`` is not ready/completed/failed/waiting is logged and dropped).

- `address`: where to dial (Sedna's ``GM_ADDRESS`` or a ``ws://``/``wss://`` URL, TLS).
- `frames`: the frames, encoded exactly as Sedna's Go code writes them.
- `link`: `GmLink`, the connection: dialing, redialing, sending, handing frames on.
- `reporting`: what the link reports (`LinkState`) and the metrics hooks it calls.

The names other code uses are importable from this package.
"""

from service.adapters.gm.address import GmEndpoint, parse_gm_address
from service.adapters.gm.frames import (
    HELLO_FRAME,
    GmFrame,
    GmRejected,
    encode_frame,
    go_json_string,
)
from service.adapters.gm.link import GmLink, GmLinkSettings
from service.adapters.gm.reporting import GmObserver, LinkState, LinkStatus

__all__ = [
    "HELLO_FRAME",
    "GmEndpoint",
    "GmFrame",
    "GmLink",
    "GmLinkSettings",
    "GmObserver",
    "GmRejected",
    "LinkState",
    "LinkStatus",
    "encode_frame",
    "go_json_string",
    "parse_gm_address",
]
