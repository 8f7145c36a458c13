"""The similarity page's film: the Figure-7 grid of a learned table over the epochs its
checkpoint recorded, as a Plotly animation (play button, epoch slider) and a GIF download
(rendered from the arrays with Pillow: `figures.figure7_gif`)."""
from __future__ import annotations

import streamlit as st

from vitpe_core import figures, views

from . import cache
from .output import chart
from .viewsync import epochs_of


@cache.budgeted("GIFs", max_items=16)
def _gif(grids: dict) -> bytes:
    return figures.figure7_gif(grids)


def emergence_film(page: str, source: str) -> None:
    """The film of checkpoint `source`'s table (a note when it recorded fewer than two epochs)."""
    epochs = tuple(epochs_of(source))
    if len(epochs) < 2:
        st.caption("A film needs at least two recorded epochs.")
        return
    grids = views.film_grids({e: cache.similarity(source, e)["sim"] for e in epochs},
                             cache.get_checkpoint(source).config.grid)
    chart(figures.figure7_film_fig(grids, title=f"Figure 7 epoch by epoch<br>{source}"),
          f"{source}_figure7_film", key=f"{page}_film")
    init = " (epoch 0: at initialisation)" if epochs[0] == 0 else ""
    st.caption(f"Press ▶ play, or drag the slider: the table at each of the {len(epochs)} recorded epochs{init}, "
               "on the fixed −1…1 scale of the figure above.")
    safe = figures.export_config(f"{source}_figure7_film")["toImageButtonOptions"]["filename"]
    st.download_button(f"GIF: Figure 7 over {len(epochs)} epochs", data=lambda: _gif(grids),
                       file_name=f"{safe}.gif", mime="image/gif", key=f"{page}_film_gif", on_click="ignore",
                       help="An animated GIF, one frame per recorded epoch, labelled with it")
