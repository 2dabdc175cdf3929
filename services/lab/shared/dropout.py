"""Dropout for training on the CPU, its masks drawn ~4x faster than torch's (``fast_dropout``).

torch draws a CPU dropout mask one number at a time from its Mersenne Twister (``bernoulli_``, ~6 ns an element on
this project's Xeon): in a cached-loss step of MiniLM (GradCache draws every mask twice: its forward without
gradients, then again with them) the masks were 37% of a bf16 step's time and more than its matrix multiplies. Here
each mask takes one 63-bit seed from torch's default generator and fills its elements from numpy's PCG64 seeded with
it, 16 bits an element: the same draws whenever torch's generator is in the same state (``torch.manual_seed``, and
GradCache's replay of the RNG state gives the forward with gradients the masks of the one without), each element
dropped with probability ``round(p * 65536) / 65536`` (0.1 -> 0.100006) and the rest scaled by the inverse of what
is kept, as ``F.dropout``. On a CUDA or MPS tensor torch's own dropout runs unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

ATTENTION = "dpr_fast_dropout_eager"  # the attention function ``fast_dropout`` registers with transformers
ATTENTION_MODELS = frozenset({"bert", "roberta", "xlm-roberta"})  # whose eager attention ``_attend`` computes
_LEVELS = 65536  # a mask element is 16 random bits


def drop(x: Any, p: float, training: bool) -> Any:
    """``F.dropout(x, p, training)`` with its mask drawn as the module says (CPU tensors)."""
    import torch

    if not training or p <= 0.0 or x.device.type != "cpu" or not x.is_floating_point():
        return torch.nn.functional.dropout(x, p, training)
    if p >= 1.0:
        return torch.zeros_like(x)
    return _Dropped.apply(x, _dropped(x.shape, p), _LEVELS / (_LEVELS - round(p * _LEVELS)))


def _dropped(shape: Any, p: float) -> Any:
    """A bool mask of ``shape``: True where an element is dropped."""
    import numpy as np
    import torch

    count = math.prod(shape)
    seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64))
    bits = np.random.PCG64(seed).random_raw(-(-count // 4)).view(np.int16)[:count]
    return torch.from_numpy(bits).reshape(shape) < round(p * _LEVELS) - _LEVELS // 2  # int16 spans -32768..32767


class _Dropped:  # a torch.autograd.Function, made on first use: no torch at import (the project's rule)
    _function: Any = None

    @classmethod
    def apply(cls, x: Any, dropped: Any, scale: float) -> Any:
        if cls._function is None:
            import torch

            class Function(torch.autograd.Function):
                @staticmethod
                def forward(ctx: Any, x: Any, dropped: Any, scale: float) -> Any:
                    ctx.save_for_backward(dropped)
                    ctx.scale = scale
                    return x.masked_fill(dropped, 0.0).mul_(scale)

                @staticmethod
                def backward(ctx: Any, grad: Any) -> Any:
                    (dropped,) = ctx.saved_tensors
                    return grad.masked_fill(dropped, 0.0).mul_(ctx.scale), None, None

            cls._function = Function
        return cls._function.apply(x, dropped, scale)


def _attend(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None,
            dropout: float = 0.0, **_: Any) -> tuple[Any, Any]:
    """transformers' ``eager_attention_forward`` (BERT, RoBERTa, XLM-R: the same function) with ``drop``."""
    import torch

    if scaling is None:
        scaling = query.size(-1) ** -0.5
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = drop(torch.nn.functional.softmax(weights, dim=-1), dropout, module.training)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


@contextlib.contextmanager
def fast_dropout(model: Any) -> Iterator[None]:
    """Inside the block ``model`` drops out with ``drop``: its ``nn.Dropout`` modules, and the attention of its
    transformers of ``ATTENTION_MODELS`` (eager attention, as transformers computes it, registered as
    ``ATTENTION``). Its other transformers on SDPA attend eagerly with torch's dropout. With dropout, SDPA on the CPU
    runs its math fallback, whose masking checks and casts made a bf16 step of MiniLM (MNRL, 32 questions + 64
    passages of 128 tokens, 2 cores with AMX) 2.54-2.68 s against eager's 2.22 s; fp32 the same either way
    (4.17-4.3 against 4.23 s). Afterwards the model is as it was."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTENTION, _attend)
    AttentionMaskInterface.register(ATTENTION, eager_mask)  # its masks as eager's: added to the scores
    attention = [(m, m.config._attn_implementation) for m in model.modules() if isinstance(m, PreTrainedModel)
                 and (m.config.model_type in ATTENTION_MODELS or m.config._attn_implementation == "sdpa")]
    modules = [m for m in model.modules() if type(m) is torch.nn.Dropout]
    for m, _ in attention:
        m.set_attn_implementation(ATTENTION if m.config.model_type in ATTENTION_MODELS else "eager")
    for m in modules:
        m.forward = lambda x, m=m: drop(x, m.p, m.training)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in modules:
            del m.forward
        for m, implementation in attention:
            m.set_attn_implementation(implementation)
