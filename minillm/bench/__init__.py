"""Benchmarks: batch-1 latency, throughput, machine roofs; minillm beside its peers.

Entry point: `minillm bench ...` / `python -m minillm.bench ...` (see cli.py).
Subjects (subject.py) run the same workloads (workload.py); latency.py and
throughput.py turn their timings into figures and targets; report.py writes JSON.
"""
