"""Kubernetes resource quantities (`250m`, `1.5`, `512Mi`, `1G`) as exact numbers. Standard library
only: the config models (components/k8s.py), the checks of the rendered graph and the policy pack
(cloudstation_tools/checks.py) and the cluster budget (cloudstation_tools/cluster_fit.py) compare
quantities with this one definition.

The suffixes are those of k8s.io/apimachinery pkg/api/resource/quantity.go: decimal SI (`m`, `k`,
`M`, `G`, `T`, `P`, `E`), binary (`Ki` ... `Ei`) and decimal exponents (`1e3`).
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Optional

SUFFIXES = {
    "n": Decimal(10) ** -9, "u": Decimal(10) ** -6, "m": Decimal(10) ** -3, "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"([+-]?[0-9]+(?:\.[0-9]*)?|[+-]?\.[0-9]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")
GIB = Decimal(2) ** 30


def parse(value: object) -> Optional[Decimal]:
    """The quantity's value (cores for CPU, bytes for memory), or None if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.fullmatch(str(value).strip())
    if not match:
        return None
    try:
        number = Decimal(match[1])
        if match[2]:
            return number * Decimal(10) ** int(match[2][1:])
        return number * SUFFIXES[match[3] or ""]
    except InvalidOperation:
        return None


def cpu_text(cores: Decimal) -> str:
    """Cores as a reader writes them: `2.575 CPU`."""
    return f"{cores.normalize():f} CPU" if cores == cores.to_integral() else f"{cores:.3f}".rstrip("0") + " CPU"


def memory_text(size: Decimal) -> str:
    """Bytes in GiB: `6.66 GiB`."""
    return f"{size / GIB:.2f} GiB"
