"""The one resize per position-table kind: `resample_abs_pos_embed` (absolute tables, prefix rows kept)
and `resize_rel_table` (relative-offset tables, incl. BEiT's "geometric" rule as timm has it).

The defaults are checked bit for bit against the `F.interpolate` calls the encodings made before;
"geometric" against timm's own `resize_rel_pos_bias_table` outputs, written by
scripts/make_resize_references.py to tests/data/resize_references.safetensors.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.encodings.absolute import ABS_MODES, resample_abs_pos_embed
from vitpe_core.encodings.rpb import REL_MODES, resize_rel_table

REFS = Path(__file__).parent / "data" / "resize_references.safetensors"


def _posemb(grid, prefix, dim=6, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, prefix + grid[0] * grid[1], dim, generator=g).to(dtype)


def _direct_abs(posemb, new, old, prefix, mode="bicubic", antialias=True):
    """What `resample_abs_pos_embed` computed before `mode` existed, written out (timm semantics)."""
    img = posemb[:, prefix:].float().reshape(1, *old, -1).permute(0, 3, 1, 2)
    align = False if mode in ("bicubic", "bilinear") else None
    img = F.interpolate(img, size=new, mode=mode, antialias=antialias, align_corners=align)
    patches = img.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1).to(posemb.dtype)
    return torch.cat((posemb[:, :prefix], patches), dim=1)


# ---- absolute tables ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("new, old, prefix", [((6, 5), (4, 4), 1), ((3, 3), (5, 7), 0), ((7, 7), (4, 4), 5)])
def test_abs_default_is_todays_bicubic_antialias(dtype, new, old, prefix):
    pos = _posemb(old, prefix, dtype=dtype)
    out = resample_abs_pos_embed(pos, new, old, prefix)
    assert out.dtype == dtype and out.shape == (1, prefix + new[0] * new[1], pos.shape[-1])
    assert torch.equal(out, _direct_abs(pos, new, old, prefix))
    assert torch.equal(out[:, :prefix], pos[:, :prefix])             # prefix rows untouched, bit for bit


@pytest.mark.parametrize("mode, antialias", [(m, False) for m in ABS_MODES] + [("bilinear", True), ("bicubic", False)])
@pytest.mark.parametrize("new", [(6, 5), (2, 3)])
def test_abs_each_mode(mode, antialias, new):
    old, prefix = (4, 4), 2
    pos = _posemb(old, prefix, dtype=torch.bfloat16)
    out = resample_abs_pos_embed(pos, new, old, prefix, mode=mode, antialias=antialias)
    assert out.shape == (1, prefix + new[0] * new[1], pos.shape[-1]) and out.dtype == torch.bfloat16
    assert torch.equal(out, _direct_abs(pos, new, old, prefix, mode, antialias))
    assert torch.equal(out[:, :prefix], pos[:, :prefix])


def test_abs_same_grid_returns_the_input():
    pos = _posemb((4, 5), 1, dtype=torch.float16)
    assert resample_abs_pos_embed(pos, (4, 5), [4, 5], 1) is pos
    assert resample_abs_pos_embed(pos, (4, 5), (4, 5), 1, mode="nearest", antialias=False) is pos


def test_abs_bad_arguments():
    pos = _posemb((4, 4), 1)
    with pytest.raises(ValueError, match="mode must be one of 'bicubic', 'bilinear', 'nearest'"):
        resample_abs_pos_embed(pos, (5, 5), (4, 4), 1, mode="cubic")
    with pytest.raises(ValueError, match="antialias=True works only with mode 'bicubic' or 'bilinear'"):
        resample_abs_pos_embed(pos, (5, 5), (4, 4), 1, mode="nearest")
    with pytest.raises(ValueError, match="mode must be one of"):                   # checked even at the same grid
        resample_abs_pos_embed(pos, (4, 4), (4, 4), 1, mode="trilinear")


# ---- relative-offset tables -----------------------------------------------------------------------------------


def _rel(lead, grid, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, 2 * grid[0] - 1, 2 * grid[1] - 1, generator=g).to(dtype)


def _direct_rel(table, size, mode, antialias=False):
    """The offset_table formula before `resize_rel_table`, on the flattened leading dims."""
    x = table.float().reshape(1, -1, *table.shape[-2:])
    out = F.interpolate(x, size=size, mode=mode, antialias=antialias, align_corners=False)
    return out.reshape(*table.shape[:-2], *size)


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("new", [(6, 5), (3, 3)])
def test_rel_interpolate_modes(mode, lead, new):
    table = _rel(lead, (4, 4), dtype=torch.bfloat16)
    size = (2 * new[0] - 1, 2 * new[1] - 1)
    out = resize_rel_table(table, new, mode=mode)
    assert out.shape == (*lead, *size) and out.dtype == torch.float32
    assert torch.equal(out, _direct_rel(table, size, mode))
    if len(lead) == 2:   # (L, h, ...) in one call == layer by layer, as the importers resize (batch dim)
        per_layer = F.interpolate(table.float(), size=size, mode=mode, align_corners=False)
        assert torch.equal(out, per_layer)
    aa = resize_rel_table(table, new, mode=mode, antialias=True)
    assert torch.equal(aa, _direct_rel(table, size, mode, antialias=True))


def test_rel_default_is_bicubic():
    table = _rel((2,), (4, 3))
    assert torch.equal(resize_rel_table(table, (5, 6)), _direct_rel(table, (9, 11), "bicubic"))


@pytest.mark.parametrize("mode", REL_MODES)
def test_rel_same_size_returns_the_input(mode):
    table = _rel((2, 3), (4, 5), dtype=torch.bfloat16)
    assert resize_rel_table(table, (4, 5), mode=mode) is table


@pytest.mark.parametrize("encoding, mode", [("rpb", "bicubic"), ("rpb_cls", "bilinear")])
def test_offset_tables_unchanged(encoding, mode):
    """`RelativePositionBias` / `RelativePositionBiasCLS.offset_table` give what their own
    `F.interpolate(table[None].float(), ...)[0]` gave, and the build grid's table itself."""
    torch.manual_seed(0)
    enc = build_encoding(encoding, EncodingContext(16, 2, 2, (4, 4)))
    for grid in [(6, 5), (3, 3), (4, 7)]:
        size = (2 * grid[0] - 1, 2 * grid[1] - 1)
        for layer in range(2):
            expected = F.interpolate(enc.rel_tables[layer][None].float(), size=size, mode=mode,
                                     align_corners=False)[0]
            got = enc.offset_table(grid, layer)
            assert got.dtype == torch.float32 and torch.equal(got, expected)
    assert torch.equal(enc.offset_table((4, 4), 1), enc.rel_tables[1])


