"""Figure builders: colour ranges that match what the colour bar shows."""
from __future__ import annotations

import numpy as np
import pytest

from vitpe_core import figures

IMPORTED = "vit_tiny_patch16_224_tinyimagenet_ft-upload"    # an imported model's name (issue 44)


def test_a_half_given_colour_range_is_completed_from_the_data():
    m = np.array([[0.004, 0.02], [0.035, np.nan]])
    fig = figures.patch_map_fig(m, title="", colorbar_title="attention", zmin=0)
    assert (fig.data[0].zmin, fig.data[0].zmax) == (0, 0.035)
    fig = figures.overlay_fig(np.zeros((16, 16, 3), np.uint8), m, (2, 2), zmin=None, zmax=1.0)
    assert (fig.data[1].zmin, fig.data[1].zmax) == (0.004, 1.0)
    fig = figures.pair_fig(m, m, titles=("a", "b"), colorbar_titles=("a", "b"), ranges=((0, 1), (0, None)))
    assert [(t.zmin, t.zmax) for t in fig.data] == [(0, 1), (0, 0.035)]
    fig = figures.layers_fig(np.stack([m, 2 * m]), title="", colorbar_title="", zmin=0, zmax=None)
    assert {(t.zmin, t.zmax) for t in fig.data} == {(0, 0.07)}


def test_unset_ranges_stay_automatic():
    fig = figures.patch_map_fig(np.ones((2, 2)), title="", colorbar_title="")
    assert (fig.data[0].zmin, fig.data[0].zmax) == (None, None)


