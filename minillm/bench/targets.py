"""The speed targets of issue 2, each checked against a measured figure."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    threshold: float
    value: float | None  # None: not measured in this run (e.g. no --compare)

    @property
    def passed(self) -> bool | None:
        return None if self.value is None or self.value != self.value else self.value >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


DECODE_VS_TRANSFORMERS = ("decode_vs_transformers", "batch-1 decode tok/s, minillm / transformers", 1.2)
DECODE_BANDWIDTH = ("decode_bandwidth_fraction", "batch-1 decode bytes/s as a fraction of the measured copy bandwidth", 0.75)
PREFILL_VS_TRANSFORMERS = ("prefill_1k_vs_transformers", "1k-token prefill speed, transformers TTFT / minillm TTFT", 1.0)
THROUGHPUT_VS_TRANSFORMERS = ("throughput_vs_transformers", "output tok/s on the workload, minillm / transformers", 4.0)


def target(spec: tuple[str, str, float], value: float | None) -> Target:
    name, description, threshold = spec
    return Target(name, description, threshold, value)
