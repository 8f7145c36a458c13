"""The app's view state and its URL form, without Streamlit.

A view is what a shared link reopens: the page, the checkpoint, the image (a gallery id, or
`upload:<sha256>` for an upload kept in the server's `store.ImageStore`),
the query patch `(r, c)` (row-major, docs/encodings.md), the layer, the head (`None` = mean
over heads) and the training epoch whose recorded table the similarity page shows (`None` =
the final weights; left out of links), and the bias explorer's stress test and rollout: the
shift `(dy, dx)` in pixels of the model's input, the input height (`None` = native), the fill,
the rollout's source token and head fusion (each left out of links at its default: no shift,
native size, zero fill, the query patch, mean; old links open as before), which of the bias
explorer's sections computed only when open are open (`open=rollout,stress`; none by default,
left out of links), and the checkpoints
the compare page shows (`None` = its default, left out of links; `()` = none, `show=-`). `parse_view` turns a
query string (as `st.query_params` or `urllib.parse.parse_qs` give it) into a valid `ViewState`
plus one human-readable note for every value it had to replace by its default; `to_query` is its
inverse:

    view, notes = parse_view({"ckpt": "sape2+ape", "patch": "3,4"}, checkpoints=names,
                             images=gallery_ids(), grid=(8, 8), depth=6, heads=4)
    assert parse_view(to_query(view), ...)[0] == view

Deliberate choices:
* `parse_view` never raises, for any mapping of any values (it is fuzzed with hypothesis):
  a value of the wrong type, out of range, unknown, or longer than `MAX_VALUE_CHARS` falls
  back to the default with a note. Unknown keys are ignored (links may carry tracking tags).
* A repeated key (`?layer=1&layer=2`) uses the last value, as `st.query_params[key]` does.
* Notes quote a value shortened to 40 characters, so a hostile URL cannot flood the page.
* An upload id is accepted on its form alone (`upload:` and exactly 64 lowercase hex digits,
  `is_upload_id`); whether the store still holds it is the app's question, not the parser's.
  Nothing else from a link can name a file.
* `show` is a comma-separated list of checkpoint names (up to `MAX_SHOW_CHARS`); names the
  folder does not hold are dropped with a note and the others kept (a link from a server with
  more checkpoints, or naming another session's imported model), repeats are dropped. A comma or
  percent sign inside a name is written `%2C` / `%25`, and a name that is just `-` (which alone
  means none) `%2D` (`show_value`).
* `model` is the SHA-256 of the imported model file that `ckpt` names (imported models live in
  the server's model store, by content hash): a link carrying it reopens that model in any
  session on this server while the store holds it. The parser checks its form only; whether
  the store holds it, and under which name, is the app's question (`pages.common.cache`).
* The stress and rollout values are checked against what the checkpoint offers
  (`StressLimits`: its shift and size options, its prefix tokens); without limits only the
  defaults are valid.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

PAGES: tuple[str, ...] = ("similarity", "bias", "compare", "checkpoints")
DEFAULT_PAGE = "bias"
PREFERRED_CKPT = "sape2+ape"   # the paper's best model, shown first when it is shipped
MAX_VALUE_CHARS = 72   # the longest valid value: an upload id, `upload:` + 64 hex digits
MAX_SHOW_CHARS = 1024  # but `show`, a list of checkpoint names
NO_CHECKPOINTS = "-"   # `show=-`: the compare page shows none
MEAN_HEAD = "mean"
FINAL_EPOCH = "final"
_INT = re.compile(r"[+-]?[0-9]{1,6}")
UPLOAD_PREFIX = "upload:"
_UPLOAD_ID = re.compile(r"upload:[0-9a-f]{64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

FILLS: tuple[str, ...] = ("zero", "reflect")         # stress test fills; vitpe_core.stress imports them
FUSIONS: tuple[str, ...] = ("mean", "max")
NATIVE_SIZE = "native"
PATCH_SOURCE = "patch"
SECTIONS: tuple[str, ...] = ("rollout", "stress")   # the bias explorer's sections that run only while open

Grid = tuple[int, int]


@dataclass(frozen=True)
class StressLimits:
    """What the bias explorer's stress test and rollout offer for one checkpoint: the shifts
    in pixels (per axis), the input heights in pixels (the native one included), the native
    height, and the rollout's sources (`patch` and the prefix tokens' names)."""
    shifts: tuple[int, ...] = (0,)
    heights: tuple[int, ...] = ()
    native: int = 0
    sources: tuple[str, ...] = (PATCH_SOURCE,)


@dataclass(frozen=True)
class ViewState:
    page: str = DEFAULT_PAGE
    ckpt: str = ""                      # "" when no checkpoint is available
    image: str = ""                     # gallery id, "" when the gallery is empty
    patch: tuple[int, int] = (0, 0)     # (r, c) on the model's grid
    layer: int = 0
    head: int | None = None             # None = mean over heads
    epoch: int | None = None            # recorded training epoch, None = final weights
    shift: tuple[int, int] = (0, 0)     # stress test: (dy, dx) pixels of the model's input
    size: int | None = None             # stress test: input height in pixels, None = native
    fill: str = FILLS[0]                # stress test: what enters at the edge
    rollout: str = PATCH_SOURCE         # rollout of the query patch or of a prefix token (CLS, ...)
    fusion: str = FUSIONS[0]            # rollout's head fusion
    show: tuple[str, ...] | None = None  # compare page's checkpoints, in order; None = the page's default
    open: tuple[str, ...] = ()          # the bias explorer's open sections (SECTIONS), in SECTIONS' order
    model: str = ""                     # SHA-256 of the imported model file `ckpt` names; "" for the folder's

    @property
    def head_label(self) -> str:
        return MEAN_HEAD if self.head is None else str(self.head)


def default_view(*, checkpoints: Sequence[str], images: Sequence[str], grid: Grid = (8, 8),
                 page: str = DEFAULT_PAGE) -> ViewState:
    """The view an empty query string opens: the paper's best checkpoint if shipped (else the
    first), the first gallery image, the patch at the grid's centre, layer 0, mean of heads."""
    view = _defaults(_Limits(list(checkpoints), list(images), _safe_grid(grid), 1, 1))
    return replace(view, page=page) if page in PAGES else view


