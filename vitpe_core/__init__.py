"""vitpe_core: Vision Transformers with many position encodings, and the tools to see them.

Usable without Streamlit. The main entry points:
    from vitpe_core import ViTConfig, build_model, available_encodings, preset_config
    from vitpe_core.checkpoint import load_checkpoint, save_checkpoint, import_timm
    from vitpe_core import analysis
"""
from .config import PRESETS, ViTConfig, preset_config
from .encodings import available_encodings, build_encoding, cope_bias, sape2_bias
from .model import ViT, build_model

__all__ = ["PRESETS", "ViT", "ViTConfig", "available_encodings", "build_encoding", "build_model",
           "cope_bias", "preset_config", "sape2_bias"]
__version__ = "0.1.0"