def test_colour_scales_avoid_streamlit_placeholder_colours():
    """Streamlit swaps the hex colours #000001.. in a Plotly figure for theme colours (its
    Plotly theme's placeholders); Magma starts at #000004 and its low end came out pink."""
    import re

    from plotly.colors import get_colorscale
    from streamlit.elements.lib import streamlit_plotly_theme as theme

    placeholders = {v.lower() for k, v in vars(theme).items()
                    if k.isupper() and isinstance(v, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", v)}
    assert "#000004" in placeholders and "#000004" in [c for _, c in get_colorscale(figures.ATTENTION_SCALE)]
    m = np.random.default_rng(0).random((3, 3))
    figs = [figures.patch_map_fig(m, title="", colorbar_title="", colorscale=s)
            for s in (figures.ATTENTION_SCALE, figures.BIAS_SCALE, figures.SIMILARITY_SCALE)]
    figs.append(figures.similarity_matrix_fig(np.eye(4), (2, 2)))
    for fig in figs:
        for trace in fig.data:
            used = {str(c).lower() for _, c in trace.colorscale}
            assert not used & placeholders, used & placeholders


# ----------------------------------------------------------------------------- titles, colours, small multiples
LONG = "Similarity of the embedding of patch r=3, c=4 to every patch (vit_tiny_patch16_224_tinyimagenet_ft-upload)"


def _all_figures(title: str):
    m = np.random.default_rng(0).random((8, 8))
    yield figures.patch_map_fig(m, title=title, colorbar_title="x")
    yield figures.overlay_fig(np.zeros((64, 64, 3), np.uint8), m, (8, 8), title=title)
    yield figures.layers_fig(np.stack([m] * 6), title=title, colorbar_title="x")
    yield figures.pair_fig(m, m, titles=("a", "b"), colorbar_titles=("a", "b"), title=title)
    yield figures.similarity_matrix_fig(np.eye(4), (2, 2), title=title)
    yield figures.figure7_grid_fig(np.random.default_rng(0).random((2, 2, 2, 2)), title=title)
    yield figures.curves_fig({"epoch": [1, 2], "test_top1": [1.0, 2.0]}, title=title)
    yield figures.topk_fig(np.array([0.5, 0.3, 0.2]), ["a", "b", "c"], title=title)
    yield figures.line_fig([1, 2], {"s": [1, 2]}, title=title, x_title="x", y_title="y")
    yield figures.runs_fig({"a": ([1], [1.0])}, title=title, x_title="x", y_title="y")


def test_every_title_fits_a_phone_wide_chart_below_the_modebar():
    """Plotly does not wrap titles: a line longer than the chart was cut off ("(0 = near, 1 = f",
    "(vit_t"). Every line must fit `NARROW_CHART_PX` at the title font, and the top margin must
    hold the modebar's band plus every line."""
    for title in (LONG, "short", "SaPE² bias row, x part (along the patch's row), layer 3, mean over heads (0 = near)"):
        for fig in _all_figures(title):
            text = fig.layout.title.text
            lines = text.split("<br>")
            assert max(len(s) for s in lines) <= figures.TITLE_MAX_CHARS, lines
            assert max(len(s) for s in lines) * figures.CHAR_EM * fig.layout.title.font.size <= figures.NARROW_CHART_PX
            assert fig.layout.margin.t >= figures.MODEBAR_PX + figures.TITLE_LINE_PX * len(lines)
            t = fig.layout.title
            assert (t.yref, t.y, t.yanchor) == ("container", 1, "top") and t.pad.t >= figures.MODEBAR_PX
            assert " ".join(lines).replace(" ", "") == title.replace(" ", "")              # nothing lost


def test_wrap_title_breaks_at_spaces_and_inside_long_names():
    assert figures.wrap_title("a b c", 3) == ["a b", "c"]
    assert figures.wrap_title("abcdefgh", 3) == ["abc", "def", "gh"]
    assert figures.wrap_title("one<br>two", 10) == ["one", "two"]
    assert figures.wrap_title("") == []


def test_a_checkpoint_keeps_its_colour_in_every_chart_and_no_colour_is_pale():
    import colorsys

    names = ["sincos2d", "ape", "sape2+ape", "rpb", "none", "rope_mixed", "rope_axial", "cope+ape", "ape2d", "sape2"]
    colors = figures.checkpoint_colors(names)
    assert colors == figures.checkpoint_colors(list(reversed(names)))                   # order does not matter
    assert len(set(colors.values())) == len(names)
    acc = figures.runs_fig({n: ([1], [1.0]) for n in names}, title="", x_title="", y_title="", colors=colors)
    struct = figures.runs_fig({n: ([0], [0.5]) for n in ("sincos2d", "ape")}, title="", x_title="", y_title="",
                              colors=colors)
    by_name = {t.name: t.line.color for t in acc.data}
    assert all(t.line.color == by_name[t.name] for t in struct.data)
    for c in figures.CHECKPOINT_PALETTE:                                                  # no pale greys
        r, g, b = (int(c[i:i + 2], 16) / 255 for i in (1, 3, 5))
        _, s, v = colorsys.rgb_to_hsv(r, g, b)
        assert s >= 0.4 and 0.2126 * r + 0.7152 * g + 0.0722 * b <= 0.6, c


def _repo():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def _shipped_names() -> list[str]:
    """`ls checkpoints/*.safetensors checkpoints/long/*.safetensors`, as the app names them."""
    root = _repo() / "checkpoints"
    return sorted([p.name.removesuffix(".safetensors") for p in root.glob("*.safetensors")]
                  + [f"long/{p.name.removesuffix('.safetensors')}" for p in (root / "long").glob("*.safetensors")])


def test_every_shipped_checkpoint_has_its_own_colour_and_keeps_it_whatever_is_shown():
    """Issue 31: 14 checkpoints on a 12-colour palette gave `ape` and `sape2+ape` one colour,
    `ape2d` and `sincos2d` another. Every shipped name (the compare page's list) now has a colour
    of its own, fixed by its name: the same with any other set of names listed alongside."""
    import itertools

    from skimage.color import deltaE_ciede2000, rgb2lab

    names = _shipped_names()
    assert len(names) >= 14 and set(names) <= set(figures.SHIPPED_CHECKPOINTS)
    colors = figures.checkpoint_colors(names)
    assert len(set(colors.values())) == len(names), colors
    assert colors["ape"] != colors["sape2+ape"] and colors["ape2d"] != colors["sincos2d"]
    assert len(figures.CHECKPOINT_PALETTE) >= 20
    lab = {c: rgb2lab(np.array([[[int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]]]))[0, 0]
           for c in figures.CHECKPOINT_PALETTE}
    assert min(float(deltaE_ciede2000(lab[a], lab[b]))
               for a, b in itertools.combinations(figures.CHECKPOINT_PALETTE, 2)) >= 13    # tell-apart colours
    rng = np.random.default_rng(0)
    for _ in range(20):                               # any subset, any extra names: the same colour per name
        subset = [n for n in names if rng.random() < 0.5] + [f"imported-{i}" for i in range(rng.integers(0, 4))]
        sub = figures.checkpoint_colors(subset)
        assert all(sub[n] == colors[n] for n in subset if n in colors), subset
        assert len(set(sub.values())) == len(sub)


def _delta_e(a: str, b: str) -> float:
    """CIEDE2000 colour difference of two `#rrggbb` colours (CIELAB, D65)."""
    from skimage.color import deltaE_ciede2000, rgb2lab

    lab = [rgb2lab(np.array([[[int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)]]]))[0, 0] for c in (a, b)]
    return float(deltaE_ciede2000(*lab))


def _closest(colors) -> tuple[float, str, str]:
    import itertools

    return min((_delta_e(a, b), a, b) for a, b in itertools.combinations(colors, 2))


def test_every_pair_of_checkpoint_colours_is_told_apart_and_the_pairs_shown_at_first_most():
    """Issue 44 item 11d: ape #1f77b4 beside none #00838f (CIEDE2000 17.6), rope_mixed #637939
    beside sape2 #b8860b (25.3) and an import's dark teal #00695c beside none's (14.5) were hard to
    tell apart; the palette's closest pair was 13.2 apart. Now: the ten checkpoints the compare
    page shows at first at least 30 apart, the colours an import gets at least 19 from those and
    from each other, and any two of the palette at least 18."""
    shipped = list(figures.SHIPPED_CHECKPOINTS)
    first = [n for n in shipped if not n.startswith("long/")]
    assert len(first) == 10
    imports = [IMPORTED] + [f"import-{i}" for i in range(5)]
    colors = figures.checkpoint_colors(shipped + imports)
    for a, b in (("ape", "none"), ("rope_mixed", "sape2")):                  # the pairs the issue named
        assert _delta_e(colors[a], colors[b]) >= 30, (a, b, colors[a], colors[b], _delta_e(colors[a], colors[b]))
    assert _delta_e(colors[IMPORTED], colors["none"]) >= 19
    spare = figures.CHECKPOINT_PALETTE[len(shipped):]
    assert len({colors[n] for n in imports}) == len(imports) and {colors[n] for n in imports} <= set(spare)
    assert _closest([colors[n] for n in first]) >= (30, "", "")               # shown together at first
    assert _closest([colors[n] for n in first + imports]) >= (19, "", "")     # with imports
    assert _closest(figures.CHECKPOINT_PALETTE) >= (18, "", "")               # any two


def test_another_name_gets_a_colour_from_its_name_distinct_from_the_others_listed():
    """A name not shipped (an import, another folder) takes a colour picked by a hash of its name
    (the same in every process and link), one that no other listed name has while colours last."""
    import subprocess
    import sys

    alone = figures.checkpoint_colors(["my-vit"])["my-vit"]
    assert figures.checkpoint_colors(["my-vit", *_shipped_names()])["my-vit"] == alone
    assert alone not in figures.checkpoint_colors(_shipped_names()).values()
    code = "from vitpe_core import figures; print(figures.checkpoint_colors(['my-vit'])['my-vit'])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=str(_repo()))
    assert other.stdout.strip() == alone                                              # not Python's salted hash
    many = [f"run-{i}" for i in range(10)] + _shipped_names()
    assert len(set(figures.checkpoint_colors(many).values())) == len(figures.CHECKPOINT_PALETTE)
    assert len(figures.checkpoint_colors(many + ["one-more"])) == len(many) + 1   # past 20: a colour still


@pytest.mark.parametrize("n,cols,rows", [(6, 3, 2), (4, 2, 2), (2, 2, 1), (12, 3, 4), (1, 1, 1)])
def test_small_multiples_are_square_tiles_with_ticks(n, cols, rows):
    """"All layers" / "All heads" were one row of stretched tiles (45-110 px) without ticks."""
    fig = figures.layers_fig(np.random.default_rng(0).random((n, 8, 8)), title="t", colorbar_title="c", patch=(1, 2))
    xs = [k for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]
    assert len(xs) == cols * rows
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    for i in range(n):
        sfx = "" if i == 0 else str(i + 1)
        xa, ya = fig.layout[f"xaxis{sfx}"], fig.layout[f"yaxis{sfx}"]
        assert xa.scaleanchor == f"y{sfx}"                                             # square cells
        assert (ya.domain[1] - ya.domain[0]) * plot_px >= figures.MIN_TILE_PX - 1        # tall enough
        assert xa.showticklabels and ya.showticklabels and xa.dtick == ya.dtick == 2    # ticks 0, 2, 4, 6
    tops = sorted({round(fig.layout["y" + k[1:]].domain[1], 6) for k in xs}, reverse=True)
    assert len(tops) == rows


# ----------------------------------------------------------------------------- charts sized to their maps (issue 31)
def _sized_figures():
    rng = np.random.default_rng(0)
    m = rng.random((8, 8))
    title = "Rollout of CLS, heads fused by max, through 6 layers"
    yield "patch_map", figures.patch_map_fig(m, title=title, colorbar_title="x")
    yield "overlay", figures.overlay_fig(np.zeros((64, 64, 3), np.uint8), m, (8, 8), title=title)
    yield "overlay tall", figures.overlay_fig(np.zeros((64, 32, 3), np.uint8), m[:, :4], (8, 4), title=title)
    yield "layers", figures.layers_fig(np.stack([m] * 6), title=title, colorbar_title="x")
    yield "pair", figures.pair_fig(m, m, titles=("a", "b"), colorbar_titles=("a", "b"), title=title)
    yield "shift_diff", figures.shift_diff_fig(m, m, m - m, title=title, colorbar_title="x")
    yield "similarity", figures.similarity_matrix_fig(np.eye(4), (2, 2), title=title)
    yield "figure7", figures.figure7_grid_fig(rng.random((3, 3, 3, 3)), title=title)
    yield "kernels", figures.kernels_fig({n: rng.random((15, 15)) for n in "abcdefg"}, {}, title=title)
    yield "query kernels", figures.query_kernels_fig({"a": m}, {"a": (1, 1)}, {"a": -2.0}, title=title)


@pytest.mark.parametrize("name, fig", list(_sized_figures()), ids=[n for n, _ in _sized_figures()])
def test_a_map_chart_is_as_wide_as_its_maps_with_the_colour_bar_beside_them(name, fig):
    """Issue 31: on a wide page a map chart stretched to the column's width: its square maps sat
    small in the middle, the colour bar far to their right and the title in a narrow box at the
    left. A map figure now sets its own width (output.chart draws it at that width, a phone
    shrinks it): the plot area holds the maps with no slack, each colour bar starts at the right
    edge of its map, and the title wraps to the chart's width."""
    lay = fig.layout
    assert lay.width and lay.height, name
    plot_w = lay.width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    assert plot_w > 0 and plot_h > 0
    for k in (k for k in lay.to_plotly_json() if k.startswith("xaxis")):                # square cells, no slack
        xa, ya = lay[k], lay["y" + k[1:]]
        trace = next((t for t in fig.data if t.type == "heatmap" and (t.xaxis or "x") == "x" + k[5:]), None)
        if trace is None or trace.z is None:
            continue
        rows, cols = np.shape(trace.z)
        if name.startswith("overlay"):                                                 # the image's pixels
            rows, cols = abs(ya.range[0] - ya.range[1]), abs(xa.range[1] - xa.range[0])
        (x0, x1), (y0, y1) = xa.domain or (0, 1), ya.domain or (0, 1)
        dom_w, dom_h = (x1 - x0) * plot_w, (y1 - y0) * plot_h
        assert dom_w / dom_h == pytest.approx(cols / rows, rel=0.03), (name, k, dom_w, dom_h, rows, cols)
        bar = trace.colorbar if trace.showscale is not False and name not in ("kernels", "query kernels") else None
        if bar is not None and bar.x is not None and trace.showscale is not False:
            assert bar.xanchor == "left" and bar.x == pytest.approx(x1, abs=0.02), (name, k, bar.x)
            right_px = bar.x * plot_w + bar.xpad + bar.thickness
            assert right_px <= plot_w + lay.margin.r - 40, (name, right_px)                # room for its ticks
    lines = lay.title.text.split("<br>")
    assert lay.title.xref == "container" and lay.title.pad.l == figures.TITLE_PAD_PX
    assert max(map(len, lines)) * figures.CHAR_EM * figures.TITLE_FONT_PX <= lay.width - 2 * figures.TITLE_PAD_PX
    assert max(map(len, lines)) <= figures.TITLE_MAX_CHARS                                # and a phone's
    assert lay.margin.t >= figures.MODEBAR_PX + figures.TITLE_LINE_PX * len(lines)


def test_every_colour_bar_sits_beside_its_map():
    """The colour bars of the map charts: at paper x = 1 (just right of the plot area) or at the
    right edge of the map they belong to, never a fixed 1.02 with the maps centred far away."""
    for name, fig in _sized_figures():
        for t in fig.data:
            if t.type == "heatmap" and t.showscale is not False and name not in ("kernels", "query kernels"):
                assert t.colorbar.x is not None and t.colorbar.x <= 1.0 and t.colorbar.xanchor == "left", name


def test_a_title_wraps_to_a_chart_narrower_than_a_phone():
    """A chart narrower than a phone's (a tall image's overlay) wraps its title to its own width."""
    fig = figures.overlay_fig(np.zeros((64, 16, 3), np.uint8), np.zeros((8, 2)), (8, 2), title="word " * 20)
    lines = fig.layout.title.text.split("<br>")
    assert fig.layout.width < figures.NARROW_CHART_PX
    assert max(map(len, lines)) * figures.CHAR_EM * figures.TITLE_FONT_PX <= fig.layout.width - 2 * figures.TITLE_PAD_PX


# ----------------------------------------------------------------------------- emergence as a film
def _film(epochs=(0, 1, 2, 5), grid=(3, 4)):
    from vitpe_core import analysis, views

    rng = np.random.default_rng(0)
    tables = {e: rng.normal(size=(grid[0] * grid[1], 6)) + 0.5 * e for e in epochs}   # (N, D) per epoch
    return views.film_grids({e: analysis.cosine_similarity(t) for e, t in tables.items()}, grid)


def test_the_film_has_one_frame_per_recorded_epoch_and_ends_on_the_static_figures():
    grids = _film()
    fig = figures.figure7_film_fig(grids, title="film")
    assert [f.name for f in fig.frames] == ["0", "1", "2", "5"]
    assert [s.label for s in fig.layout.sliders[0].steps] == ["0", "1", "2", "5"]
    assert {b.method for b in fig.layout.updatemenus[0].buttons} == {"animate"}
    for epoch, frame in ((0, fig.frames[0]), (5, fig.frames[-1])):
        static = figures.figure7_grid_fig(grids[epoch])
        np.testing.assert_array_equal(np.asarray(frame.data[0].z), np.asarray(static.data[0].z))
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), np.asarray(fig.frames[0].data[0].z))
    assert not np.array_equal(np.asarray(fig.frames[0].data[0].z), np.asarray(fig.frames[1].data[0].z), equal_nan=True)


