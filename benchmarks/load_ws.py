"""The load test's websocket sessions (`ws_user`): a visitor speaking Streamlit's own protocol
through `benchmarks.st_client`, without rendering anything. It opens a share link, then until
the deadline draws actions (`ACTIONS`, `WEIGHTS`): clicks on a patch, page views, image uploads
(`upload_png`), opening its share link in a new session; session 0 also imports a model
(`tiny_model_npz`). Every answer is checked (`check_page`), including for cross-talk: another
session's upload, imported model or view on this session's page. Then the click-only phase.
The sessions that import a ViT-B/16-sized model (`--big-imports`) are `benchmarks.load_big`."""
from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import asdict, dataclass, field

from benchmarks.harness import share_url, url_params
from benchmarks.load_plan import PhaseGate, Spec


PAGES = ("bias", "similarity", "compare", "checkpoints")
ACTIONS = ("click", "page", "upload", "share")
WEIGHTS = (0.6, 0.15, 0.1, 0.15)            # the mix of actions a session draws from
PATCH_MD = re.compile(r"\*\*Patch \((\d+), (\d+)\)\*\*")
UPLOAD_NAME = re.compile(r"load-s(\d+)-u\d+\.png")
MODEL_NAME = "loadmodel"                     # the one imported model: `loadmodel.npz` -> `loadmodel-upload`
MODEL_GRID = (8, 8)                          # its patch grid (32 px, patch 4)


def tiny_model_npz(seed: int = 0) -> bytes:
    """A small timm-layout ViT (.npz of its state dict, as `np.savez` writes timm's weights):
    what a visitor would upload on the Checkpoints page ("Import your own ViT")."""
    import io

    import numpy as np
    import torch

    from vitpe_core import ViTConfig, build_model

    torch.manual_seed(seed)
    model = build_model(ViTConfig(img_size=(32, 32), patch_size=4, dim=64, depth=2, heads=1, mlp_dim=64,
                                  num_classes=10))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    buf = io.BytesIO()
    np.savez(buf, **sd)
    return buf.getvalue()


