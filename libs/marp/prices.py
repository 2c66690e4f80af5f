"""List prices per GPU-hour of the GPU catalog (issue 35), with their source and date.

One on-demand price per catalog type, in US dollars per GPU-hour: an instance's hourly price
divided by its GPUs (p5.48xlarge $55.04/h / 8 = $6.88). The same GPU costs very different amounts
from different sellers (an H100 SXM from $2.69 to $12.29 in 2026), and the common case on a shared
cluster is an operator's own internal rate: a cluster file's ``price_per_gpu_hour`` per node group
overrides these (``has.cluster_spec``, docs/cost.md). The numbers are therefore defaults for
ranking plans by dollars, not quotes. Pure: no numpy, so the CLI may read it for ``--help``.

Sources (docs/cost.md has the table): AWS on-demand us-east-1 (instance price / GPUs) from the
term-price catalog dated 2026-09-27 and the Pricing API values captured 2026-08 that
../shared/reference/heterogeneous-training.md section 2.1 collects; Azure where AWS has no such
instance; RunPod's list (March 2026) for the consumer / workstation cards no hyperscaler rents.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ListPrice:
    """A catalog GPU's default price: dollars per GPU-hour, where it comes from, and when."""

    usd_per_gpu_hour: float
    source: str
    as_of: str  # YYYY-MM of the list the number was read from
    estimate: bool = False  # not from a hyperscaler's on-demand list for this exact part


_AWS = "AWS on-demand us-east-1"
_RUNPOD = "RunPod on-demand pod (deploybase.ai list, 2026-03)"

LIST_PRICES: dict[str, ListPrice] = {
    "V100-16GB": ListPrice(3.06, f"{_AWS}, p3.2xlarge (1 GPU) $3.06/h", "2026-09"),
    "V100-32GB": ListPrice(3.90, f"{_AWS}, p3dn.24xlarge $31.21/h / 8", "2026-09", estimate=True),
    "T4": ListPrice(0.53, f"{_AWS}, g4dn.xlarge (1 GPU) $0.526/h", "2026-08"),
    "A10": ListPrice(1.29, "Lambda on-demand 1x A10 $1.29/h", "2026-09"),
    "A10G": ListPrice(1.01, f"{_AWS}, g5.xlarge (1 GPU) $1.006/h", "2026-08"),
    "L4": ListPrice(0.81, f"{_AWS}, g6.xlarge (1 GPU) $0.805/h", "2026-08"),
    "L40S": ListPrice(1.86, f"{_AWS}, g6e.xlarge (1 GPU) $1.861/h", "2026-08"),
    "A100-40GB": ListPrice(2.74, f"{_AWS}, p4d.24xlarge $21.96/h / 8", "2026-09"),
    "A100-80GB": ListPrice(3.43, f"{_AWS}, p4de.24xlarge $27.45/h / 8", "2026-09"),
    "H100-80GB": ListPrice(6.88, f"{_AWS}, p5.48xlarge $55.04/h / 8 (after the June-2025 cut)", "2026-09"),
    # No hyperscaler rents the NVL part in an 8-GPU instance in the notes: the SXM part's price.
    "H100-96GB": ListPrice(6.88, "the H100-80GB (SXM) price; no list price for H100 NVL in the sources",
                           "2026-09", estimate=True),
    "H200": ListPrice(7.91, f"{_AWS}, p5en.48xlarge $63.30/h / 8", "2026-09"),
    "B200": ListPrice(14.24, f"{_AWS}, p6-b200.48xlarge $113.93/h / 8", "2026-09"),
    "RTX-4090": ListPrice(0.60, f"{_RUNPOD}, RTX 4090 $0.60/h", "2026-03", estimate=True),
    "RTX-3090": ListPrice(0.39, f"{_RUNPOD}, RTX 3090 $0.39/h", "2026-03", estimate=True),
    "RTX-A6000": ListPrice(1.22, "RunPod serverless flex A6000 $0.00034/s (docs.runpod.io/serverless/pricing)",
                           "2026-03", estimate=True),
    "MI300X": ListPrice(6.00, "Azure ND96isr MI300X v5 $48.00/h / 8 (eastus)", "2026-09", estimate=True),
}  # fmt: skip


def list_price(gpu_name: str) -> float:
    """The catalog type's list price per GPU-hour (0.0 for a name without one)."""
    price = LIST_PRICES.get(gpu_name)
    return price.usd_per_gpu_hour if price is not None else 0.0


__all__ = ["LIST_PRICES", "ListPrice", "list_price"]
