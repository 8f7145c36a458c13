"""CUDA autocast's dtype mix, reproduced on CPU for tests that have no GPU.

CPU autocast and CUDA autocast cast different ops: both run matmuls and linear layers in the
lower precision, but CUDA's also runs a list of ops in float32 whatever their input (`cumsum`,
`sum`, `softmax`, `exp`, ... : torch's "CUDA Ops that can autocast to float32"), so under CUDA
autocast a half tensor's `cumsum` comes back float32 while the tensors around it stay half.
That mix is what crashed CoPE and SaPE² on a GPU (issue 43) and what CPU autocast alone never
produces. `cuda_autocast(dtype)` enters CPU autocast and, while it is enabled on the calling
thread, also casts the inputs of CUDA's float32 list to float32, as CUDA autocast does. Code
that turns autocast off (`torch.autocast("cpu", enabled=False)`) turns both off, as on CUDA.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

# torch's autocast docs, "CUDA Ops that can autocast to float32" (the functional and Tensor
# spellings share these names; in-place and out= variants are not autocast, as on CUDA)
FLOAT32_OPS = frozenset("""
    __pow__ __rdiv__ __rpow__ __rtruediv__ acos asin binary_cross_entropy_with_logits cosh
    cosine_embedding_loss cdist cosine_similarity cross_entropy cumprod cumsum dist erfinv exp expm1
    group_norm hinge_embedding_loss kl_div l1_loss layer_norm log log_softmax log10 log1p log2
    margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss nll_loss norm normalize pdist
    poisson_nll_loss pow prod reciprocal rsqrt sinh smooth_l1_loss soft_margin_loss softmax softmin
    softplus sum renorm tan triplet_margin_loss""".split())
HALF = (torch.float16, torch.bfloat16)


def _to_float32(x):
    if isinstance(x, torch.Tensor) and x.dtype in HALF:
        return x.float()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_float32(t) for t in x)
    return x


class _Float32Ops(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (torch.is_autocast_enabled("cpu") and getattr(func, "__name__", "") in FLOAT32_OPS
                and "out" not in kwargs):
            args, kwargs = _to_float32(args), {k: _to_float32(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype = torch.bfloat16):
    """CPU autocast to `dtype` with CUDA autocast's float32 ops (see the module docstring)."""
    with torch.autocast("cpu", dtype=dtype), _Float32Ops():
        yield
