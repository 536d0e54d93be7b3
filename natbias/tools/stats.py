"""Mean and standard error over seeds (the paper's Figs. 2, 3, 9, 10)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class MeanStderr:
    mean: float
    stderr: float  # nan for a single value
    n: int

    def format(self, digits: int = 2, count: bool = True, missing: str = "n/a") -> str:
        """``mean ± stderr (n=N)``; ``missing`` when there is no value."""
        if self.n == 0:
            return missing
        if self.n == 1 or not math.isfinite(self.stderr):
            return f"{self.mean:.{digits}f}" + (" (n=1)" if count else "")
        return f"{self.mean:.{digits}f} ± {self.stderr:.{digits}f}" + (
            f" (n={self.n})" if count else ""
        )

    def signed(self, digits: int = 2) -> str:
        """``+m ± s`` (``+m`` for one value): a difference shows its sign."""
        mean = round(self.mean, digits) + 0.0  # + 0.0: no "-0.000" from rounding error
        text = f"{mean:+.{digits}f}"
        return text if self.n < 2 else f"{text} ± {self.stderr:.{digits}f}"


def mean_stderr(values: Sequence[float]) -> MeanStderr:
    """Sample mean and its standard error s / sqrt(n) (s with n - 1 in the denominator)."""
    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return MeanStderr(math.nan, math.nan, 0)
    mean = sum(values) / n
    if n == 1:
        return MeanStderr(mean, math.nan, 1)
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return MeanStderr(mean, math.sqrt(variance / n), n)
