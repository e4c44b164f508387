"""A flood of refused messages against a real `lifelong serve`: every one is counted, but
the log holds the first few per reason code and one "N more like this" line per interval
(before: one WARNING per message, 82,353 lines in 40 s)."""

from __future__ import annotations

import re

from tests.harness import NODE, PREFIX, metric_sum
from tests.stack import Stack
from tests.wait import wait_until

FLOOD = 400


def test_a_flood_of_rejections_is_counted_exactly_and_logged_in_summary(stack: Stack) -> None:
    controller = stack.serving()
    for i in range(FLOOD):
        stack.cloud.publish(f"{PREFIX}/{NODE}/downstream", b"not json %d" % i)
    wait_until(
        lambda: metric_sum(controller, "lifelong_rejections_total", reason="invalid_json")
        == FLOOD,
        30, f"{FLOOD} rejections counted",
    )  # fmt: skip
    # another reason meanwhile is logged on its own, not swallowed by the flood
    stack.cloud.publish(f"{PREFIX}/{NODE}/downstream", b'{"header": 7}')
    wait_until(lambda: "rejected message on" in controller.log().split("not json")[-1], 10,
               "the other reason's line")  # fmt: skip

    def logged() -> tuple[int, int]:
        text = controller.log()
        one_by_one = len(re.findall(r"rejected message on [^\n]*not valid JSON", text))
        summed = sum(map(int, re.findall(r"(\d+) more like this \(reason code invalid_json\)",
                                         text)))  # fmt: skip
        return one_by_one, summed

    wait_until(lambda: sum(logged()) == FLOOD, 30, "every rejection logged or summed up",
               detail=lambda: str(logged()))  # fmt: skip
    one_by_one, _ = logged()
    assert one_by_one <= 15, "a few per interval, not one per message"
    assert len(stack.cloud.errors()) >= FLOOD, "the errors topic still gets every one"