def parse_view(params: Mapping[str, Any], *, checkpoints: Sequence[str], images: Sequence[str],
               grid: Grid = (8, 8), depth: int = 6, heads: int = 4,
               epochs: Sequence[int] = (), stress: StressLimits | None = None) -> tuple[ViewState, list[str]]:
    """Validate a query string. Returns the view (defaults where a value is missing or
    invalid) and a note for each invalid value. Never raises. `epochs`: the training epochs
    the checkpoint recorded (an `epoch` must be one of them, or `final`); `stress`: the stress
    test's and rollout's options (default: none but the defaults)."""
    try:
        return _parse(params, checkpoints, images, grid, depth, heads, epochs, stress)
    except Exception as e:  # a last guard: a malformed Mapping must not take the app down
        return default_view(checkpoints=_strings(checkpoints), images=_strings(images), grid=grid), [
            f"The link's parameters could not be read ({type(e).__name__}); showing the default view."]


def to_query(view: ViewState) -> dict[str, str]:
    """The query-string form of `view` (empty checkpoint / image and the final epoch are left out)."""
    q = {"page": view.page, "ckpt": view.ckpt, "image": view.image,
         "patch": f"{view.patch[0]},{view.patch[1]}", "layer": str(view.layer), "head": view.head_label,
         "epoch": "" if view.epoch is None else str(view.epoch),
         "shift": "" if tuple(view.shift) == (0, 0) else f"{view.shift[0]},{view.shift[1]}",
         "size": "" if view.size is None else str(view.size),
         "fill": "" if view.fill == FILLS[0] else view.fill,
         "rollout": "" if view.rollout == PATCH_SOURCE else view.rollout,
         "fusion": "" if view.fusion == FUSIONS[0] else view.fusion,
         "show": "" if view.show is None else show_value(view.show),
         "open": ",".join(view.open),
         "model": view.model}
    return {k: v for k, v in q.items() if v != ""}


def implied_sections(view: ViewState) -> tuple[str, ...]:
    """`view.open` with the sections whose settings `view` moves off their defaults (what a link
    from before `open` asked for by its settings alone)."""
    q = to_query(view)
    return tuple(s for s in SECTIONS if s in view.open or any(k in q for k in SECTION_KEYS[s]))