def upload_png(session: int, n: int, side: int = 96) -> bytes:
    """A distinct photo-sized PNG for each (session, upload)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1000 * session + n)
    a = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


@dataclass
class WsResult:
    """What one websocket session did and saw: latency per action, clicks sent and answered,
    errors, cross-talk, bytes received, its uploads."""

    spec: dict
    index: int
    latency: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in (*ACTIONS, "model", "open")})
    clicks: int = 0
    clicks_sent: int = 0
    errors: list[str] = field(default_factory=list)
    crosstalk: list[str] = field(default_factory=list)
    bytes: int = 0
    uploads: list[str] = field(default_factory=list)
    phase_clicks: int = 0                     # clicks in the click-only phase
    reloads: int = 0                          # a broken page (no patch picker) opened again
    own_models: set[str] = field(default_factory=set)   # the imported models this session may list
    evicted_models: set[str] = field(default_factory=set)   # own models the server's budget evicted (not errors)


def _link(page_text_code: list[str]) -> str | None:
    for t in page_text_code:
        if t.startswith("http://") or t.startswith("https://"):
            return t.strip()
    return None


def share_link_of(session) -> str | None:
    """The page's "Link to this view" (the sidebar's code block)."""
    return _link([el.code_text for kind, el in session.page.elements.values() if kind == "code"])


def check_page(session, res: WsResult, *, page: str, ckpt: str | None = None, patch: tuple[int, int] | None = None,
               upload: str | None = None, owners: dict[str, int] | None = None) -> list[str]:
    """What on the page is wrong: an exception, another page than asked for, a missing own
    upload; and cross-talk (to `res.crosstalk`): another session's upload (by name on the page,
    or its `upload:<sha256>` in the view; `owners`: id -> session) or imported model (in a
    checkpoint list or the view's `ckpt`, not one of `res.own_models`; or its `model=<sha256>`
    in the view, `owners`: `model:<sha256>` -> session)."""
    p = session.page
    wrong = [f"exception on {page}: {e}" for e in p.exceptions(trace=True)]
    texts = p.texts()
    if session.pages.get(page) and p.page_script_hash != session.pages[page]:
        wrong.append(f"{page}: the server ran another page ({session.notices[-1:]})")
    text = "\n".join(texts)
    seen = {m for m in UPLOAD_NAME.findall(text)}
    if seen - {str(res.index)}:
        res.crosstalk.append(f"{page}: another session's upload on the page: sessions {sorted(seen)}")
    if upload and upload not in text:
        wrong.append(f"{page}: own upload {upload!r} not shown")
    for key, w in p.widgets().items():
        if key.endswith("_ckpt") and w.kind == "selectbox":
            models = [o for o in w.proto.options if o.rstrip("_").endswith("-upload")]
            if set(models) - res.own_models:
                res.crosstalk.append(f"{page}: imported models {models} in session {res.index}'s list")
    link = share_link_of(session)
    q = url_params(link) if link else {}
    image = q.get("image") or ""
    if image.startswith("upload:") and owners is not None and owners.get(image, res.index) != res.index:
        res.crosstalk.append(f"{page}: session {owners[image]}'s upload {image[:15]}... in session {res.index}'s view")
    view_ckpt = q.get("ckpt") or ""
    if view_ckpt.rstrip("_").endswith("-upload") and view_ckpt not in res.own_models:
        res.crosstalk.append(f"{page}: imported model {view_ckpt} in session {res.index}'s view")
    model = f"model:{q.get('model')}"
    if q.get("model") and owners is not None and owners.get(model, res.index) != res.index:
        res.crosstalk.append(f"{page}: session {owners[model]}'s model {model[:18]}... in session {res.index}'s view")
    # Not this session's patch or checkpoint: a wrong view (an error). Only what identifies
    # another session (its upload, its model) counts as cross-talk: starting views repeat.
    listed = checkpoint_options(session)
    if ckpt in res.own_models and listed and ckpt not in listed:
        res.evicted_models.add(ckpt)      # the budget evicted it (another import): the page fell back, as it should
        ckpt = patch = None
    if patch is not None:
        shown = PATCH_MD.findall(text)
        if shown != [(str(patch[0]), str(patch[1]))]:
            wrong.append(f"{page}: patch texts {shown}, expected {patch}")
        if q.get("patch") != f"{patch[0]},{patch[1]}":
            wrong.append(f"{page}: link {link} does not carry patch {patch}")
    if ckpt is not None and q.get("ckpt") != ckpt:
        wrong.append(f"{page}: link {link} does not carry ckpt {ckpt}")
    return wrong


def checkpoint_options(session) -> set[str]:
    """Every option of the page's checkpoint select boxes (`*_ckpt`)."""
    return {o for key, w in session.page.widgets().items() if key.endswith("_ckpt") and w.kind == "selectbox"
            for o in w.proto.options}


def click_state(session, page: str, target: tuple[int, int], grid: tuple[int, int]) -> tuple[str, dict]:
    """How the tab sends a click on patch `target`, as the page offers it: the clickable image
    component (`<page>_click`, its {x, y, width, height} value), a Plotly chart with point
    selection (the selection of the patch's point), else the row/column number inputs."""
    widgets = session.page.widgets()
    w = widgets.get(f"{page}_click")
    (r, c), (H, W) = target, grid
    if w is not None and w.kind == "component_instance":
        width, height = 20.0 * W, 20.0 * H
        session.set_json_value(w.id, {"x": (c + 0.5) * width / W, "y": (r + 0.5) * height / H, "width": width,
                                      "height": height, "unix_time": int(time.time() * 1000)})
        return "component", {}
    if w is not None and w.kind == "plotly_chart":
        # what Streamlit's frontend sends for a click on one marker of the picker's scatter trace
        # (trace 1, over the image trace 0): the point's index, position and customdata [r, c]
        n = r * W + c
        point = {"curve_number": 1, "point_number": n, "point_index": n, "x": (c + 0.5) * 20, "y": (r + 0.5) * 20,
                 "customdata": [r, c]}
        session.set_selection(w.id, {"selection": {"points": [point], "point_indices": [n], "box": [],
                                                   "lasso": []}})
        return "plotly", {}
    session.set_number(f"{page}_row", r)
    session.set_number(f"{page}_col", c)
    return "inputs", {}


