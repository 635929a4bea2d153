"""Named GPU profiles for the analytic cost model: datasheet peaks times stated efficiencies.

Every profile is source "analytic, uncalibrated": the peaks are the vendor's datasheet figures
and the efficiency factors are this project's stated assumptions, not measurements. A profile
measured on a lent GPU (issue 33's third source) replaces them with fitted coefficients.

Peaks (NVIDIA datasheets; dense = the "with sparsity" tensor-core figure / 2):

    GPU            BF16 dense      memory        bandwidth   GPU-GPU link: total, one way
    A100-80GB-SXM  312 TFLOP/s     80 GB HBM2e   2,039 GB/s  NVLink 3: 600 GB/s, 300 GB/s
    H100-SXM       989.5 TFLOP/s   80 GB HBM3    3.35 TB/s   NVLink 4: 900 GB/s, 450 GB/s
    H200 (SXM)     989.5 TFLOP/s   141 GB HBM3e  4.8 TB/s    NVLink 4: 900 GB/s, 450 GB/s
    L40S           362.05 TFLOP/s  48 GB GDDR6   864 GB/s    PCIe 4.0 x16: 64 GB/s, 31.5 GB/s

(NVIDIA A100 Tensor Core GPU datasheet; NVIDIA H100 Tensor Core GPU datasheet, SXM column;
NVIDIA H200 Tensor Core GPU datasheet, SXM column; NVIDIA L40S datasheet. The link rates agree
with `workbench.planning.transfer.LINKS`.)

Stated efficiencies (DEFAULT_EFFICIENCY; one set for every GPU, overridable per profile):
matmul 0.6 of the peak (large GEMMs and FlashAttention prefill sustain 50-75%), memory 0.8 of
the bandwidth (weight and KV streaming), link 0.7 of the one-way rate plus 10 us per
collective (NVLink; 20 us over PCIe), 1.5 ms fixed per step (vLLM V1's schedule, input
preparation and launch around a captured graph) and 5 us per scheduled sequence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ANALYTIC_SOURCE = "analytic, uncalibrated"
EFFICIENCY_FIELDS = ("matmul_efficiency", "memory_efficiency", "link_efficiency",
                     "link_latency_s", "step_overhead_s", "seq_overhead_s")


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator: peaks (datasheet) and the efficiencies the cost model applies."""

    name: str
    peak_flops: float  # dense BF16 tensor-core FLOP/s
    memory_bandwidth: float  # device memory bytes/s
    memory_bytes: float  # device memory capacity
    link: str  # the GPU-GPU interconnect, in words
    link_bandwidth: float  # bytes/s one way per GPU
    matmul_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    link_efficiency: float = 0.7
    link_latency_s: float = 10e-6  # per collective or send/recv
    step_overhead_s: float = 1.5e-3  # fixed per engine step
    seq_overhead_s: float = 5e-6  # per scheduled sequence per step
    source: str = ANALYTIC_SOURCE
    reference: str = ""  # where the peaks come from

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "memory_bytes", "link_bandwidth"):
            _need_positive(self.name, name, getattr(self, name))
        for name in ("matmul_efficiency", "memory_efficiency", "link_efficiency"):
            value = getattr(self, name)
            _need_positive(self.name, name, value)
            if value > 1:
                raise ValueError(f"hardware {self.name!r} {name} ({value}) must be in (0, 1]")
        for name in ("link_latency_s", "step_overhead_s", "seq_overhead_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"hardware {self.name!r} {name} ({value!r}) must be >= 0")

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.matmul_efficiency

    @property
    def effective_memory_bandwidth(self) -> float:
        return self.memory_bandwidth * self.memory_efficiency

    @property
    def effective_link_bandwidth(self) -> float:
        return self.link_bandwidth * self.link_efficiency

    def with_efficiency(self, **factors: float) -> HardwareProfile:
        """A copy with other stated factors (matmul_efficiency=..., step_overhead_s=...);
        only the EFFICIENCY_FIELDS may change."""
        unknown = sorted(set(factors) - set(EFFICIENCY_FIELDS))
        if unknown:
            raise ValueError(f"with_efficiency: unknown factor(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(EFFICIENCY_FIELDS)}")
        return HardwareProfile(**{**asdict(self), **factors})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _need_positive(profile: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"hardware {profile!r} {name} ({value!r}) must be > 0")


_GB = 1e9
_PCIE4_X16_ONE_WAY = 16e9 * 16 * 128 / 130 / 8  # 16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s

NAMED_HARDWARE: dict[str, HardwareProfile] = {
    h.name: h for h in (
        HardwareProfile("A100-80GB-SXM", peak_flops=312e12, memory_bandwidth=2039 * _GB,
                        memory_bytes=80 * _GB, link="NVLink 3 (600 GB/s total)",
                        link_bandwidth=300 * _GB,
                        reference="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM"),
        HardwareProfile("H100-SXM", peak_flops=989.5e12, memory_bandwidth=3350 * _GB,
                        memory_bytes=80 * _GB, link="NVLink 4 (900 GB/s total)",
                        link_bandwidth=450 * _GB,
                        reference="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM"),
        HardwareProfile("H200", peak_flops=989.5e12, memory_bandwidth=4800 * _GB,
                        memory_bytes=141 * _GB, link="NVLink 4 (900 GB/s total)",
                        link_bandwidth=450 * _GB,
                        reference="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM"),
        HardwareProfile("L40S", peak_flops=362.05e12, memory_bandwidth=864 * _GB,
                        memory_bytes=48 * _GB, link="PCIe 4.0 x16 (64 GB/s total)",
                        link_bandwidth=_PCIE4_X16_ONE_WAY, link_latency_s=20e-6,
                        reference="NVIDIA L40S datasheet"),
    )
}


def hardware_profile(name: str | HardwareProfile) -> HardwareProfile:
    """The named GPU profile (NAMED_HARDWARE); an unknown name lists the known ones."""
    if isinstance(name, HardwareProfile):
        return name
    if name not in NAMED_HARDWARE:
        raise ValueError(f"hardware ({name!r}) must be one of {', '.join(NAMED_HARDWARE)}")
    return NAMED_HARDWARE[name]
