"""The app's "Download this model's report (HTML)": on the Checkpoints page and beside the bias
explorer, for the folder's checkpoints and imported models alike. A click builds the report
(`vitpe_core.html_report`: one self-contained HTML file, charts and an offline bias explorer)
with a progress bar, then offers it with `st.download_button`; the file is kept in the session
for that model and image set only (a later model or image builds anew).

The images: the page's own image first (an upload included, as the model sees it), then the
gallery's defaults, four in all; the position analysis comes from the app's cache.
`vitpe_core.html_report` is imported on the first click only (no page pays for it before).
"""
from __future__ import annotations

import dataclasses

import streamlit as st
from PIL import Image

from vitpe_core.swin.explore import is_swin_model
from vitpe_core.viewstate import is_upload_id

from . import cache, upload_store

BUILT = "_vitpe_report"    # session_state: {"id": (model ref, the page's image), "data": bytes, "file_name": str}
BUILD_LABEL = "Download this model's report (HTML)"
HELP = ("One HTML file to send or keep: the model card, Figure 7, position-only kernels, attention distance and a "
        "bias explorer that works offline (click any patch of four images). It opens in any browser from disk, "
        "no server, no network. The same as `python -m vitpe_core report`.")
SWIN_REFUSAL = ("No HTML report for a Swin model: the report's explorer, kernels and Figure 7 are built for ViTs "
                "(one global grid); the bias explorer shows a Swin's windows.")


def report_images(current: tuple[Image.Image, str, str] | None = None) -> list:
    """The page's image (`(image, key, caption)`; default: this session's upload, if any)
    first, then the gallery's defaults, `DEFAULT_IMAGES` in all (`html_report.ReportImage`s)."""
    from vitpe_core.html_report import ReportImage, default_images
    from vitpe_core.html_report.build import DEFAULT_IMAGES

    if current is None:
        image_id = st.session_state.get("image", "")
        upload = upload_store.stored_image(image_id) if is_upload_id(image_id) else None
        current = None if upload is None else (upload, image_id, "your upload")
    first = [] if current is None else [ReportImage(current[2], current[1], current[0])]
    rest = [im for im in default_images(DEFAULT_IMAGES + 1) if not first or im.key != first[0].key]
    return (first + rest)[:DEFAULT_IMAGES]


def _build(name: str, images: list) -> bytes:
    from vitpe_core.html_report import progress_steps, report_bytes
    from vitpe_core.html_report.build import file_sha256

    ref = cache.model_ref(name)
    path = ref.key if ref.is_file else None
    sha = file_sha256(path) if path else ref.key           # an imported model: its uploaded file's sha256
    total, done = progress_steps(len(images), False) + 1, [0]
    bar = st.progress(0.0, text="Building the report…")

    def progress(step: str) -> None:
        done[0] += 1
        bar.progress(min(1.0, done[0] / total), text=f"Building the report: {step}")

    ckpt = dataclasses.replace(cache.get_checkpoint(name), name=name)    # the page holds its header only
    data = report_bytes(ckpt, images=images, path=path, content_hash=sha, position=cache.position_analysis(name),
                        progress=progress, command=f"the vitpe app's report button ({name})")
    bar.empty()
    return data


def offer(page: str, name: str, ckpt, current: tuple[Image.Image, str, str] | None = None) -> None:
    """The build button, then (once built for this model and images) the download button; for a
    Swin, a line saying the report covers ViT models only."""
    if is_swin_model(ckpt):
        st.caption(SWIN_REFUSAL)
        return
    held, image_id = st.session_state.get(BUILT), st.session_state.get("image", "")
    ident = (tuple(cache.model_ref(name)), current[1] if current else image_id if is_upload_id(image_id) else None)
    if held is None or held["id"] != ident:
        if not st.button(BUILD_LABEL, key=f"{page}_report_build", help=HELP, icon=":material/download:"):
            return
        images = report_images(current)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
        held = st.session_state[BUILT] = {"id": ident, "data": _build(name, images),
                                          "file_name": f"{safe}_report.html"}
    data = held["data"]                                    # handed over on the click (not re-sent every rerun)
    st.download_button(f"Save {held['file_name']} ({len(data) / 1e6:.1f} MB)", data=lambda: data,
                       file_name=held["file_name"], mime="text/html", key=f"{page}_report_save", on_click="ignore",
                       help=HELP, icon=":material/download:")
