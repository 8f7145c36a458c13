"""`python -m benchmarks.bench --kernel-ab layer|train`: SaPE² / CoPE with the fused C++ kernel
(vitpe_core/encodings/_kernels.py) and with the eager PyTorch code, interleaved in one process.
Prints ratios, writes nothing."""
from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np
import torch

from benchmarks.attention import attention_step
from benchmarks.training import TRAIN_BATCH, train_step
from vitpe_core.config import preset_config
from vitpe_core.model import build_model


def _kernel_toggle(fn: Callable[[], None], eager: bool) -> Callable[[], None]:
    """`fn` run with `VITPE_NO_CPP` set (`eager`) or unset (the fused kernel)."""
    def run() -> None:
        if eager:
            os.environ["VITPE_NO_CPP"] = "1"
        else:
            os.environ.pop("VITPE_NO_CPP", None)
        fn()
    return run


def kernel_ab(what: str, rounds: int, *, batch: int = TRAIN_BATCH) -> list[str]:
    """SaPE² / CoPE with the fused C++ kernel and with the eager code, interleaved in one process
    (`--kernel-ab layer|train`): the layer ratio vs `rpb` (compact shapes, fwd+bwd) or training
    images/s vs `ape`. CPU time (`process_time`) at 1 torch thread, else wall time; paired
    medians with their interquartile range and the best-of-N ratio, one line per variant."""
    from vitpe_core.encodings import _kernels
    if not _kernels.available():
        raise RuntimeError("the C++ kernel is not available here (VITPE_NO_CPP set, or no compiler)")
    if what == "layer":
        base = "rpb"
        fns = {"rpb": _kernel_toggle(attention_step("rpb", 128, 4, batch), False)}
        for name, eager in (("sape2 cpp", False), ("sape2 eager", True)):
            fns[name] = _kernel_toggle(attention_step("sape2", 128, 4, batch), eager)
    else:
        base, fns = "ape", {}
        for name, enc, eager in (("ape", "ape", False), ("sape2 cpp", "sape2", False), ("sape2 eager", "sape2", True),
                                 ("cope+ape cpp", "cope+ape", False), ("cope+ape eager", "cope+ape", True)):
            torch.manual_seed(0)
            fns[name] = _kernel_toggle(train_step(build_model(preset_config("compact", encoding=enc)), batch), eager)
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    names = list(fns)
    for name in names:
        for _ in range(2):
            fns[name]()
    s: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            t0 = clock()
            fns[name]()
            s[name].append(clock() - t0)
    os.environ.pop("VITPE_NO_CPP", None)
    lines = []
    for name in names:
        a, b = np.asarray(s[name]), np.asarray(s[base])
        rr = a / b if what == "layer" else b / a
        best = a.min() / b.min() if what == "layer" else b.min() / a.min()
        q1, q3 = np.percentile(rr, [25, 75])
        lines.append(f"{what} {torch.get_num_threads()} thread(s) {name:15s} median {1e3 * np.median(a):8.1f} ms  "
                     f"vs {base}: paired median {np.median(rr):.3f} (IQR {q1:.3f}-{q3:.3f}), best-of-N {best:.3f}")
    return lines
