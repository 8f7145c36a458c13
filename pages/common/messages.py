"""Messages every page shows the same way: text from a URL or a file name escaped so that it is
shown literally, notes as warnings, and how to get checkpoints when the folder has none."""
from __future__ import annotations

import re
from typing import Sequence

import streamlit as st

from . import cache

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]#!|<>~$:])")


def escape_md(text: str) -> str:
    """Escape Markdown so text from a URL is shown literally (no links, images or HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", text)


def code_md(text: str) -> str:
    """`text` as a Markdown code span, shown literally: inside a code span backslash escapes are
    not read, so `escape_md` would show its backslashes ("vit\\_tiny"); the fence is one backtick
    longer than any run of backticks in the text (CommonMark), with spaces where it touches one."""
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def show_notes(notes: Sequence[str]) -> None:
    """Each note as a warning, its text shown literally."""
    for note in notes:
        st.warning(escape_md(note), icon="⚠️")


def no_checkpoints_info() -> None:
    """What to run to get checkpoints, and how to point the app at another folder."""
    root = cache.checkpoint_root()
    st.info(
        f"No checkpoints found in `{root}`.\n\n"
        "Train the shipped set (resumable, about an hour per model on a GPU):\n\n"
        "```bash\nbash scripts/train_checkpoints.sh data 15\n```\n\n"
        "or one model:\n\n"
        "```bash\npython -m vitpe_core train --encoding sape2+ape --dataset cifar10 --preset compact "
        "--data-dir data --download --checkpoint checkpoints/sape2+ape.safetensors\n```\n\n"
        f"To use another folder, set `{cache.ENV_VAR}=/path/to/folder` before `streamlit run app.py`.")


def no_head(features: int) -> str:
    """What the bias page says instead of a prediction for a backbone (DINOv3, CLIP's or SigLIP's vision tower)."""
    return f"No classification head: the model puts out {features} features, not classes, so there is no prediction."
