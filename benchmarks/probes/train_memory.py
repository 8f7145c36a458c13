"""Child of section 5 (`benchmarks.memory.train_memory`): build the compact `ENCODING` model,
train it `STEPS` steps on random data at batch `BATCH` (train.py's step), print `done` and wait
for a line on stdin, so that the parent reads VmHWM / VmRSS from /proc/<pid>/status.

    python -m benchmarks.probes.train_memory ENCODING STEPS BATCH
"""
import sys

import torch
import torch.nn.functional as F

from vitpe_core import build_model, preset_config
from vitpe_core.train import TrainConfig, _optimizer


def main(enc: str, steps: int, batch: int) -> None:
    torch.manual_seed(0)
    model = build_model(preset_config("compact", encoding=enc)).train()
    opt = _optimizer(model, TrainConfig(encoding=enc))
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print("done", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
