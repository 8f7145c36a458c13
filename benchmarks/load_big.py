"""The load test's big-import sessions (`--big-imports N`, issue 30): N websocket sessions that
each import a ViT-B/16-shaped model (random weights, timm layout, float16 `.npz`: the builder
is `memory_walk_big.vit_npz`) on the Checkpoints page, then click patches and switch images on
the bias page with that model selected, beside the ordinary sessions of `benchmarks.load_ws`.

Who and when (`BigPlan`, `build_plan`, `Relay`): the last N sessions; the models are built
once, before the server starts, one file per session with the session's index as seed
(distinct files: the server sees N different models, the harder case) or one file for all
(`shared=True`). The imports take turns: a session imports once the previous big session has
had its turn (`turn` answers with its own model, or lost it to an eviction, or failed), and no
earlier than its offset (`stagger` s apart, default 0). The server's memory budget holds one
ViT-B/16 (`vitpe_core.membudget`) and an import makes room for itself before it builds, so
imports at the same time would evict each other's models before anyone clicked them; and
Streamlit holds an upload's bytes until the import form lets go of them. While some big session
has not had its turn, `hold_window` keeps the run's window open for every session (at most
`extra_s` beyond `--seconds`), so the imports happen under the full load; the report says how
long the window was (`window_s`).

What a big session checks (`big_user`): its import is confirmed, and every answer on the bias
page shows its own model (the link's `ckpt` and the checkpoint list), the patch it clicked and
the image it switched to. A page never shows another session's model (`load_ws.check_page`:
the checkpoint list, the link's `ckpt` and `model=<sha256>` against the session that imported
it): that is cross-talk. A model the server's memory budget evicted is not an error (the budget
holds one ViT-B/16: `vitpe_core.membudget`): the session counts the eviction and clicks on the
checkpoint the page falls back to; those clicks are the ordinary `click` latency, and only
clicks answered with the session's own model are `big_click`. The report's `big_imports`
section is `big_summary`.
"""
from __future__ import annotations

import asyncio
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import url_params
from benchmarks.load_plan import PhaseGate, Spec
from benchmarks.load_probes import latency_stats
from benchmarks.load_ws import ACTIONS, WsResult, check_page, checkpoint_options, click_state, share_link_of

BIG_ACTIONS = ("big_import", "big_click", "big_image", "image")
BIG_GRID = (14, 14)                 # 224 px, patch 16: every shape of memory_walk_big.SHAPES
POOL_EVICTED = re.compile(r"memory budget: evicted (.+)$")


@dataclass
class BigPlan:
    """The big-import sessions: index -> its `.npz` file and when its import starts (s after
    every session has loaded); `shared`: one file for all."""

    shape: str
    files: dict[int, Path]
    offsets: dict[int, float]
    shared: bool
    build_s: float = 0.0
    turn: int = 3                   # answers with its own model before the next session imports
    extra_s: float = 240.0          # the longest the window is held open beyond --seconds for the turns

    def name(self, index: int) -> str:
        """The model's name in the session's lists (the importer's: the file's stem + `-upload`)."""
        return f"{self.files[index].stem}-upload"


def build_plan(sessions: int, n: int, shape: str, folder: Path, *, stagger: float = 0.0, shared: bool = False,
               turn: int = 3, extra_s: float = 240.0) -> BigPlan:
    """Build the models (once, before the server starts, so that the server does not share the
    CPU with the builder) for the last `n` of `sessions`; imports at least `stagger` s apart."""
    from benchmarks.memory_walk_big import vit_npz

    if not 0 < n <= sessions:
        raise ValueError(f"--big-imports {n}: between 1 and --sessions ({sessions})")
    indices = list(range(sessions - n, sessions))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    files: dict[int, Path] = {}
    for i in indices:
        path = folder / (f"load{shape}.npz" if shared else f"load{shape}-s{i}.npz")
        if not path.exists():
            print(f"building {path.name} (ViT {shape}, random weights)", file=sys.stderr, flush=True)
            path.write_bytes(vit_npz(0 if shared else i, shape))
        files[i] = path
    return BigPlan(shape, files, {i: k * stagger for k, i in enumerate(indices)}, shared,
                   round(time.monotonic() - t0, 1), turn, extra_s)


