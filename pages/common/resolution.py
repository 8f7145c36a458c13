"""The compare page's "Top-1 % at other input resolutions" table (what `python -m vitpe_core
evaluate --sizes ... --record` stored in each checkpoint's metrics)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from vitpe_core import views


def resolution_table(page: str, names, ckpts) -> None:
    rows = views.resolution_rows({n: ckpts[n].metrics for n in names})
    st.markdown("**Top-1 % at other input resolutions**")
    if rows:
        st.dataframe(pd.DataFrame.from_dict(rows, orient="index"), key=f"{page}_resolution", placeholder="—")
    else:
        st.caption("Not measured for these checkpoints: run `python -m vitpe_core evaluate "
                   "checkpoints/NAME.safetensors --sizes 24,32,40,48 --record`.")
