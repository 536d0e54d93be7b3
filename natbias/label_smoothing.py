"""Label smoothing towards the target unigram instead of the uniform distribution
(not ours: label smoothing is Szegedy et al., 2016; towards the unigram,
Chorowski and Jaitly, 2017, and Pereyra et al., 2017; the credits and why
it suits the natural bias: docs/criteria.md). Each target position is trained
towards

    q(v) = (1 - eps) 1[v = y] + eps omega(v)

with omega the smoothed training unigram, so the loss of one token is

    CE(q, p) = (1 - eps) (-log p(y)) + eps CE(omega, p),
    CE(omega, p) = -sum_v omega(v) log p(v).
"""

import torch

from natbias.errors import NaturalBiasError

PAPER_EPSILON = 0.1  # the paper's label smoothing (sec. 4.1)


def check_epsilon(epsilon: float, option: str = "--label-smoothing") -> float:
    if isinstance(epsilon, bool) or not (isinstance(epsilon, (int, float)) and 0 <= epsilon < 1):
        raise NaturalBiasError(
            f"{option} must be in [0, 1), got {epsilon!r} (the paper's is "
            f"{PAPER_EPSILON:g}; 0 is plain cross-entropy)"
        )
    return float(epsilon)


def unigram_smoothed_loss(
    log_probs: torch.Tensor,
    target: torch.Tensor,
    prior: torch.Tensor,
    epsilon: float,
    ignore_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per target position ``(1 - eps) (-log p(y)) + eps CE(omega, p)`` and the
    NLL ``-log p(y)``, both 0 where ``target`` is ``ignore_index``.

    ``log_probs``: (..., |V|) log-probabilities; ``target``: (...) ids;
    ``prior``: omega(v), the probabilities (not their log)."""
    ignored = target.eq(ignore_index)
    safe_target = target.masked_fill(ignored, 0)
    nll = -log_probs.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
    nll = nll.masked_fill(ignored, 0.0)
    if epsilon == 0:
        return nll, nll
    cross = unigram_cross_entropy(log_probs, prior)
    loss = (1.0 - epsilon) * nll + epsilon * cross.masked_fill(ignored, 0.0).to(nll.dtype)
    return loss, nll


def unigram_cross_entropy(log_probs: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """CE(omega, p) = -sum_v omega(v) log p(v) per position: one product with
    omega, in float32 even under autocast (a sum of |V| terms in half
    precision would round away the small ones)."""
    with torch.autocast(device_type=log_probs.device.type, enabled=False):
        return -torch.matmul(log_probs.float(), prior.to(log_probs.device, torch.float32))