class Relay:
    """The big imports in turn: a session may import once the one before it has had its turn."""

    def __init__(self, order: list[int]):
        self.order = list(order)
        self.done = {i: asyncio.Event() for i in self.order}

    def my_turn(self, index: int) -> bool:
        k = self.order.index(index)
        return k == 0 or self.done[self.order[k - 1]].is_set()

    def finish(self, index: int) -> None:
        self.done[index].set()

    def all_done(self) -> bool:
        return all(e.is_set() for e in self.done.values())


async def hold_window(gate: PhaseGate, relay: Relay, extra_s: float) -> None:
    """Keep every session's window open (`gate.deadline` a few seconds ahead) until each big
    session has had its turn, at most `extra_s` beyond the planned end: the imports are meant
    to happen under the run's load, not after the others stopped."""
    await gate.open.wait()
    end = gate.deadline + extra_s
    while not relay.all_done() and time.monotonic() < end:
        gate.deadline = max(gate.deadline, min(end, time.monotonic() + 5))
        await asyncio.sleep(0.5)


@dataclass
class BigResult(WsResult):
    """`WsResult` plus what a big-import session did: its import(s), the clicks and image
    switches answered with its own model, the evictions of its model it saw."""

    latency: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in
                                                                     (*ACTIONS, "model", "open", *BIG_ACTIONS)})
    model: str = ""
    import_s: list[float] = field(default_factory=list)
    confirmed: bool = False                   # the page said "Imported as `<model>`"
    import_at: float | None = None            # when its import started, s after every session had loaded
    model_clicks: int = 0
    image_switches: int = 0
    evictions_seen: int = 0


@dataclass
class Tab:
    """What the session's tab shows: the page, and the view its link carries."""

    s: Any
    page: str
    ckpt: str
    grid: tuple[int, int]
    patch: tuple[int, int]
    image: str


def listed_models(session) -> set[str]:
    """The imported models in the page's checkpoint lists (`*_ckpt` select boxes)."""
    return {o for o in checkpoint_options(session) if o.rstrip("_").endswith("-upload")}


def follow(tab: Tab, res: BigResult, grids: dict[str, tuple[int, int]]) -> None:
    """Take the view the page's link now carries (checkpoint, its grid, patch, image)."""
    q = url_params(share_link_of(tab.s) or "")
    tab.ckpt = q.get("ckpt", tab.ckpt)
    tab.grid = BIG_GRID if tab.ckpt in res.own_models else grids.get(tab.ckpt, tab.grid)
    if q.get("patch"):
        tab.patch = tuple(int(x) for x in q["patch"].split(","))
    tab.image = q.get("image", tab.image)


def own_shown(tab: Tab, res: BigResult) -> bool:
    """The answer shows this session's model: the link names it and the list holds it."""
    q = url_params(share_link_of(tab.s) or "")
    return q.get("ckpt") in res.own_models and q.get("ckpt") in listed_models(tab.s)


def _judge(tab: Tab, res: BigResult, gate: PhaseGate, grids, wanted: tuple[int, int] | None) -> bool:
    """Check an answer on the bias page; True if it showed the session's own model. A model that
    left the list (the budget evicted it) is counted, not an error: the view follows the page."""
    was_own = tab.ckpt in res.own_models
    if own_shown(tab, res) or not was_own:
        res.errors += check_page(tab.s, res, owners=gate.owners, page="bias", ckpt=tab.ckpt, patch=wanted)
        if wanted is not None:
            tab.patch = wanted
        return was_own
    res.evictions_seen += 1
    res.errors += check_page(tab.s, res, owners=gate.owners, page="bias")
    follow(tab, res, grids)
    return False


async def _to_bias(tab: Tab, res: BigResult, gate: PhaseGate, grids, timeout: float) -> None:
    """Be on the bias page with a patch picker (a page without one is reopened from its link)."""
    if tab.page != "bias":
        await tab.s.run(page="bias", timeout=timeout)
        tab.page = "bias"
        _judge(tab, res, gate, grids, None)
    if not any(k in tab.s.page.widgets() for k in ("bias_click", "bias_row")):
        await reopen(tab, res, gate, grids, timeout)


