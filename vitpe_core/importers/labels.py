"""Class names of an imported model: a labels file (`--labels`), a Hugging Face config's
`id2label`, ImageNet-1k's for 1000 classes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..checkpoint import CheckpointError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
MAX_LABELS_BYTES = 4 * 2**20       # a labels file (ImageNet-21k's names take about 0.5 MB)
MAX_LABEL_CHARS = 200


def class_names(n: int, hf_config: Mapping[str, Any] | None) -> list[str] | None:
    """The config's `id2label` when it names `n` classes; ImageNet-1k's for 1000; else None."""
    labels = (hf_config or {}).get("id2label")
    if isinstance(labels, dict) and len(labels) == n:
        try:
            return [str(labels.get(str(i), labels.get(i))) for i in range(n)]
        except (TypeError, ValueError):
            pass
    if n == 1000:
        return imagenet_classes()
    return None


def given_class_names(names: Sequence[str], n: int, source: str) -> list[str]:
    if not n:
        raise CheckpointError(f"{source} names {len(names)} classes, but this model has no classification head "
                              "(it puts out features, not classes); import it without labels")
    if len(names) != n:
        raise CheckpointError(f"{source} names {len(names)} classes, but the model's head has {n} outputs: give one "
                              "name per class, in the order of the head's outputs")
    return [str(x) for x in names]


def parse_labels(text: str, name: str = "the labels file") -> list[str]:
    """Class names from a labels file's text: one name per line, or JSON: `config.json`'s
    `id2label` (`{"0": "tench", ...}`, also inside a whole config.json) or a list of names.
    CheckpointError saying what is wrong (`name` is the file's name in it)."""
    text = text.lstrip("\ufeff")
    stripped = text.strip()
    if not stripped:
        raise CheckpointError(f"{name} is empty: give one class name per line, or JSON such as config.json's "
                              'id2label {"0": "tench", ...}')
    if stripped[0] in "{[":
        names = _json_names(stripped, name)
    else:
        names = [line.strip() for line in text.splitlines()]
        while names and not names[-1]:
            names.pop()
    empty = [i for i, x in enumerate(names) if not x]
    if empty:
        raise CheckpointError(f"{name}: class {empty[0]} has an empty name (line {empty[0] + 1}); give one name per "
                              "class, in the order of the model's outputs")
    long = [x for x in names if len(x) > MAX_LABEL_CHARS]
    if long:
        raise CheckpointError(f"{name}: a class name is longer than {MAX_LABEL_CHARS} characters ({long[0][:40]}…)")
    return names


def _json_names(stripped: str, name: str) -> list[str]:
    try:
        data = json.loads(stripped)
    except ValueError as e:
        raise CheckpointError(f"{name} looks like JSON but does not parse ({e}); give one class name per "
                              'line, or JSON such as {"0": "tench", "1": "goldfish"}') from None
    if isinstance(data, dict) and isinstance(data.get("id2label"), dict):
        data = data["id2label"]
    if isinstance(data, dict):
        try:
            by_index = {int(k): v for k, v in data.items()}
        except (TypeError, ValueError):
            raise CheckpointError(f"{name}: the JSON's keys must be class indices (\"0\", \"1\", ...), as in "
                                  f"config.json's id2label; got {list(data)[:3]}") from None
        if sorted(by_index) != list(range(len(by_index))):
            raise CheckpointError(f"{name}: the class indices must run from 0 to {len(by_index) - 1} without gaps")
        data = [by_index[i] for i in range(len(by_index))]
    if not isinstance(data, list) or not all(isinstance(x, (str, int, float)) for x in data):
        raise CheckpointError(f"{name}: expected JSON id2label ({{\"0\": \"tench\", ...}}) or a list of names")
    return [str(x).strip() for x in data]


def read_labels(path: str | Path) -> list[str]:
    """`parse_labels` of a file (UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no labels file at {str(path)!r}")
    if path.stat().st_size > MAX_LABELS_BYTES:
        raise CheckpointError(f"{path.name} is larger than {MAX_LABELS_BYTES // 2**20} MiB: not a labels file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path.name} is not UTF-8 text: give one class name per line, or JSON") from None
    return parse_labels(text, path.name)


def imagenet_classes() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (first WordNet lemma of each synset)."""
    return (ASSETS / "imagenet1k_classes.txt").read_text(encoding="utf-8").splitlines()
