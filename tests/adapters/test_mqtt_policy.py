"""The MQTT client's decisions on a refused or lost connection, without a broker: when to fall
back to 3.1.1, what is a refusal to report, how long to back off after a takeover."""

from __future__ import annotations

import pytest
from paho.mqtt.enums import MQTTProtocolVersion

from service.adapters.mqtt import ConnectionPolicy, ConnectRefusal, Reconnect, fallback_protocol

V5, V311 = MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311
TAKEN_OVER, UNSPECIFIED, KEEPALIVE_TIMEOUT = 0x8E, 0x80, 0x8D


def policy(pinned: MQTTProtocolVersion | None = None, cap_s: float = 0.4) -> ConnectionPolicy:
    return ConnectionPolicy(pinned, reconnect_min_s=0.1, takeover_backoff_max_s=cap_s)


def silent_close(p: ConnectionPolicy, lasted_s: float = 0.5) -> Reconnect:
    return p.connection_lost(by_disconnect_packet=False, reason_code=UNSPECIFIED, lasted_s=lasted_s)


def test_fallback_decision() -> None:
    assert fallback_protocol(V5, 0x84) == V311
    assert fallback_protocol(V5, 1) == V311
    assert fallback_protocol(V5, 0x86) is None  # bad user name or password: not a version issue
    assert fallback_protocol(V5, 0x87) is None
    assert fallback_protocol(V311, 1) is None  # never below 3.1.1


def test_unsupported_version_falls_back_until_a_connect_settles_the_protocol() -> None:
    p = policy()
    assert p.protocol == V5
    assert p.refused(0x84, "Unsupported protocol version") == V311
    p.fall_back(V311)
    assert p.protocol == V311
    settled = policy()
    settled.connected()
    assert settled.refused(0x84, "Unsupported protocol version") == ConnectRefusal(
        0x84, "Unsupported protocol version"
    )
    assert settled.protocol == V5


@pytest.mark.parametrize("pin", [V5, V311])
def test_a_pinned_protocol_never_falls_back(pin: MQTTProtocolVersion) -> None:
    p = policy(pinned=pin)
    assert p.pinned
    assert p.refused(0x84, "Unsupported protocol version") == ConnectRefusal(
        0x84, "Unsupported protocol version"
    )
    assert (
        p.closed_before_connack(
            by_disconnect_packet=False, reason_code=UNSPECIFIED, connect_sent=True
        )
        is None
    )
    assert p.protocol == pin


def test_other_refusals_are_reported_and_say_whether_we_are_not_authorised() -> None:
    refusal = policy().refused(0x86, "Bad user name or password")
    assert isinstance(refusal, ConnectRefusal)
    assert refusal.not_authorised
    assert str(refusal) == "not authorised (the broker said: Bad user name or password)"
    banned = policy().refused(0x8A, "Banned")
    assert isinstance(banned, ConnectRefusal) and banned.not_authorised
    busy = policy().refused(0x89, "Server busy")
    assert isinstance(busy, ConnectRefusal) and not busy.not_authorised
    assert str(busy) == "refused (the broker said: Server busy)"


@pytest.mark.parametrize(
    ("by_disconnect_packet", "reason_code", "connect_sent", "falls_back"),
    [
        (False, UNSPECIFIED, True, True),  # closed after our whole CONNECT: does not speak 5
        (False, UNSPECIFIED, False, False),  # closed before the CONNECT was out: an outage
        (True, UNSPECIFIED, True, False),  # the broker said something: not a silent close
        (False, KEEPALIVE_TIMEOUT, True, False),  # our keep-alive ran out: a silent broker
    ],
)
def test_a_close_without_connack_falls_back_only_when_the_broker_closed_after_connect(
    by_disconnect_packet: bool, reason_code: int, connect_sent: bool, falls_back: bool
) -> None:
    p = policy()
    chosen = p.closed_before_connack(
        by_disconnect_packet=by_disconnect_packet,
        reason_code=reason_code,
        connect_sent=connect_sent,
    )
    assert chosen == (V311 if falls_back else None)


def test_no_fallback_from_311_or_once_settled() -> None:
    p = policy()
    p.fall_back(V311)
    assert (
        p.closed_before_connack(
            by_disconnect_packet=False, reason_code=UNSPECIFIED, connect_sent=True
        )
        is None
    )
    settled = policy()
    settled.connected()
    assert (
        settled.closed_before_connack(
            by_disconnect_packet=False, reason_code=UNSPECIFIED, connect_sent=True
        )
        is None
    )


def test_silent_closes_in_a_row_double_the_delay_up_to_the_cap_and_are_named_from_the_second() -> (
    None
):
    p = policy(cap_s=0.4)
    first, second, third, fourth = (silent_close(p) for _ in range(4))
    assert [r.delay_s for r in (first, second, third, fourth)] == [0.1, 0.2, 0.4, 0.4]
    assert [r.in_a_row for r in (first, second, third, fourth)] == [1, 2, 3, 4]
    assert first.takeover is None  # one silent close may be a network fault
    assert second.takeover is not None and "same id" in second.takeover


def test_disconnect_0x8e_is_named_at_once() -> None:
    reconnect = policy().connection_lost(
        by_disconnect_packet=True, reason_code=TAKEN_OVER, lasted_s=0.5
    )
    assert reconnect == Reconnect(0.1, 1, reconnect.takeover)
    assert reconnect.takeover is not None and "0x8E" in reconnect.takeover


@pytest.mark.parametrize(
    ("by_disconnect_packet", "reason_code", "lasted_s"),
    [
        (False, UNSPECIFIED, 0.8),  # lasted twice the cap: a stable connection, not a takeover
        (True, UNSPECIFIED, 0.5),  # a DISCONNECT with another reason
        (False, KEEPALIVE_TIMEOUT, 0.5),  # our keep-alive ran out
    ],
)
def test_any_other_end_resets_the_run(
    by_disconnect_packet: bool, reason_code: int, lasted_s: float
) -> None:
    p = policy(cap_s=0.4)
    silent_close(p)
    assert silent_close(p).in_a_row == 2
    other = p.connection_lost(
        by_disconnect_packet=by_disconnect_packet, reason_code=reason_code, lasted_s=lasted_s
    )
    assert other == Reconnect(0.1, 0, None)
    assert silent_close(p).delay_s == 0.1


def test_a_failed_attempt_ends_a_run_of_takeovers_and_counts_the_outage() -> None:
    p = policy(cap_s=0.4)
    silent_close(p)
    silent_close(p)
    first = p.failed_attempt()
    assert (first.number, first.reset_delay_s) == (1, 0.1)  # the outage backoff starts afresh
    second = p.failed_attempt()
    assert (second.number, second.reset_delay_s) == (2, None)  # paho's own doubling goes on
    assert silent_close(p).in_a_row == 1
    p.connected()
    assert p.failed_attempt().number == 1  # a new outage