async def click(tab: Tab, res: BigResult, gate: PhaseGate, grids, rng: random.Random, timeout: float) -> None:
    """A click on another patch of the bias page; its latency is a `big_click` when the answer
    shows the session's own model, else an ordinary `click`."""
    await _to_bias(tab, res, gate, grids, timeout)
    H, W = tab.grid
    target = tab.patch
    while target == tab.patch:
        target = (rng.randrange(H), rng.randrange(W))
    click_state(tab.s, "bias", target, tab.grid)
    res.clicks_sent += 1
    t0 = time.monotonic()
    st = await tab.s.run(timeout=timeout)
    dt = time.monotonic() - t0
    res.clicks += 1
    res.bytes += st.bytes
    own = _judge(tab, res, gate, grids, target)
    res.model_clicks += own
    res.latency["big_click" if own else "click"].append(dt)


async def switch_image(tab: Tab, res: BigResult, gate: PhaseGate, grids, rng: random.Random, timeout: float,
                       images: list[str]) -> None:
    """Another sample image on the bias page (its select box, as the browser sends the choice:
    the option's label); the link must then carry that image."""
    await _to_bias(tab, res, gate, grids, timeout)
    labels = list(tab.s.widget("bias_image").proto.options)
    choice = rng.choice([i for i in range(min(len(labels), len(images))) if images[i] != tab.image])
    tab.s.selectbox_set("bias_image", labels[choice])
    t0 = time.monotonic()
    st = await tab.s.run(timeout=timeout)
    dt = time.monotonic() - t0
    res.bytes += st.bytes
    shown = url_params(share_link_of(tab.s) or "").get("image")
    if shown != images[choice]:
        res.errors.append(f"image: chose {images[choice]}, the link carries {shown}")
    tab.image = shown or tab.image
    own = _judge(tab, res, gate, grids, tab.patch)
    res.image_switches += own
    res.latency["big_image" if own else "image"].append(dt)


async def big_import(tab: Tab, res: BigResult, gate: PhaseGate, plan: BigPlan, index: int, grids,
                     timeout: float) -> None:
    """Import the session's model on the Checkpoints page, as the import form is used: upload
    the file, then press Import; the page must confirm it and list it, and the session's view
    switches to it."""
    t0 = time.monotonic()
    res.import_at = round(t0 - gate.opened_at, 1)
    await tab.s.run(page="checkpoints", timeout=timeout)
    tab.page = "checkpoints"
    path = plan.files[index]
    data = path.read_bytes()
    await tab.s.upload("checkpoints_model_upload", path.name, data, timeout=timeout)
    del data
    await tab.s.run(timeout=timeout)
    await tab.s.run(timeout=timeout, trigger=tab.s.trigger("checkpoints_model_import"))
    dt = time.monotonic() - t0
    res.import_s.append(round(dt, 1))
    res.latency["big_import"].append(dt)
    res.confirmed = f"Imported as `{res.model}`" in tab.s.page.text()
    if not res.confirmed:
        res.errors.append(f"big import not confirmed: {[t[:200] for t in tab.s.page.texts() if 'mport' in t]}")
    res.errors += check_page(tab.s, res, owners=gate.owners, page="checkpoints")
    if res.model not in listed_models(tab.s):
        res.errors.append(f"{res.model} is not in its own session's checkpoint list after the import")
    follow(tab, res, grids)
    sha = url_params(share_link_of(tab.s) or "").get("model")
    if sha and tab.ckpt == res.model and not plan.shared:
        gate.owners.setdefault(f"model:{sha}", index)       # the cross-talk check's owner of this model


async def reopen(tab: Tab, res: BigResult, gate: PhaseGate, grids, timeout: float) -> None:
    """Close the tab and open its last link whole (`model=<sha256>` included, so that the model
    comes back while the server holds it), as a visitor reloads a broken page."""
    from benchmarks.st_client import open_session

    link = share_link_of(tab.s) if tab.s.page.elements else None
    query = link.split("?", 1)[1] if link and "?" in link else \
        f"page=bias&ckpt={tab.ckpt}&image={tab.image}&patch={tab.patch[0]},{tab.patch[1]}"
    await tab.s.close()
    tab.s, _ = await open_session(tab.s.base, "/?" + query, timeout)
    tab.page = "bias"
    res.reloads += 1
    follow(tab, res, grids)
    res.errors += check_page(tab.s, res, owners=gate.owners, page="bias")


