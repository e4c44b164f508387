"""`lifelong demo`: the whole system on one machine, end to end, in about a minute.

It starts its own mosquitto and redis-server on free ports in a temporary directory, two
controller replicas (`lifelong serve` subprocesses sharing them), and the reference worker
running `python -m service.demo.comfort` for train and eval. It applies a Dataset and a
LifelongLearningJob, streams labelled thermal-comfort samples into the dataset while the
comfort boundary drifts, and shows each round's phases, sample counts and eval accuracy until
the requested number of rounds is deployed. Its last line is `demo complete: N rounds, ...`.

Everything it starts is stopped on the way out, whether it finished, failed or was
interrupted (Ctrl-C or SIGTERM): each resource is a context manager, entered in order and left
in reverse.

The package: `comfort` (the demo's model, run as the worker's train and eval command),
`scenario` (the resources, the drifting sample feed, and what the live view and the last line
show), `run` (one run, start to finish, on the servers it starts). `lifelong demo` on the
command line is `service.cli.running`'s.
"""
