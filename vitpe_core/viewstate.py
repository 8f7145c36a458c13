"""The app's view state and its URL form, without Streamlit.

A view is what a shared link reopens: the page, the checkpoint, the image (a gallery id),
the query patch `(r, c)` (row-major, docs/encodings.md), the layer and the head (`None` = mean
over heads). `parse_view` turns a query string (as `st.query_params` or
`urllib.parse.parse_qs` give it) into a valid `ViewState` plus one human-readable note for
every value it had to replace by its default; `to_query` is its inverse:

    view, notes = parse_view({"ckpt": "sape2+ape", "patch": "3,4"}, checkpoints=names,
                             images=gallery_ids(), grid=(8, 8), depth=6, heads=4)
    assert parse_view(to_query(view), ...)[0] == view

Deliberate choices:
* `parse_view` never raises, for any mapping of any values (it is fuzzed with hypothesis):
  a value of the wrong type, out of range, unknown, or longer than `MAX_VALUE_CHARS` falls
  back to the default with a note. Unknown keys are ignored (links may carry tracking tags).
* A repeated key (`?layer=1&layer=2`) uses the last value, as `st.query_params[key]` does.
* Notes quote a value shortened to 40 characters, so a hostile URL cannot flood the page.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

PAGES: tuple[str, ...] = ("similarity", "bias", "compare", "checkpoints")
DEFAULT_PAGE = "bias"
PREFERRED_CKPT = "sape2+ape"   # the paper's best model, shown first when it is shipped
MAX_VALUE_CHARS = 64
KEYS: tuple[str, ...] = ("page", "ckpt", "image", "patch", "layer", "head")
MEAN_HEAD = "mean"
_INT = re.compile(r"[+-]?[0-9]{1,6}")

Grid = tuple[int, int]


@dataclass(frozen=True)
class ViewState:
    page: str = DEFAULT_PAGE
    ckpt: str = ""                      # "" when no checkpoint is available
    image: str = ""                     # gallery id, "" when the gallery is empty
    patch: tuple[int, int] = (0, 0)     # (r, c) on the model's grid
    layer: int = 0
    head: int | None = None             # None = mean over heads

    @property
    def head_label(self) -> str:
        return MEAN_HEAD if self.head is None else str(self.head)


def default_view(*, checkpoints: Sequence[str], images: Sequence[str], grid: Grid = (8, 8),
                 page: str = DEFAULT_PAGE) -> ViewState:
    """The view an empty query string opens: the paper's best checkpoint if shipped (else the
    first), the first gallery image, the patch at the grid's centre, layer 0, mean of heads."""
    ckpts = list(checkpoints)
    ckpt = PREFERRED_CKPT if PREFERRED_CKPT in ckpts else (ckpts[0] if ckpts else "")
    H, W = _safe_grid(grid)
    return ViewState(page=page if page in PAGES else DEFAULT_PAGE, ckpt=ckpt,
                     image=images[0] if len(images) else "", patch=(H // 2, W // 2), layer=0, head=None)


def parse_view(params: Mapping[str, Any], *, checkpoints: Sequence[str], images: Sequence[str],
               grid: Grid = (8, 8), depth: int = 6, heads: int = 4) -> tuple[ViewState, list[str]]:
    """Validate a query string. Returns the view (defaults where a value is missing or
    invalid) and a note for each invalid value. Never raises."""
    try:
        return _parse(params, checkpoints, images, grid, depth, heads)
    except Exception as e:  # a last guard: a malformed Mapping must not take the app down
        return default_view(checkpoints=_strings(checkpoints), images=_strings(images), grid=grid), [
            f"The link's parameters could not be read ({type(e).__name__}); showing the default view."]


def to_query(view: ViewState) -> dict[str, str]:
    """The query-string form of `view` (empty checkpoint / image are left out)."""
    q = {"page": view.page, "ckpt": view.ckpt, "image": view.image,
         "patch": f"{view.patch[0]},{view.patch[1]}", "layer": str(view.layer), "head": view.head_label}
    return {k: v for k, v in q.items() if v != ""}


# ----------------------------------------------------------------------------- helpers
def _parse(params, checkpoints, images, grid, depth, heads) -> tuple[ViewState, list[str]]:
    checkpoints, images = _strings(checkpoints), _strings(images)
    H, W = _safe_grid(grid)
    depth, heads = _positive(depth), _positive(heads)
    base = default_view(checkpoints=checkpoints, images=images, grid=(H, W))
    notes: list[str] = []
    raw = {k: _last(params, k) for k in KEYS}
    values: dict[str, Any] = {}

    def refuse(key: str, value: str, why: str) -> None:
        notes.append(f"Ignored {key}={_show(value)}: {why}; "
                     f"using {key}={_show(_default_text(base, key))}.")

    for key, value in raw.items():
        if value is None or (value == "" and key in ("ckpt", "image")):   # "" = none chosen
            continue
        if not isinstance(value, str):
            refuse(key, f"<{type(value).__name__}>", "not text")
            continue
        if len(value) > MAX_VALUE_CHARS:
            refuse(key, value, f"longer than {MAX_VALUE_CHARS} characters")
            continue
        if key == "page":
            if value in PAGES:
                values["page"] = value
            else:
                refuse(key, value, f"not a page (valid: {', '.join(PAGES)})")
        elif key == "ckpt":
            if value in checkpoints:
                values["ckpt"] = value
            elif not checkpoints:
                refuse(key, value, "no checkpoints are available")
            else:
                refuse(key, value, "no checkpoint of that name in the folder")
        elif key == "image":
            if value in images:
                values["image"] = value
            elif value == "upload":
                refuse(key, value, "uploaded images cannot be shared by link; upload it again")
            else:
                refuse(key, value, "not a gallery image")
        elif key == "patch":
            patch = _parse_patch(value)
            if patch is None:
                refuse(key, value, "expected 'row,col' with two integers")
            elif not (0 <= patch[0] < H and 0 <= patch[1] < W):
                refuse(key, value, f"outside the {H}x{W} patch grid (rows 0-{H - 1}, columns 0-{W - 1})")
            else:
                values["patch"] = patch
        elif key == "layer":
            n = _parse_int(value)
            if n is None:
                refuse(key, value, "not an integer")
            elif not 0 <= n < depth:
                refuse(key, value, f"valid layers are 0-{depth - 1}" if depth > 1 else "the only layer is 0")
            else:
                values["layer"] = n
        elif key == "head":
            if value.strip().lower() == MEAN_HEAD:
                values["head"] = None
                continue
            n = _parse_int(value)
            if n is None:
                refuse(key, value, f"expected '{MEAN_HEAD}' or an integer")
            elif not 0 <= n < heads:
                refuse(key, value, f"valid heads are 0-{heads - 1}" if heads > 1 else "the only head is 0")
            else:
                values["head"] = n
    return ViewState(**{**base.__dict__, **values}), notes


def _last(params: Mapping[str, Any], key: str) -> Any:
    """The last value of `key` (a str, or the last item of a list/tuple); None if absent."""
    if key not in params:
        return None
    value = params[key]
    if isinstance(value, (list, tuple)):
        return value[-1] if value else None
    return value


def _parse_int(value: str) -> int | None:
    value = value.strip()
    return int(value) if _INT.fullmatch(value) else None


def _parse_patch(value: str) -> tuple[int, int] | None:
    parts = value.split(",")
    if len(parts) != 2:
        return None
    r, c = (_parse_int(p) for p in parts)
    return None if r is None or c is None else (r, c)


def _safe_grid(grid: Any) -> Grid:
    try:
        H, W = (int(g) for g in grid)
    except Exception:
        return (1, 1)
    return (max(1, H), max(1, W))


def _positive(n: Any) -> int:
    try:
        return max(1, int(n))
    except Exception:
        return 1


def _strings(items: Any) -> list[str]:
    try:
        return [s for s in items if isinstance(s, str)]
    except Exception:
        return []


def _show(value: str) -> str:
    text = value if len(value) <= 40 else value[:37] + "..."
    return repr(text)


def _default_text(view: ViewState, key: str) -> str:
    return to_query(view).get(key, "(none)")