def test_rel_bad_arguments():
    table = _rel((2,), (4, 4))
    with pytest.raises(ValueError, match="mode must be one of 'bicubic', 'bilinear', 'geometric'"):
        resize_rel_table(table, (5, 5), mode="nearest")
    with pytest.raises(ValueError, match="not 'geometric'"):
        resize_rel_table(table, (5, 5), mode="geometric", antialias=True)
    with pytest.raises(ValueError, match="odd sizes"):
        resize_rel_table(torch.zeros(2, 6, 7), (5, 5))
    with pytest.raises(ValueError, match="odd sizes"):
        resize_rel_table(torch.zeros(7), (5, 5))
    with pytest.raises(ValueError, match="positive"):
        resize_rel_table(table, (0, 5))


# ---- "geometric": timm's BEiT rule ----------------------------------------------------------------------------


def test_geometric_shape_dtype_centre_and_gradient():
    table = _rel((2, 3), (7, 7), dtype=torch.float64).requires_grad_()
    out = resize_rel_table(table, (9, 8), mode="geometric")
    assert out.shape == (2, 3, 17, 15) and out.dtype == torch.float32
    assert torch.equal(out[..., 8, 7], table[..., 6, 6].detach().float())     # offset (0, 0) keeps its value
    out.sum().backward()
    assert table.grad is not None and torch.isfinite(table.grad).all()


@pytest.fixture(scope="module")
def timm_refs():
    if not REFS.exists():
        pytest.skip(f"{REFS.name} is missing: run scripts/make_resize_references.py in a side env with timm")
    from safetensors import safe_open
    with safe_open(str(REFS), "pt") as f:
        cases = json.loads(f.metadata()["cases"])
        return {name: (c, f.get_tensor(f"{name}.in"), f.get_tensor(f"{name}.out")) for name, c in cases.items()}


def test_geometric_equals_timm(timm_refs):
    """Bit for bit timm 1.0.31's `resize_rel_pos_bias_table` (non-scipy path): square up / down,
    BEiT's 3 extra CLS rows kept apart by the caller, non-square in both of timm's layouts, and an
    axis that keeps its size."""
    assert len(timm_refs) >= 6
    for name, (c, table, ref) in timm_refs.items():
        (H0, W0), new, extra = c["old"], tuple(c["new"]), c["extra"]
        if c["layout"] == "flat":    # ((2H-1)(2W-1) + extra, heads) -> (heads, 2H-1, 2W-1), extras apart
            n = (2 * H0 - 1) * (2 * W0 - 1)
            assert table.shape[0] == n + extra, name
            out = resize_rel_table(table[:n].T.reshape(-1, 2 * H0 - 1, 2 * W0 - 1), new, mode="geometric")
            out = torch.cat((out.flatten(1).T, table[n:]), dim=0)
        else:
            out = resize_rel_table(table, new, mode="geometric")
        assert out.shape == ref.shape, name
        assert torch.equal(out, ref), f"{name}: max |diff| {(out - ref).abs().max().item():.3g}"