async def _reload(s, base: str, spec: Spec, ckpt: str, grid: tuple[int, int], patch: tuple[int, int],
                  timeout: float):
    """Close the tab and open its last link (bias page) again: (session, page, ckpt, grid, patch)
    as the reloaded page shows them."""
    from benchmarks.st_client import open_session

    link = share_link_of(s) if s.page.elements else None
    q = url_params(link) if link else {}
    q = {"ckpt": q.get("ckpt", ckpt), "image": q.get("image", spec.image), "patch": q.get("patch")}
    await s.close()
    url = share_url(base, ckpt=q["ckpt"], image=q["image"],
                    patch=tuple(int(x) for x in q["patch"].split(",")) if q["patch"] else patch)
    s, _ = await open_session(base, "/?" + url.split("?", 1)[1], timeout)
    shown = url_params(share_link_of(s) or "")
    ckpt = shown.get("ckpt", q["ckpt"])
    grid = MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else spec.grid
    patch = tuple(int(x) for x in shown["patch"].split(",")) if shown.get("patch") else patch
    return s, "bias", ckpt, grid, patch


async def ws_user(base: str, spec: Spec, index: int, gate: PhaseGate, *, think: tuple[float, float],
                  click_timeout: float, load_timeout: float, model_npz: bytes | None,
                  click_phase: float, grids: dict[str, tuple[int, int]] | None = None) -> WsResult:
    """One visitor: opens a share link, then until the deadline draws actions (clicks, page
    views, image uploads, opening its share link in a new tab); session 0 also imports a model."""
    from benchmarks.st_client import open_session

    res = WsResult(spec=asdict(spec), index=index)
    if model_npz is not None and index == 0:
        res.own_models = {f"{MODEL_NAME}-upload"}
    rng = random.Random(spec.seed)
    grids = grids or {spec.ckpt: spec.grid}
    page, patch, upload, n_up, ckpt, grid = "bias", spec.patch, None, 0, spec.ckpt, spec.grid
    s = None
    try:
        t0 = time.monotonic()
        s, _ = await open_session(base, "/?" + share_url(base, ckpt=spec.ckpt, image=spec.image,
                                                           patch=spec.patch).split("?", 1)[1], load_timeout)
        res.latency["open"].append(time.monotonic() - t0)
        res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
    except Exception as e:  # noqa: BLE001 — every failure is recorded, the run goes on
        res.errors.append(f"open: {type(e).__name__}: {e}")
        gate.leave_early()
        await gate.arrive()
        if s is not None:
            await s.close()
        return res
    await gate.arrive()
    model_at = gate.opened_at if (model_npz is not None and index == 0) else None   # its first action
    queued: list[str] = []      # after the import: a click (on the bias page) and its share link, always
    while time.monotonic() < gate.deadline:
        if model_at is not None and time.monotonic() >= model_at:
            action, model_at, queued = "model", None, ["click", "share"]
        elif queued:
            action = queued.pop(0)
        else:
            action = rng.choices(ACTIONS, WEIGHTS)[0]
            if action in ("upload", "share") and page != "bias":
                action = "page"
        try:
            t0 = time.monotonic()
            if action == "click":
                if page != "bias":
                    await s.run(page="bias", timeout=click_timeout)
                    page = "bias"
                if not any(k in s.page.widgets() for k in ("bias_click", "bias_row")):
                    # the page broke (an exception box, no picker): reload it, as a visitor would
                    s, page, ckpt, grid, patch = await _reload(s, base, spec, ckpt, grid, patch, load_timeout)
                    res.reloads += 1
                    res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
                H, W = grid
                target = patch
                while target == patch:
                    target = (rng.randrange(H), rng.randrange(W))
                click_state(s, "bias", target, grid)
                res.clicks_sent += 1
                st = await s.run(timeout=click_timeout)
                patch = target
                res.clicks += 1
                res.bytes += st.bytes
                res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch, upload=upload)
            elif action == "page":
                page = rng.choice([p for p in PAGES if p != page])
                st = await s.run(page=page, timeout=click_timeout)
                res.bytes += st.bytes
                # a page may show another checkpoint than the session's (the similarity page needs
                # a position table): the session's view is what its link now says
                q = url_params(share_link_of(s) or "")
                if q.get("ckpt") and q["ckpt"] != ckpt:
                    ckpt = q["ckpt"]
                    grid = grids.get(ckpt, MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else grid)
                if q.get("patch"):
                    patch = tuple(int(x) for x in q["patch"].split(","))
                res.errors += check_page(s, res, owners=gate.owners, page=page,
                                         upload=upload if page == "bias" else None)
            elif action == "upload":
                n_up += 1
                name = f"load-s{index}-u{n_up}.png"
                await s.upload(f"{page}_upload" if f"{page}_upload" in s.page.widgets() else
                               next(k for k in s.page.widgets() if k.startswith(f"{page}_upload")),
                               name, upload_png(index, n_up), "image/png")
                st = await s.run(timeout=click_timeout)
                res.bytes += st.bytes
                upload = name
                res.uploads.append(name)
                image = url_params(share_link_of(s) or "").get("image", "")
                if image.startswith("upload:"):                  # a shareable upload: its id is this session's
                    gate.owners.setdefault(image, index)
                text = s.page.text()
                m = PATCH_MD.findall(text)
                patch = (int(m[0][0]), int(m[0][1])) if m else patch
                res.errors += check_page(s, res, owners=gate.owners, page=page, upload=upload)
            elif action == "share":
                link = share_link_of(s)
                other, _ = await open_session(base, "/?" + link.split("?", 1)[1], load_timeout)
                try:
                    res.errors += check_page(other, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
                    theirs, mine = url_params(share_link_of(other) or "").get("image"), url_params(link).get("image")
                    if theirs != mine:                           # an upload's link opens the same upload
                        res.errors.append(f"share: the link's image {mine} opened as {theirs}")
                finally:
                    await other.close()
            elif action == "model":
                st = await s.run(page="checkpoints", timeout=click_timeout)
                page = "checkpoints"
                await s.upload("checkpoints_model_upload", f"{MODEL_NAME}.npz", model_npz)
                await s.run(timeout=click_timeout)
                await s.run(timeout=load_timeout, trigger=s.trigger("checkpoints_model_import"))
                text = s.page.text()
                if f"Imported as `{MODEL_NAME}-upload`" not in text:
                    res.errors.append(f"model import not confirmed: {[t for t in s.page.texts() if 'mport' in t]}")
                res.errors += check_page(s, res, owners=gate.owners, page="checkpoints")
                ck = s.page.widgets().get("checkpoints_ckpt")
                if ck is None or f"{MODEL_NAME}-upload" not in ck.proto.options:
                    res.errors.append("the imported model is not in its own session's checkpoint list")
                q = url_params(share_link_of(s) or "")
                if q.get("model") and q.get("ckpt") == f"{MODEL_NAME}-upload":
                    gate.owners.setdefault(f"model:{q['model']}", index)    # for the cross-talk check
                ckpt = q.get("ckpt", ckpt)            # the page switches the session to the imported model
                grid = MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else grid
                patch = tuple(int(x) for x in q["patch"].split(",")) if q.get("patch") else patch
            res.latency[action].append(time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"{action}: {type(e).__name__}: {str(e)[:200]}")
            # The tab no longer knows what the server is doing (a late answer would be taken for
            # the next one's): reload it from its last link, as a visitor would, and carry on.
            try:
                s, page, ckpt, grid, patch = await _reload(s, base, spec, ckpt, grid, patch, load_timeout)
                res.reloads += 1
            except Exception as e2:  # noqa: BLE001
                res.errors.append(f"reload: {type(e2).__name__}: {str(e2)[:200]}")
                break
        await asyncio.sleep(rng.uniform(*think))
    # the click-only phase: server CPU per click without page views, uploads or new sessions
    if click_phase > 0 and s.closed_reason:
        gate.leave_early()
    elif click_phase > 0:
        await gate.arrive_phase()
        try:
            if page != "bias":
                await s.run(page="bias", timeout=click_timeout)
            while time.monotonic() < gate.phase_deadline or not res.phase_clicks:   # at least one each
                H, W = grid
                target = patch
                while target == patch:
                    target = (rng.randrange(H), rng.randrange(W))
                click_state(s, "bias", target, grid)
                t0 = time.monotonic()
                res.clicks_sent += 1
                await s.run(timeout=click_timeout)
                patch = target
                res.latency["click"].append(time.monotonic() - t0)
                res.clicks += 1
                res.phase_clicks += 1
                res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch, upload=upload)
                await asyncio.sleep(rng.uniform(*think))
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"click phase: {type(e).__name__}: {str(e)[:200]}")
        await gate.leave_phase()
    await s.close()
    return res
