"""Position encodings behind one interface (see base.py) and their registry.

Importing this package registers: none, ape, ape2d, sincos2d, rpb, rope_axial,
rope_mixed, cope, sape2, and for imported models rpb_cls (BEiT) and rope_dinov3 (DINOv3).
Compose with '+', e.g. `build_encoding("sape2+ape", ctx)`.
"""
from . import absolute, rpb, rope, cope, sape2  # noqa: F401  (registration, in this order)
from .base import (Composite, EncodingContext, PositionEncoding, available_encodings,
                   build_encoding, register_encoding)
from .cope import cope_bias
from .sape2 import sape2_bias

__all__ = ["Composite", "EncodingContext", "PositionEncoding", "available_encodings",
           "build_encoding", "register_encoding", "cope_bias", "sape2_bias"]