def test_the_gif_decodes_with_one_frame_per_epoch_equal_to_the_static_images():
    import io

    from PIL import Image

    grids = _film()
    data = figures.figure7_gif(grids, cell_px=5, frame_ms=300)
    gif = Image.open(io.BytesIO(data))
    assert gif.format == "GIF" and gif.n_frames == len(grids)
    frames = []
    for k in range(gif.n_frames):
        gif.seek(k)
        frames.append(np.asarray(gif.convert("RGB")))
    for k, epoch in ((0, 0), (-1, 5)):
        static = np.asarray(figures.figure7_image(grids[epoch], cell_px=5))
        np.testing.assert_array_equal(frames[k][figures.FILM_LABEL_PX:], static)       # exact colours
        assert (frames[k][:figures.FILM_LABEL_PX] == 0).all(-1).any()                  # the epoch label is drawn
    assert not np.array_equal(frames[0][figures.FILM_LABEL_PX:], frames[1][figures.FILM_LABEL_PX:])
    with pytest.raises(ValueError):
        figures.figure7_gif({})


def test_encoding_scale_fig_one_line_per_layer_and_panel_with_layer_colours():
    series = {"bias std / logit std": {"L0": ([1, 2], [0.1, 0.2]), "L1": ([1, 2], [0.3, 0.1])},
              "‖E_x‖": {"L0": ([1, 2], [1.0, 2.0]), "L1": ([1, 2], [1.0, 1.5])}}
    fig = figures.encoding_scale_fig(series, title="scale")
    assert len(fig.data) == 4 and [a.text for a in fig.layout.annotations] == list(series)
    by_layer = {}
    for t in fig.data:
        by_layer.setdefault(t.name, set()).add(t.line.color)
    assert set(by_layer) == {"layer 0", "layer 1"} and all(len(c) == 1 for c in by_layer.values())
    assert sum(t.showlegend for t in fig.data) == 2


