"""A CPU stand-in for Liger-Kernel's fused linear cross-entropy, the kernel
behind OLMo-core's ``fused_linear`` loss (a Triton GPU kernel: OLMo-core 3.0
raises "requires liger-kernel" without it, and Liger-Kernel does not run on a
CPU). Liger-Kernel's algorithm in plain torch, for tests/test_olmo_core_fused_loss.py
and research/bench_fused_loss.py, passed to OLMo-core through
``natbias.olmo_core._compat.fused_linear_kernel``:

- the tokens in chunks of ``next_power_of_2(ceil(N / ceil(V / d)))``, as
  Liger-Kernel sizes them, so that a chunk's logits are about the size of the
  input (N x d): the (N x |V|) logits are never whole;
- each chunk's logits ``x W^T + b`` in float32, its loss and, in the forward
  already, the gradients of x, W and b (softmax - one-hot, with the z-loss's
  ``2 s lse softmax``), W's and b's accumulated in ``accum_dtype``;
- the backward multiplies them by the loss's incoming gradient;
- the z-loss ``s lse^2`` added to the loss whenever s (``lse_square_scale``)
  is not 0, returned apart only where asked: Liger-Kernel's rule, to which
  OLMo-core 3.0 hands ``z_loss_multiplier or 1e-4``, so that its fused loss
  carries a 1e-4 z-loss even where none is asked for (stock models too).

Its arguments are those OLMo-core 3.0 passes (Liger-Kernel 0.8.5's first
twelve); it returns the three values OLMo-core 3.0 unpacks (Liger-Kernel
0.8.5 returns four, read from its source, not run here).

What it cannot stand for: Triton's own rounding and speed on a GPU.
"""

import math

import torch


def chunk_tokens(tokens: int, vocab: int, width: int) -> int:
    """Liger-Kernel's chunk: ``next_power_of_2(cdiv(N, cdiv(V, d)))`` tokens, at most N."""
    return min(tokens, 1 << max(0, math.ceil(tokens / math.ceil(vocab / width)) - 1).bit_length())


class FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        inputs,
        weight,
        target,
        bias=None,
        ce_weight=None,
        ignore_index=-100,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="mean",
        softcap=None,
        return_z_loss=False,
        accum_dtype=None,
    ):
        if ce_weight is not None or label_smoothing or softcap is not None:
            raise NotImplementedError("the stand-in has no class weights, smoothing or softcap")
        if reduction not in ("mean", "sum"):
            raise NotImplementedError(f"the stand-in reduces by mean or sum, not {reduction}")
        tokens, width = inputs.shape
        vocab = weight.shape[0]
        accum = accum_dtype or weight.dtype
        kept = target != ignore_index
        divisor = max(int(kept.sum()), 1) if reduction == "mean" else 1
        grad_input = torch.zeros_like(inputs)
        grad_weight = torch.zeros(weight.shape, dtype=accum)
        grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=accum)
        loss = torch.zeros((), dtype=torch.float32)
        z_loss = torch.zeros((), dtype=torch.float32)
        step = chunk_tokens(tokens, vocab, width)
        for start in range(0, tokens, step):
            x = inputs[start : start + step]
            logits = (x @ weight.t()).float()
            if bias is not None:
                logits += bias.float()
            labels, mask = target[start : start + step], kept[start : start + step]
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, labels.clamp(min=0)[:, None])[:, 0]
            loss += ((lse - picked) * mask).sum()
            z = lse_square_scale * lse.square() * mask
            loss += z.sum()
            z_loss += z.sum()
            # d/dlogits of (lse - logit_y + s lse^2): softmax (1 + 2 s lse) - one-hot
            grad = torch.softmax(logits, dim=-1) * (1 + 2 * lse_square_scale * lse)[:, None]
            grad[torch.arange(len(labels)), labels.clamp(min=0)] -= 1
            grad *= mask[:, None] / divisor
            grad_input[start : start + step] = (grad.to(weight.dtype) @ weight).to(inputs.dtype)
            grad_weight += (grad.t() @ x.float()).to(accum)
            if grad_bias is not None:
                grad_bias += grad.sum(0).to(accum)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        ctx.save_for_backward(grad_input, grad_weight.to(weight.dtype), grad_bias)
        ctx.has_bias = bias is not None
        return loss / divisor, z_loss / divisor if return_z_loss else None, None

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        grad_input, grad_weight, grad_bias = ctx.saved_tensors
        grad_input, grad_weight = grad_input * grad_loss, grad_weight * grad_loss
        if ctx.has_bias:
            grad_bias = (grad_bias * grad_loss).to(grad_bias.dtype)
        return (grad_input, grad_weight, None, grad_bias) + (None,) * 8


fused_linear_cross_entropy = FusedLinearCrossEntropy.apply
