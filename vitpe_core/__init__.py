"""vitpe_core: Vision Transformers with many position encodings, and the tools to see them.

Usable without Streamlit. The main entry points:
    from vitpe_core import ViTConfig, build_model, available_encodings, preset_config
    from vitpe_core.checkpoint import load_checkpoint, save_checkpoint
    from vitpe_core.importers import import_file   # timm / Hugging Face / RoPE-ViT weights
    from vitpe_core import analysis

The names below are imported on first use (PEP 562), so that `import vitpe_core.viewstate`
and the other torch-free modules do not pay for importing torch (about 2 s cold): the app
draws its first element before that import.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_names

if TYPE_CHECKING:   # the same names, for type checkers and editors
    from .config import PRESETS, ViTConfig, preset_config
    from .encodings import available_encodings, build_encoding, cope_bias, sape2_bias
    from .model import ViT, build_model

_LAZY = {"PRESETS": "config", "ViTConfig": "config", "preset_config": "config",
         "available_encodings": "encodings", "build_encoding": "encodings", "cope_bias": "encodings",
         "sape2_bias": "encodings", "ViT": "model", "build_model": "model"}

__all__ = ["PRESETS", "ViT", "ViTConfig", "available_encodings", "build_encoding", "build_model",
           "cope_bias", "preset_config", "sape2_bias"]   # = sorted(_LAZY) (tests/test_layout.py)
__version__ = "0.3.0"   # the one place: pyproject.toml reads it


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