async def _act(action: str, tab: Tab, res: BigResult, gate: PhaseGate, plan: BigPlan, index: int, grids,
               rng: random.Random, timeout: float, load_timeout: float, images: list[str]) -> bool:
    """One action; a failure is an error, and the tab is reopened (a late answer would be taken
    for the next one's). False once the tab cannot be reopened either."""
    t0 = time.monotonic()
    try:
        if action == "big_import":
            await big_import(tab, res, gate, plan, index, grids, load_timeout)
        elif action == "image":
            await switch_image(tab, res, gate, grids, rng, timeout, images)
        else:
            await click(tab, res, gate, grids, rng, timeout)
    except Exception as e:  # noqa: BLE001 — every failure is recorded, the run goes on
        res.errors.append(f"{action} after {time.monotonic() - t0:.0f} s: {type(e).__name__}: {str(e)[:200]}")
        try:
            await reopen(tab, res, gate, grids, load_timeout)
        except Exception as e2:  # noqa: BLE001
            res.errors.append(f"reopen: {type(e2).__name__}: {str(e2)[:200]}")
            return False
    return True


async def big_user(base: str, spec: Spec, index: int, gate: PhaseGate, plan: BigPlan, relay: Relay, *,
                   think: tuple[float, float], click_timeout: float, load_timeout: float, click_phase: float,
                   grids: dict[str, tuple[int, int]], images: list[str]) -> BigResult:
    """A big-import session: opens its share link, clicks until its turn to import, imports its
    model, then clicks patches (3 in 4) and switches images (1 in 4) on the bias page until the
    window closes; then the click-only phase, as every session."""
    res = BigResult(spec=asdict(spec), index=index)
    res.model = plan.name(index)
    res.own_models = {res.model}
    try:
        tab = await _open(base, spec, res, gate, load_timeout)
        await gate.arrive()
        if tab is None:
            return res
        alive = await _window(tab, res, gate, plan, relay, index, random.Random(spec.seed), think=think,
                              click_timeout=click_timeout, load_timeout=load_timeout, grids=grids, images=images)
    finally:
        relay.finish(index)           # whatever happened, the next big session may import
    if not alive:
        gate.leave_early()
        return res
    await _click_phase(tab, res, gate, grids, random.Random(spec.seed + 1), think, click_timeout, click_phase)
    await tab.s.close()
    return res


async def _open(base: str, spec: Spec, res: BigResult, gate: PhaseGate, timeout: float) -> Tab | None:
    """Open the session's share link (None if that failed: an error, and the session is out)."""
    from benchmarks.harness import share_url
    from benchmarks.st_client import open_session

    try:
        t0 = time.monotonic()
        s, _ = await open_session(base, "/?" + share_url(base, ckpt=spec.ckpt, image=spec.image,
                                                           patch=spec.patch).split("?", 1)[1], timeout)
        res.latency["open"].append(time.monotonic() - t0)
        res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=spec.ckpt, patch=spec.patch)
        return Tab(s, "bias", spec.ckpt, spec.grid, spec.patch, spec.image)
    except Exception as e:  # noqa: BLE001
        res.errors.append(f"open: {type(e).__name__}: {e}")
        gate.leave_early()
        return None


def _turn_over(res: BigResult, plan: BigPlan) -> bool:
    """The session's turn is over: `plan.turn` answers with its model, or the model is gone, or
    the import failed."""
    return (res.model_clicks + res.image_switches >= plan.turn or res.evictions_seen > 0
            or (bool(res.import_s) and not res.confirmed))


async def _window(tab: Tab, res: BigResult, gate: PhaseGate, plan: BigPlan, relay: Relay, index: int,
                  rng: random.Random, *, think, click_timeout, load_timeout, grids, images) -> bool:
    """The session's actions until the window closes; False if its tab was lost."""
    import_at, imported, alive = gate.opened_at + plan.offsets[index], False, True
    while alive and time.monotonic() < gate.deadline and not tab.s.closed_reason:
        if not imported and time.monotonic() >= import_at and relay.my_turn(index):
            action, imported = "big_import", True
        elif tab.ckpt in res.own_models:
            action = rng.choices(("click", "image"), (0.75, 0.25))[0]
        else:
            action = "click"
        alive = await _act(action, tab, res, gate, plan, index, grids, rng, click_timeout, load_timeout, images)
        if imported and _turn_over(res, plan):
            relay.finish(index)
        await asyncio.sleep(rng.uniform(*think) if action != "big_import" else 0)
    if not imported:
        res.errors.append(f"the import never started: the window closed first "
                          f"({gate.deadline - gate.opened_at:.0f} s; --big-extra-s)")
    return alive