def show_value(names: Sequence[str]) -> str:
    """`show`'s value for checkpoints `names`: joined by commas, with a comma or percent sign
    inside a name written `%2C` / `%25` (a file may be named `a,b`) and a name that is just `-`
    written `%2D` (so it differs from `-`, none); `-` for none."""
    escaped = (n.replace("%", "%25").replace(",", "%2C") for n in names)
    return ",".join("%2D" if n == NO_CHECKPOINTS else n for n in escaped) or NO_CHECKPOINTS


_UNESCAPE = {"C": ",", "D": "-", "5": "%"}   # `%2C`, `%2D`, `%25` in `show` (show_value)


def _show_names(value: str) -> list[str]:
    """The names in `show`'s value (show_value's inverse; a `%` not starting `%2C`/`%25`/`%2D`
    is kept)."""
    return [re.sub(r"%2[CcDd5]", lambda m: _UNESCAPE[m[0][-1].upper()], n.strip())
            for n in value.split(",") if n.strip()]


# ----------------------------------------------------------------------------- one entry per key
@dataclass(frozen=True)
class _Limits:
    """What a link's values are checked against: the names on offer and the model's dimensions."""
    checkpoints: list[str]
    images: list[str]
    grid: Grid
    depth: int
    heads: int
    epochs: tuple[int, ...] = ()
    stress: StressLimits = StressLimits()


class _Invalid(ValueError):
    """A value refused by a key's parser; the message says why (it goes into the note), and
    `keep`, if not None, is the part of the value that stands in for it (instead of the default)."""

    def __init__(self, why: str, keep: Any = None):
        super().__init__(why)
        self.keep = keep


def _page(value: str, lim: _Limits) -> str:
    if value not in PAGES:
        raise _Invalid(f"not a page (valid: {', '.join(PAGES)})")
    return value


def _ckpt(value: str, lim: _Limits) -> str:
    if value not in lim.checkpoints:
        raise _Invalid("no checkpoint of that name in the folder" if lim.checkpoints
                       else "no checkpoints are available")
    return value


def is_upload_id(value: Any) -> bool:
    """`upload:` + exactly 64 lowercase hexadecimal digits (a SHA-256), nothing more."""
    return isinstance(value, str) and _UPLOAD_ID.fullmatch(value) is not None


def upload_id(digest: str) -> str:
    """The view's image id of an upload with SHA-256 `digest`."""
    value = UPLOAD_PREFIX + digest
    if not is_upload_id(value):
        raise ValueError("an upload id is 64 lowercase hexadecimal digits")
    return value


def _image(value: str, lim: _Limits) -> str:
    if value in lim.images or is_upload_id(value):
        return value
    if value.startswith(UPLOAD_PREFIX):
        raise _Invalid("not an upload id (expected 'upload:' and 64 lowercase hexadecimal digits)")
    raise _Invalid("not a gallery image")