def _ticks(axis, n: int) -> list[float]:
    """The ticks Plotly draws on an axis over `n` cells (range -0.5 … n - 0.5), from the
    figure's settings; None where they are left to Plotly's own choice (not whole cells)."""
    if axis.tickvals is not None:
        return list(axis.tickvals)
    if axis.dtick is None or (axis.tickmode not in (None, "linear")):
        return None
    t0, step = float(axis.tick0 or 0), float(axis.dtick)
    first = t0 + step * np.ceil((-0.5 - t0) / step)
    return list(np.arange(first, n - 0.5 + 1e-9, step))


@pytest.mark.parametrize("grid", [(4, 4), (2, 3), (3, 5), (14, 14)])
def test_maps_on_a_small_integer_grid_get_integer_ticks_only(grid):
    """Issue 44 item 11a: the bias explorer's heatmap of BEiT's 4 x 4 grid had ticks at -0.5, 0,
    0.5, 1, … (Plotly's own choice on a range of 4 cells): a patch map, the similarity matrix and
    the per-layer tiles now put ticks on whole patches only, at least two per side."""
    H, W = grid
    m = np.random.default_rng(0).random(grid)
    figs = {"patch map": (figures.patch_map_fig(m, title="t", colorbar_title="c", patch=(1, 1)), (W, H)),
            "similarity": (figures.similarity_matrix_fig(np.eye(H * W), grid), (H * W, H * W)),
            "layers": (figures.layers_fig(np.stack([m, m]), title="t", colorbar_title="c"), (W, H))}
    for name, (fig, (nx, ny)) in figs.items():
        for axis, n in ((fig.layout.xaxis, nx), (fig.layout.yaxis, ny)):
            ticks = _ticks(axis, n)
            assert ticks is not None, (name, axis.to_plotly_json())
            assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), (name, ticks)
            assert all(0 <= t <= n - 1 for t in ticks), (name, ticks)