async def _click_phase(tab: Tab, res: BigResult, gate: PhaseGate, grids, rng: random.Random,
                       think: tuple[float, float], timeout: float, click_phase: float) -> None:
    """The click-only phase, as `load_ws.ws_user` takes part in it (at least one click)."""
    if click_phase <= 0:
        return
    if tab.s.closed_reason:
        gate.leave_early()
        return
    await gate.arrive_phase()
    try:
        while time.monotonic() < gate.phase_deadline or not res.phase_clicks:
            await click(tab, res, gate, grids, rng, timeout)
            res.phase_clicks += 1
            await asyncio.sleep(rng.uniform(*think))
    except Exception as e:  # noqa: BLE001
        res.errors.append(f"click phase: {type(e).__name__}: {str(e)[:200]}")
    await gate.leave_phase()


async def server_pools(base: str, timeout: float) -> dict:
    """The memory budget's pools as the Checkpoints page's "Server status" says them."""
    from benchmarks.memory_walk_big import pool_sizes
    from benchmarks.st_client import open_session

    s, _ = await open_session(base, "/?page=checkpoints", timeout)
    text = s.page.text()
    await s.close()
    return {"pools": pool_sizes(text),
            "budget_line": next((ln for ln in text.splitlines() if ln.startswith("Memory budget")), None)}


def evictions(log_text: str, pools: dict) -> dict:
    """The server log's evictions (`memory_walk_big.log_evictions`), per pool of the budget."""
    from benchmarks.memory_walk_big import log_evictions

    lines = log_evictions(log_text)
    per_pool: dict[str, int] = {}
    names = sorted(pools, key=len, reverse=True)
    for ln in lines:
        m = POOL_EVICTED.search(ln)
        if m:
            pool = next((p for p in names if m[1].startswith(p + " ")), "other")
            per_pool[pool] = per_pool.get(pool, 0) + 1
    return {"logged": len(lines), "model_store_lines": sum("model store: evicted" in ln for ln in lines),
            "budget_by_pool": per_pool, "first": lines[:10]}


def big_summary(results: list, plan: BigPlan, log_text: str, server: dict) -> dict:
    """The report's `big_imports` section: the imports, the clicks with the imported models
    (their latency apart from the other sessions' clicks), evictions seen and logged."""
    big = [r for r in results if isinstance(r, BigResult)]
    others = [x for r in results for x in r.latency.get("click", [])]
    size = {p.stat().st_size for p in plan.files.values()}
    return {
        "sessions": [r.index for r in big], "shape": plan.shape,
        "files": "one shared file" if plan.shared else "one file per session (seed = session index)",
        "file_mb": round(max(size) / 1e6, 1), "build_s": plan.build_s,
        "turn_answers": plan.turn,
        "turns": {str(r.index): {"import_started_s": r.import_at, "import_s": r.import_s, "confirmed": r.confirmed,
                                 "model_clicks": r.model_clicks, "image_switches": r.image_switches,
                                 "evictions_seen": r.evictions_seen} for r in big},
        "import_s": {str(r.index): r.import_s for r in big},
        "imports_confirmed": sum(r.confirmed for r in big),
        "model_clicks": sum(r.model_clicks for r in big), "image_switches": sum(r.image_switches for r in big),
        "clicks_sent_by_big_sessions": sum(r.clicks_sent for r in big),
        "clicks_answered_by_big_sessions": sum(r.clicks for r in big),
        "sessions_without_a_model_click": [r.index for r in big if not r.model_clicks],
        "evictions_seen_by_sessions": sum(r.evictions_seen for r in big),
        "latency_s": {"model_click": latency_stats([x for r in big for x in r.latency["big_click"]]),
                      "other_click": latency_stats(others),
                      "image_switch": latency_stats([x for r in big for x in r.latency["big_image"]])},
        "evictions_logged": evictions(log_text, server.get("pools", {})), **server,
    }
