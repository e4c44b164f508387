"""Benchmarks behind `make bench`: every figure is measured next to its baseline in the same
run (same machine, same moment), because absolute numbers on a shared 2-core box mean little
while ratios to a plain relay, a Redis PING or a `cp` travel well."""