def _mixed_grid_kernels():
    """Small multiples of models on different grids, as the compare page draws an import beside
    the shipped 8 x 8 checkpoints (issue 44 item 7): offset kernels and per-query maps."""
    rng = np.random.default_rng(0)
    grids = {"ape": (8, 8), IMPORTED: (14, 14), "rpb": (8, 8), "wide-run": (6, 10), "sape2": (8, 8),
             "rope_mixed": (8, 8), "tall": (12, 4)}
    kernels = {n: rng.random((2 * h - 1, 2 * w - 1)) for n, (h, w) in grids.items()}
    yield "kernels", figures.kernels_fig(kernels, {n: 0.5 for n in grids}, title="kernels", cols=5)
    maps = {n: rng.random(g) for n, g in grids.items()}
    yield "query", figures.query_kernels_fig(maps, {n: (g[0] // 2, g[1] // 2) for n, g in grids.items()},
                                             {n: -0.25 for n in grids}, title="per query", cols=5)


@pytest.mark.parametrize("name, fig", list(_mixed_grid_kernels()), ids=[n for n, _ in _mixed_grid_kernels()])
def test_small_multiples_of_different_grids_keep_each_panel_square_and_each_title_in_its_tile(name, fig):
    """Issue 44 item 7: every panel's y axis was scaled to the *first* panel's x axis
    (`scaleanchor="x"`), so beside a 14 x 14 import an 8 x 8 model's maps were drawn out of square,
    and the import's title, centred on a 170 px tile, ran over its neighbour's and out of the
    chart. Each panel's y axis is now scaled to its own x axis (square cells, its grid's aspect,
    the panel shrunk inside its tile: `constrain="domain"`), and each title line fits its tile:
    a long name is shortened in the middle over the score, the full name in the hover."""
    lay = fig.layout
    plot_w = lay.width - lay.margin.l - lay.margin.r
    plot_h = lay.height - lay.margin.t - lay.margin.b
    axes = [k for k in lay.to_plotly_json() if k.startswith("yaxis")]
    assert len(axes) == 10                                                    # 7 panels in rows of 5
    for k in axes:
        ya, xa = lay[k], lay["x" + k[1:]]
        assert ya.anchor == "x" + k[5:] and ya.scaleanchor == ya.anchor and ya.scaleratio == 1, (k, ya.scaleanchor)
        if any(t.yaxis == ya.anchor.replace("x", "y") for t in fig.data):       # a panel, not an empty cell
            assert xa.scaleanchor is None and xa.constrain == ya.constrain == "domain", k
    tiles = [(lay[k].domain[1] - lay[k].domain[0]) * plot_w for k in lay.to_plotly_json() if k.startswith("xaxis")]
    lines = [a.text.split("<br>") for a in lay.annotations]
    assert len(lines) == 7 and max(map(len, lines)) == 2
    for text in lines:
        assert all(len(line) * figures.CHAR_EM * figures.SUBPLOT_FONT_PX <= min(tiles) for line in text), text
    assert lines[1] == [figures.short_name(IMPORTED), "rel 0.50" if name == "kernels" else "fit -0.25"]
    assert figures.short_name(IMPORTED).endswith("-upload") and len(figures.short_name(IMPORTED)) <= 21
    assert lines[0] == ["ape · rel 0.50" if name == "kernels" else "ape · fit -0.25"]   # short names: one line
    tops = sorted({lay[k].domain[1] for k in axes}, reverse=True)
    bottoms = sorted({lay[k].domain[0] for k in axes}, reverse=True)
    room = figures.SUBPLOT_TITLES_PX + figures.SUBPLOT_LINE_PX                  # two-line titles
    assert (bottoms[0] - tops[1]) * plot_h >= room                              # between the rows
    assert lay.margin.t >= figures.MODEBAR_PX + figures.TITLE_LINE_PX + room    # above the first
    trace = fig.data[1]
    assert IMPORTED in trace.hovertemplate and trace.hoverlabel.namelength == -1   # the full name on hover


def test_panel_titles_keep_short_names_and_shorten_long_ones_in_the_middle():
    assert figures.panel_title("rpb", "rel 1.00") == "rpb · rel 1.00"
    assert figures.panel_title("rpb") == "rpb"
    assert figures.panel_title("a" * 30) == "a" * 10 + "…" + "a" * 10
    assert figures.panel_title("long/sape2+ape", "rel 0.97") == "long/sape2+ape<br>rel 0.97"
    assert figures.short_name("x" * 21) == "x" * 21 and len(figures.short_name("x" * 22)) == 21


def test_query_kernels_fig_outlines_each_query_and_scales_without_it():
    m = np.zeros((3, 4))
    m[1, 2], m[0, 0] = 100.0, 1.0                                                  # the query itself is far off
    fig = figures.query_kernels_fig({"a": m, "b": m.T}, {"a": (1, 2), "b": (2, 1)}, {"a": 0.5, "b": None}, title="t")
    assert [a.text for a in fig.layout.annotations] == ["a · fit 0.50", "b"]
    assert fig.data[0].zmax < 2                                                  # scaled on the other keys
    rects = [s for s in fig.layout.shapes if s.type == "rect"]
    assert (rects[0].x0, rects[0].y0) == (1.5, 0.5) and (rects[1].x0, rects[1].y0) == (0.5, 1.5)


def test_per_query_titles_show_the_fit_as_it_is_and_the_page_says_it_can_be_negative():
    """Issue 31: "sincos2d · fit -2.02" under a text that called fit a share of variance. The
    title shows `positional.query_fit` unclipped, and the text that explains it says what a
    negative value means."""
    from pages.common.position_panel import QUERY_EXPLAIN
    from vitpe_core.encodings.grid import relative_index
    from vitpe_core.positional import query_fit

    grid, rng = (4, 4), np.random.default_rng(4)
    kernel = rng.normal(size=49)[relative_index(grid).numpy()]
    kernel[5] = 0.01 * rng.normal(size=16)
    fit = query_fit(kernel, grid, 5)
    assert fit < 0
    fig = figures.query_kernels_fig({"k": kernel[5].reshape(grid)}, {"k": (1, 1)}, {"k": fit}, title="t")
    assert fig.layout.annotations[0].text == f"k · fit {fit:.2f}" and f"{fit:.2f}".startswith("-")
    assert "share of" not in QUERY_EXPLAIN and "below 0" in QUERY_EXPLAIN and "R²" in QUERY_EXPLAIN


# ----------------------------------------------------------------------------- fast builders (server CPU per click)
def test_figures_built_without_validation_are_valid_plotly():
    """overlay_fig, patch_map_fig and topk_fig skip Plotly's per-property validation (a click rebuilds
    them); a validated Figure made from their dicts must accept every property."""
    import plotly.graph_objects as go

    m = np.random.default_rng(0).random((8, 8))
    img = np.zeros((64, 48, 3), np.uint8)
    for fig in (figures.topk_fig(np.array([0.5, 0.3, 0.2]), ["a", "b", "c"]),
                figures.overlay_fig(img, m, (8, 8), patch=(2, 3), title="t", colorbar_title="c"),
                figures.overlay_fig(img, m, (8, 8), zmin=None, zmax=None),
                figures.patch_map_fig(m, title="t", colorbar_title="c", patch=(2, 3), zmin=0, zmax=1)):
        go.Figure(fig.to_dict())                                           # raises on an invalid property
    fig = figures.overlay_fig(img, m, (8, 8), patch=(2, 3))
    grid, box = fig.layout.shapes
    assert grid.type == "path" and grid.path.count("M") == 7 + 7          # every inner line, in one shape
    assert "M0,8H48" in grid.path and "M6,0V64" in grid.path
    assert (box.type, box.x0, box.y0, box.x1, box.y1) == ("rect", 18, 16, 24, 24)


def test_the_overlay_image_is_encoded_once_per_image():
    img = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    figures._png_data_uri.cache_clear()
    for _ in range(3):
        figures.overlay_fig(img, np.zeros((4, 4)), (4, 4))
    assert figures._png_data_uri.cache_info().misses == 1
    assert figures.png_data_uri(img.copy()) == figures.png_data_uri(img)
    assert figures.png_data_uri(255 - img) != figures.png_data_uri(img)


def test_export_file_names_are_safe_for_grouped_checkpoints():
    """Chart and download names come from checkpoint names, which can hold a folder
    (`long/ape`) or a `+`: the saved file's name keeps neither (no path, no odd characters)."""
    from vitpe_core.figures import export_config
    name = lambda s: export_config(s)["toImageButtonOptions"]["filename"]  # noqa: E731
    assert name("long/ape_top5") == "long_ape_top5"
    assert name("seeds/sape2+ape-seed1_bias") == "seeds_sape2_ape-seed1_bias"
    assert name("../../etc/passwd") == ".._.._etc_passwd" and "/" not in name("a/" * 80)
    assert len(name("x" * 300)) == 100 and name("") == "figure"


def test_the_package_re_exports_each_modules_public_names_and_each_docstring_lists_its_builders():
    """`figures.X` works for every public function and constant defined in a module of the
    package, and the module's docstring names each such function (a builder moved or added is
    listed where it is)."""
    import ast
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(figures.__path__):
        mod = importlib.import_module(f"vitpe_core.figures.{info.name}")
        assert f"`{info.name}`" in figures.__doc__, info.name
        tree = ast.parse(open(mod.__file__, encoding="utf-8").read())
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        constants = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                     if isinstance(t, ast.Name) and t.id.isupper()]
        for name in (n for n in functions + constants if not n.startswith("_")):
            assert getattr(figures, name) is getattr(mod, name) and name in figures.__all__, (info.name, name)
            assert name in constants or f"`{name}" in mod.__doc__, (info.name, name)
