"""Mixed-precision training: which autocast a run's forward takes, and the backward and optimiser
step that go with it (fp16's loss scale). train.py and benchmarks/gpu.py use it.

CoPE and SaPE² compute their positions in float32 whatever the autocast (docs/encodings.md,
"Mixed precision"); the parameters and their gradients stay float32.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterable

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")   # auto: bf16 autocast on CUDA, float32 elsewhere
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """A resolved precision (`name` in fp32 / bf16 / fp16) on one device type."""

    name: str
    device_type: str
    scaler: Any = None                    # torch.amp.GradScaler for fp16, else None

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, None for float32."""
        return DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward's context: autocast to `dtype` on the device, or nothing for float32."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)

    def backward_and_step(self, loss: torch.Tensor, opt: torch.optim.Optimizer, params: Iterable[torch.Tensor],
                          grad_clip: float) -> None:
        """`loss.backward()`, gradient-norm clipping at `grad_clip` (0: none) and `opt.step()`; for
        fp16 with the loss scaled and the gradients clipped once unscaled (a step whose gradients
        overflowed is skipped, as GradScaler does)."""
        if self.scaler is None:
            loss.backward()
            if grad_clip:
                torch.nn.utils.clip_grad_norm_(params, grad_clip)
            opt.step()
            return
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(opt)
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        self.scaler.step(opt)
        self.scaler.update()


def resolve(precision: str, device: str | torch.device) -> Precision:
    """`precision` (one of `PRECISIONS`) for a run on `device`; ValueError for another name."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {PRECISIONS}")
    device_type = torch.device(device).type
    if precision == "auto":
        precision = "bf16" if device_type == "cuda" else "fp32"
    scaler = torch.amp.GradScaler(device_type) if precision == "fp16" else None
    return Precision(precision, device_type, scaler)