def is_model_id(value: Any) -> bool:
    """Exactly 64 lowercase hexadecimal digits (the SHA-256 of an imported weights file)."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _model(value: str, lim: _Limits) -> str:
    if not is_model_id(value):
        raise _Invalid("not a model id (expected 64 lowercase hexadecimal digits)")
    return value


def _patch(value: str, lim: _Limits) -> tuple[int, int]:
    patch, (H, W) = _parse_patch(value), lim.grid
    if patch is None:
        raise _Invalid("expected 'row,col' with two integers")
    if not (0 <= patch[0] < H and 0 <= patch[1] < W):
        raise _Invalid(f"outside the {H}x{W} patch grid (rows 0-{H - 1}, columns 0-{W - 1})")
    return patch


def _layer(value: str, lim: _Limits) -> int:
    return _index(value, lim.depth, "layer", "not an integer")


def _head(value: str, lim: _Limits) -> int | None:
    if value.strip().lower() == MEAN_HEAD:
        return None
    return _index(value, lim.heads, "head", f"expected '{MEAN_HEAD}' or an integer")


def _index(value: str, n: int, noun: str, not_int: str) -> int:
    i = _parse_int(value)
    if i is None:
        raise _Invalid(not_int)
    if not 0 <= i < n:
        raise _Invalid(f"valid {noun}s are 0-{n - 1}" if n > 1 else f"the only {noun} is 0")
    return i


def _epoch(value: str, lim: _Limits) -> int | None:
    if value.strip().lower() == FINAL_EPOCH:
        return None
    i = _parse_int(value)
    if i is None:
        raise _Invalid(f"expected '{FINAL_EPOCH}' or an integer")
    if i not in lim.epochs:
        if not lim.epochs:
            raise _Invalid("this checkpoint recorded no training history")
        raise _Invalid(f"not a recorded epoch (recorded: {_ranges(lim.epochs)})")
    return i


def _shift(value: str, lim: _Limits) -> tuple[int, int]:
    shift, offered = _parse_patch(value), lim.stress.shifts
    if shift is None:
        raise _Invalid("expected 'dy,dx' with two integers (pixels)")
    if not all(d in offered for d in shift):
        lo, hi = min(offered), max(offered)
        step = min((b - a for a, b in zip(sorted(offered), sorted(offered)[1:])), default=1)
        raise _Invalid(f"not a shift this model offers ({lo} to {hi} px in steps of {step} px)" if len(offered) > 1
                       else "this model offers no shift")
    return shift


def _size(value: str, lim: _Limits) -> int | None:
    if value.strip().lower() == NATIVE_SIZE:
        return None
    h = _parse_int(value)
    if h is None:
        raise _Invalid(f"expected '{NATIVE_SIZE}' or an input height in pixels")
    if h not in lim.stress.heights:
        raise _Invalid(f"not an input size this model offers (heights: {', '.join(map(str, lim.stress.heights))} px)"
                       if lim.stress.heights else "this model offers no other input size")
    return None if h == lim.stress.native else h


def _show_list(value: str, lim: _Limits) -> tuple[str, ...]:
    if value.strip() == NO_CHECKPOINTS:
        return ()
    names = list(dict.fromkeys(_show_names(value)))
    if not names:
        raise _Invalid(f"expected checkpoint names separated by commas, or '{NO_CHECKPOINTS}' for none")
    unknown = [n for n in names if n not in lim.checkpoints]
    if unknown:
        kept = tuple(n for n in names if n in lim.checkpoints)
        raise _Invalid(f"no checkpoint{'s' if len(unknown) > 1 else ''} named {', '.join(map(_show, unknown[:3]))}"
                       f"{' and more' if len(unknown) > 3 else ''} here", keep=kept or None)
    return tuple(names)


def _sections(value: str, lim: _Limits) -> tuple[str, ...]:
    names = {n.strip() for n in value.split(",") if n.strip()}
    known = tuple(s for s in SECTIONS if s in names)
    if names - set(SECTIONS):
        raise _Invalid(f"valid sections: {', '.join(SECTIONS)}", keep=known or None)
    return known


def _choice(options: Callable[[_Limits], Sequence[str]]) -> Callable[[str, _Limits], str]:
    def parse(value: str, lim: _Limits) -> str:
        valid = list(options(lim))
        if value not in valid:
            raise _Invalid(f"valid: {', '.join(valid)}")
        return value
    return parse


def _ranges(values: Sequence[int]) -> str:
    """`0-5, 7` for [0, 1, 2, 3, 4, 5, 7] (short, whatever the history's length)."""
    out, run = [], [values[0]]
    for v in values[1:]:
        if v == run[-1] + 1:
            run.append(v)
        else:
            out.append(run)
            run = [v]
    out.append(run)
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out[:4])
    return text + (", ..." if len(out) > 4 else "")


@dataclass(frozen=True)
class _Key:
    parse: Callable[[str, _Limits], Any]    # the value a text stands for, or _Invalid
    default: Callable[[_Limits], Any]       # what an empty query string opens
    blank_is_none: bool = False             # "" = none chosen: not a value to refuse
    max_chars: int = MAX_VALUE_CHARS        # longer values are refused unread


