"""The pure core: every lifecycle decision of jobs and datasets, with no I/O.

`transition.transition(state, event, ctx)` is the one entry point: it returns the next state,
the effects to carry out (as data) and its verdict on the event. Time, ids and settings come
in through the context, so the same inputs always give the same outcome.
"""
