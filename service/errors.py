"""One error hierarchy for the whole service.

Not retried: the input or the request is wrong (`InvalidMessage`, `ConfigError`,
`PermanentError`). An event that does not fit a job's state is not an error at all: the
pure core leaves the state unchanged and says why (a `Note` effect). Retried: the world
is briefly unavailable (`TransientError` and kin).
Adapters translate their library's exceptions into these at the boundary
(``raise StoreUnavailable(...) from e``) so nothing above them sees redis, paho or botocore.
"""


from typing import Literal

#: Why a message or an event was refused: the label of the rejections counter. Intake codes
#: come from decoding (`too_many`: a count cap of a free-form field; `too_long`: a job name
#: its workers' names could not fit); `unknown_job`, `immutable_field`, `rollback_refused`,
#: `foreign_worker` (a report from a worker not named for the job, or from another
#: namespace's topic), `outside_round` (a report of another round, or whose model lies outside
#: the current round's output dir), `not_running` (a train or eval report while the job does
#: not run that stage) and `output_dir_taken` (another job already writes to that outputDir)
#: from the lifecycle; `undeclared_move` when a lifecycle handler makes a move its table
#: does not declare (a bug: the event is refused, the state kept);
#: `quarantined` when the job's stored state cannot be decoded.
RejectCode = Literal[
    "invalid",
    "invalid_json",
    "invalid_utf8",
    "too_large",
    "too_deep",
    "too_many",
    "too_long",
    "name_mismatch",
    "unknown_topic",
    "unknown_job",
    "immutable_field",
    "rollback_refused",
    "path_refused",
    "foreign_worker",
    "outside_round",
    "not_running",
    "output_dir_taken",
    "quarantined",
    "wrong_node",
    "undeclared_move",
]


class ServiceError(Exception):
    """Root of every error the service raises on purpose."""


class InvalidMessage(ServiceError):
    """A message could not be decoded or failed validation.

    ``path`` names the offending field (``$.spec.dataset.trainProb``); ``reason`` says why;
    ``code`` classifies it for metrics.
    """

    def __init__(self, reason: str, path: str = "$", *, code: RejectCode = "invalid") -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.path = path
        self.reason = reason
        self.code: RejectCode = code

    @property
    def detail(self) -> str:
        """``path: reason``, or the reason alone when the message as a whole is at fault."""
        return f"{self.path}: {self.reason}" if self.path else self.reason


class ConfigError(ServiceError):
    """A configuration value is invalid; the message names the variable."""


class PermanentError(ServiceError):
    """An operation failed in a way retrying will not fix (missing file, access denied)."""


class BrokerRefused(PermanentError):
    """The MQTT broker refused our CONNECT (bad password, not authorised) or a publish."""


class Refused(PermanentError):
    """The file access policy forbids the path or object: outside the data roots or the job's
    output, a symlink, not a regular file, over a size cap. Never worth retrying."""


class TransientError(ServiceError):
    """An operation failed in a way that may succeed if retried."""


class StoreUnavailable(TransientError):
    """Redis could not be reached or answered with a connection-level error."""


class BrokerUnavailable(TransientError):
    """The MQTT broker could not be reached or did not acknowledge in time."""


class BlobUnavailable(TransientError):
    """The file system or S3 endpoint failed transiently (timeout, 5xx, throttling)."""


class LeaseLost(ServiceError):
    """A commit was refused because this replica no longer holds the shard's lease (fenced)."""