# The query keys, in the order links write them and notes report them; ViewState has one field per key.
_KEYS: dict[str, _Key] = {
    "page": _Key(_page, lambda lim: DEFAULT_PAGE),
    "ckpt": _Key(_ckpt, lambda lim: PREFERRED_CKPT if PREFERRED_CKPT in lim.checkpoints
                 else (lim.checkpoints[0] if lim.checkpoints else ""), blank_is_none=True),
    "image": _Key(_image, lambda lim: lim.images[0] if len(lim.images) else "", blank_is_none=True),
    "patch": _Key(_patch, lambda lim: (lim.grid[0] // 2, lim.grid[1] // 2)),
    "layer": _Key(_layer, lambda lim: 0),
    "head": _Key(_head, lambda lim: None),
    "epoch": _Key(_epoch, lambda lim: None, blank_is_none=True),
    "shift": _Key(_shift, lambda lim: (0, 0)),
    "size": _Key(_size, lambda lim: None),
    "fill": _Key(_choice(lambda lim: FILLS), lambda lim: FILLS[0]),
    "rollout": _Key(_choice(lambda lim: lim.stress.sources), lambda lim: PATCH_SOURCE),
    "fusion": _Key(_choice(lambda lim: FUSIONS), lambda lim: FUSIONS[0]),
    "show": _Key(_show_list, lambda lim: None, blank_is_none=True, max_chars=MAX_SHOW_CHARS),
    "open": _Key(_sections, lambda lim: (), blank_is_none=True),
    "model": _Key(_model, lambda lim: "", blank_is_none=True),
}
# Each section's settings (links leave them out at their defaults, `to_query`).
SECTION_KEYS: dict[str, tuple[str, ...]] = {"rollout": ("rollout", "fusion"), "stress": ("shift", "size", "fill")}
STRESS_KEYS: tuple[str, ...] = (*SECTION_KEYS["stress"], *SECTION_KEYS["rollout"])
KEYS: tuple[str, ...] = tuple(_KEYS)


def _defaults(lim: _Limits) -> ViewState:
    return ViewState(**{key: spec.default(lim) for key, spec in _KEYS.items()})


def _parse(params, checkpoints, images, grid, depth, heads, epochs, stress) -> tuple[ViewState, list[str]]:
    lim = _Limits(_strings(checkpoints), _strings(images), _safe_grid(grid), _positive(depth), _positive(heads),
                  _epochs(epochs), _stress(stress))
    base = _defaults(lim)
    raw = {k: _last(params, k) for k in KEYS}
    values: dict[str, Any] = {}
    notes: list[str] = []
    for key, value in raw.items():
        spec = _KEYS[key]
        if value is None or (value == "" and spec.blank_is_none):
            continue
        shown = value if isinstance(value, str) else f"<{type(value).__name__}>"
        try:
            values[key] = _read(spec, value, lim)
        except _Invalid as why:
            fallback = base if why.keep is None else replace(base, **{key: why.keep})
            if why.keep is not None:
                values[key] = why.keep
            notes.append(f"Ignored {key}={_show(shown)}: {why}; using {key}={_show(_default_text(fallback, key))}.")
    return replace(base, **values), notes


def _read(spec: _Key, value: Any, lim: _Limits) -> Any:
    """`value` through the key's parser, after the checks every key shares."""
    if not isinstance(value, str):
        raise _Invalid("not text")
    if len(value) > spec.max_chars:
        raise _Invalid(f"longer than {spec.max_chars} characters")
    return spec.parse(value, lim)


# ----------------------------------------------------------------------------- helpers
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


def _epochs(items: Any) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(e) for e in items if isinstance(e, int) and not isinstance(e, bool) and e >= 0}))
    except Exception:
        return ()


def _stress(limits: Any) -> StressLimits:
    if not isinstance(limits, StressLimits):
        return StressLimits()
    try:
        return StressLimits(tuple(int(s) for s in limits.shifts), tuple(int(h) for h in limits.heights),
                            int(limits.native), (PATCH_SOURCE, *(s for s in limits.sources if isinstance(s, str)
                                                                  and s != PATCH_SOURCE)))
    except Exception:
        return StressLimits()


def _strings(items: Any) -> list[str]:
    try:
        return [s for s in items if isinstance(s, str)]
    except Exception:
        return []


def _show(value: str) -> str:
    text = value if len(value) <= 40 else value[:37] + "..."
    return repr(text)


_DEFAULT_TEXT = {"epoch": FINAL_EPOCH, "shift": "0,0", "size": NATIVE_SIZE, "fill": FILLS[0], "rollout": PATCH_SOURCE,
                 "fusion": FUSIONS[0], "show": "the page's default", "open": "none"}


def _default_text(view: ViewState, key: str) -> str:
    return to_query(view).get(key, _DEFAULT_TEXT.get(key, "(none)"))
