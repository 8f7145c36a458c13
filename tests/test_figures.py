"""Figure builders: colour ranges that match what the colour bar shows."""
from __future__ import annotations

import numpy as np

from vitpe_core import figures


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
