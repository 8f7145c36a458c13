"""The checkpoints the benchmark's click and app sections use.

The shipped set is `vitpe_core.report.ORDER` (the ten of scripts/train_checkpoints.sh). Those
present in `checkpoints/` are used as they are; missing ones are replaced by compact models with
random weights in the same format (a 15-epoch history included;
`harness.write_random_checkpoints`), in a temporary folder, and every table says which is
which. Compute per click does not depend on the weights' values.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from benchmarks.harness import write_random_checkpoints
from vitpe_core.checkpoint import list_checkpoints, resolve_checkpoint
from vitpe_core.report import ORDER
from vitpe_core.viewstate import PREFERRED_CKPT

log = logging.getLogger(__name__)

SHIPPED = tuple(ORDER)                         # the shipped checkpoints (scripts/train_checkpoints.sh)


@dataclass
class CheckpointSet:
    root: Path                 # folder the app and the click benchmark read
    names: list[str]           # all checkpoints in it
    fresh: list[str]           # those built here with random weights
    single: str                # the one-checkpoint case


@contextlib.contextmanager
def checkpoint_set(source: Path) -> Iterator[CheckpointSet]:
    """The shipped set: `source` itself when it holds all of them, else a temporary folder
    with copies of those present and random-weight compact models for the rest."""
    present = list_checkpoints(source)
    missing = [e for e in SHIPPED if e not in present]
    single = next((n for n in ("sape2+ape", "ape") if n in present), "sape2+ape")
    if not missing:
        yield CheckpointSet(source, present, [], single)
        return
    with tempfile.TemporaryDirectory(prefix="vitpe-bench-ckpts-") as tmp:
        root = Path(tmp)
        for name in present:
            path = resolve_checkpoint(name, source)
            shutil.copy2(path, root / path.name)
            if path.with_suffix(".json").is_file():
                shutil.copy2(path.with_suffix(".json"), root / path.with_suffix(".json").name)
        write_random_checkpoints(root, missing, preset="compact", epochs=15)
        log.info("checkpoints: %d from %s, %d fresh (%s)", len(present), source, len(missing), ", ".join(missing))
        yield CheckpointSet(root, list_checkpoints(root), missing, single)


def app_default(cs: CheckpointSet) -> str:
    """The checkpoint the app opens with (viewstate.default_view)."""
    return PREFERRED_CKPT if PREFERRED_CKPT in cs.names else cs.names[0]
