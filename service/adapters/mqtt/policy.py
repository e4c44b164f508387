"""What the MQTT client decides when the broker refuses or ends a connection.

`ConnectionPolicy` is pure: fed what paho reported (reason codes, who closed the connection,
how long it lasted), it answers with what to do, and `MqttClient` applies the answer on
paho's thread. Its decisions:

- Protocol fallback. MQTT 5 is tried first, unless the URL pins a protocol. A broker that
  only speaks 3.1.1 either answers a v5 CONNECT with the 3.1.1 return code 1 ("unacceptable
  protocol version", which paho reports as reason code 0x84) or, like RabbitMQ 3.10's MQTT
  plugin, closes the socket without any CONNACK. Both switch the client to 3.1.1 for this
  and every later connect. Only a close after the whole CONNECT went out counts; a refused
  or timed-out TCP connect, or a broker that stays silent until the keep-alive runs out, is
  an ordinary outage. The switch is only taken before the first successful connect, after
  which the protocol is settled (switching then could strand concurrent publishes; a broker
  downgraded under a running client needs a restart). A CONNECT refused for any other
  reason (bad password, not authorised) is a `ConnectRefusal`.
- Takeover backoff. A fixed client id may be held by one process only; the next holder
  displaces the first, so two live processes configured with one id would fight, each
  reconnect displacing the other. mosquitto 2.0 says nothing when it hands our session to
  the newcomer (it closes our socket; MQTT 5 brokers that say it send DISCONNECT 0x8E), so a
  connection the broker closes without a reason before it lasted twice
  ``takeover_backoff_max_s`` counts as taken over: each such close in a row doubles the
  reconnect delay from ``reconnect_min_s``, up to ``takeover_backoff_max_s``, instead of
  paho's fixed short delay; any other end resets it. One silent close may be a network
  fault, so the takeover is named from the second one in a row (a 0x8E at once). A failed
  connect ends the run: another client holding our id never keeps the broker from letting us
  in, so that broker went away, and the outage backoff starts afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from paho.mqtt.enums import MQTTProtocolVersion

# MQTT 5 reason codes used here (MQTT 5.0 spec, 2.4).
UNSUPPORTED_PROTOCOL_VERSION = 0x84
SESSION_TAKEN_OVER = 0x8E
# paho's code for a connection that ended without a DISCONNECT (the peer closed the socket).
UNSPECIFIED_ERROR = 0x80
# Bad user name or password, not authorized, banned, bad authentication method; paho maps
# the 3.1.1 return codes 4 and 5 onto the first two.
_NOT_AUTHORISED = frozenset({0x86, 0x87, 0x8A, 0x8C})
# MQTT 3.1.1 CONNACK return code 1: "unacceptable protocol version".
_V311_REFUSED_PROTOCOL_VERSION = 1
_SAID_TAKEN_OVER = "handed our session to another client with the same id (DISCONNECT 0x8E)"
_CLOSED_SILENTLY = (
    "closed our connection without a reason, soon after accepting it: most "
    "likely another client connected with the same id and took the session over"
)


def fallback_protocol(current: MQTTProtocolVersion, reason_code: int) -> MQTTProtocolVersion | None:
    """The protocol to retry with after a refused CONNECT, or None to keep the current one.

    Only MQTT 5 falls back (to 3.1.1), and only when the broker said it does not speak the
    protocol: reason code 0x84, or the raw 3.1.1 return code 1 such a broker sends.
    """
    if current != MQTTProtocolVersion.MQTTv5:
        return None
    if reason_code in (UNSUPPORTED_PROTOCOL_VERSION, _V311_REFUSED_PROTOCOL_VERSION):
        return MQTTProtocolVersion.MQTTv311
    return None


@dataclass(frozen=True)
class ConnectRefusal:
    """The broker's answer to a CONNECT it refused: the MQTT 5 reason code and its text.

    Under 3.1.1 paho maps the return code onto the MQTT 5 one (4 -> 0x86, 5 -> 0x87).
    """

    code: int
    reason: str

    @property
    def not_authorised(self) -> bool:
        """Bad user name or password, not authorised, banned or a bad auth method."""
        return self.code in _NOT_AUTHORISED

    def __str__(self) -> str:
        what = "not authorised" if self.not_authorised else "refused"
        return f"{what} (the broker said: {self.reason})"


@dataclass(frozen=True)
class FailedAttempt:
    """A connect attempt that failed: its number in the outage (1 for the first), and the
    reconnect delay to restore when it ended a run of takeovers (None: leave paho's)."""

    number: int
    reset_delay_s: float | None


@dataclass(frozen=True)
class Reconnect:
    """How to go on after an established connection ended.

    ``delay_s``: wait this long before reconnecting. ``in_a_row``: takeovers in a row, this
    end included (0 when it is not one). ``takeover``: why the end is named a takeover, or
    None when it is reported as an ordinary disconnect.
    """

    delay_s: float
    in_a_row: int
    takeover: str | None


class ConnectionPolicy:
    """The protocol in use and the reconnect delays of one client; see the module docstring.

    Not thread-safe: paho calls back on one thread at a time. `fall_back` is the exception,
    since the client switches protocols under its own lock.
    """

    def __init__(
        self,
        pinned: MQTTProtocolVersion | None,
        *,
        reconnect_min_s: float,
        takeover_backoff_max_s: float,
    ) -> None:
        self._pinned = pinned is not None
        self._protocol = pinned or MQTTProtocolVersion.MQTTv5
        self._settled = False
        self._reconnect_min_s = reconnect_min_s
        self._takeover_max_s = takeover_backoff_max_s
        self._failed_attempts = 0
        self._taken_over_in_a_row = 0

    @property
    def protocol(self) -> MQTTProtocolVersion:
        """The pinned protocol, else MQTT 5 unless the broker made us fall back to 3.1.1."""
        return self._protocol

    @property
    def pinned(self) -> bool:
        return self._pinned

    @property
    def settled(self) -> bool:
        """True once a CONNECT was accepted: the protocol no longer changes."""
        return self._settled

    def connected(self) -> None:
        """A CONNECT was accepted: the protocol is settled and the outage is over."""
        self._settled = True
        self._failed_attempts = 0

    def fall_back(self, protocol: MQTTProtocolVersion) -> None:
        """Use ``protocol`` from the next connect on (one that `refused` or
        `closed_before_connack` chose)."""
        self._protocol = protocol

    def refused(self, reason_code: int, reason: str) -> MQTTProtocolVersion | ConnectRefusal:
        """After a CONNACK with a failure ``reason_code``: the protocol to fall back to, or
        the refusal to report."""
        if not self._pinned and not self._settled:
            fallback = fallback_protocol(self._protocol, reason_code)
            if fallback is not None:
                return fallback
        return ConnectRefusal(reason_code, reason)

    def closed_before_connack(
        self, *, by_disconnect_packet: bool, reason_code: int, connect_sent: bool
    ) -> MQTTProtocolVersion | None:
        """After a connection that ended with no CONNACK on it: the protocol to fall back to,
        or None for an ordinary failed attempt (count it with `failed_attempt`).

        It is the broker refusing MQTT 5 only if the broker closed the socket (not our
        keep-alive running out) after the whole CONNECT was written (``connect_sent``).
        """
        closed_by_broker = not by_disconnect_packet and reason_code == UNSPECIFIED_ERROR
        if (
            closed_by_broker
            and connect_sent
            and not self._pinned
            and not self._settled
            and self._protocol == MQTTProtocolVersion.MQTTv5
        ):
            return MQTTProtocolVersion.MQTTv311
        return None

    def failed_attempt(self) -> FailedAttempt:
        """A connect attempt failed: no TCP connection, or it ended before a CONNACK."""
        reset_delay_s = None
        if self._taken_over_in_a_row:
            self._taken_over_in_a_row = 0
            reset_delay_s = self._reconnect_min_s
        self._failed_attempts += 1
        return FailedAttempt(self._failed_attempts, reset_delay_s)

    def connection_lost(
        self, *, by_disconnect_packet: bool, reason_code: int, lasted_s: float
    ) -> Reconnect:
        """An established connection ended after ``lasted_s``, with a DISCONNECT from the
        broker (``by_disconnect_packet``) or not, for ``reason_code``."""
        said_taken_over = by_disconnect_packet and reason_code == SESSION_TAKEN_OVER
        closed_silently = (
            not by_disconnect_packet
            and reason_code == UNSPECIFIED_ERROR
            and lasted_s < 2 * self._takeover_max_s
        )
        if said_taken_over or closed_silently:
            self._taken_over_in_a_row += 1
        else:
            self._taken_over_in_a_row = 0
        in_a_row = self._taken_over_in_a_row
        delay_s = min(self._reconnect_min_s * 2 ** max(in_a_row - 1, 0), self._takeover_max_s)
        takeover = None
        if said_taken_over:
            takeover = _SAID_TAKEN_OVER
        elif in_a_row >= 2:
            takeover = _CLOSED_SILENTLY
        return Reconnect(delay_s, in_a_row, takeover)
