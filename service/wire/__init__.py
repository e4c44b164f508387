"""The wire contract: msgspec types for every message on the wire, and their decoders.

Everything that crosses the service's edge is decoded and validated by these decoders, once,
so the rest of the service only ever sees well-formed, frozen values. Decoders raise
:class:`~service.errors.InvalidMessage` (reason + JSON path such as
``$.spec.dataset.trainProb``) and nothing else, whatever bytes arrive: the broker and the HTTP
endpoint are untrusted, and a crashing decoder would take the controller down with it
(Sedna's bug 6, docs/lifecycle.md).

One module per part of the contract; `from service import wire` is the one import of it:

- `base`: the struct base every wire type shares, the JSON encoders, how much an inbound
  message and each free-form field may hold, and bytes to a JSON object, its caps checked
  before it is parsed.
- `fields`: the constrained field types and the reasons a refused value is given.
- `resources`: Sedna's Dataset, LifelongLearningJob, Model, JointInferenceService and
  FederatedLearningJob, and the downstream envelope.
- `credentials`: the S3 credential a resource's annotation names.
- `downstream`: the envelope and resource decoders, the events they yield, and the fields a
  resource carries that its type does not know.
- `workers`: worker reports and their decoder.
- `upstream`: statuses, rejections and presence, as the service sends them.
"""
from service.wire import base, credentials, downstream, fields, resources, upstream, workers
from service.wire.base import *  # noqa: F403
from service.wire.credentials import *  # noqa: F403
from service.wire.downstream import *  # noqa: F403
from service.wire.fields import *  # noqa: F403
from service.wire.resources import *  # noqa: F403
from service.wire.upstream import *  # noqa: F403
from service.wire.workers import *  # noqa: F403

__all__: list[str] = []
__all__ += base.__all__
__all__ += credentials.__all__
__all__ += downstream.__all__
__all__ += fields.__all__
__all__ += resources.__all__
__all__ += upstream.__all__
__all__ += workers.__all__
