"""A job state stored before the job's spec was the wire's own (its trigger's timer in
minutes, its condition and gate in the core's types) still decodes, to the spec it stands
for."""

from __future__ import annotations

from service.core.state import JobState, decode_state, encode_state
from service.wire import Condition, JobSpec, Timer, Trigger

#: A job in eval/running at round 3, stored before: timer 02:00-24:00, checked every 30 s,
#: condition num_of_samples ge 500, deploy gate accuracy_delta[0] > 0.01.
BEFORE = bytes.fromhex(
    "de0008a474797065a36a6f62a96e616d657370616365a764656661756c74a46e616d65a56a6f622d61a4"
    "7370656385a764617461736574a26473aa747261696e5f70726f62cb3fe999999999999aa77472696767"
    "657285ae636865636b5f706572696f645f731ea677696e646f779278cd05a0a86f70657261746f72a267"
    "65a97468726573686f6c64cb407f400000000000a66d6574726963ae6e756d5f6f665f73616d706c6573"
    "aa6f75747075745f646972a42f6f7574a46761746583a86f70657261746f72a13ea97468726573686f6c"
    "64cb3f847ae147ae147ba66d6574726963b161636375726163795f64656c74615b305da6646967657374"
    "a26431a57068617365a46576616ca473746570a772756e6e696e67a776657273696f6e03"
)
#: A job stored before with the default trigger and no gate.
BEFORE_PLAIN = bytes.fromhex(
    "de0005a474797065a36a6f62a96e616d657370616365a764656661756c74a46e616d65a56a6f622d62a4"
    "7370656383a764617461736574a26473aa747261696e5f70726f62cb3fe0000000000000aa6f75747075"
    "745f646972a22f6fa6646967657374a26432"
)


def test_a_state_stored_before_decodes_to_the_spec_it_stands_for() -> None:
    state = decode_state(BEFORE)
    assert state == JobState(
        namespace="default", name="job-a", digest="d1", phase="eval", step="running", version=3,
        spec=JobSpec(
            dataset="ds", train_prob=0.8, output_dir="/out",
            trigger=Trigger(
                check_period_seconds=30, timer=Timer(start="02:00", end="24:00"),
                condition=Condition(operator="ge", threshold=500.0, metric="num_of_samples"),
            ),
            gate=Condition(operator=">", threshold=0.01, metric="accuracy_delta[0]"),
        ),
    )  # fmt: skip
    assert state.spec.trigger.window == (120, 1440)
    assert decode_state(encode_state(state)) == state, "stored again in today's form"


def test_a_plain_state_stored_before_decodes_too() -> None:
    state = decode_state(BEFORE_PLAIN)
    assert isinstance(state, JobState)
    assert state.spec == JobSpec(dataset="ds", train_prob=0.5, output_dir="/o")
    assert not state.spec.trigger.has_condition and state.spec.trigger.window is None
