"""The README's screenshots of the app, taken in headless chromium (re-run after retraining):

    python scripts/screenshots.py                    # checkpoints/ -> docs/screenshot_{bias,similarity,compare}.png
    python scripts/screenshots.py --checkpoints DIR --out docs
    python scripts/screenshots.py --own FOLDER/vit_tiny.safetensors   # -> docs/screenshot_own_model.png
    python scripts/screenshots.py --own FOLDER/swin.safetensors --name swin --layer 1   # -> docs/screenshot_swin.png
    python scripts/screenshots.py --random-swin --layer 1             # -> docs/screenshot_swin.png
    python scripts/screenshots.py --resolution                        # -> docs/screenshot_resolution.png
    python scripts/screenshots.py --resolution --own FOLDER/vit_tiny.safetensors --name resolution_own

* docs/screenshot_bias.png: the bias explorer on a photo with a clicked patch (`sape2+ape` if
  the folder has it, else its first checkpoint), the bias row over the image and the full
  model's attention row.
* docs/screenshot_similarity.png: the similarity page for `ape` (else the first checkpoint
  with a position table) with the ViT paper's Figure-7 grid.
* docs/screenshot_compare.png: the compare page, every checkpoint on one photo and query patch.
* docs/screenshot_own_model.png (`--own`): the bias explorer on an imported pretrained ViT
  (`python -m vitpe_core import`), at its own resolution and grid, on the astronaut photo.
  `--name NAME` writes docs/screenshot_NAME.png instead; `--layer L` shows block/layer L.
* docs/screenshot_resolution.png (`--resolution`): the compare page's resolution explorer swept
  for `ape` (else the first checkpoint; `--own`: the imported model) at its default sizes: the
  chart of what each size keeps, the attention distance by depth, the table (that section only).
* `--random-swin`: a Swin-V2 of swinv2-tiny's shape (transformers' `Swinv2Config()` defaults: 224
  px, 4-px patches, 7x7 windows) with transformers' random initial weights, saved with
  `save_pretrained` and imported: the Swin window view's layout (window grid, shift, the clicked
  patch's window) where no pretrained Swin can be downloaded; its bias is the untrained CPB MLP's,
  not a learned one. With a network, import `microsoft/swinv2-tiny-patch4-window8-256` and pass it
  to `--own` instead.

1400 px wide, whole page (Streamlit scrolls inside its main block: the viewport is grown to
the content), quantised to a 256-colour palette when that keeps a PNG under 400 KB. If the
folder holds no checkpoint, tiny random-weight ones are used (their maps are noise: re-run
once the trained checkpoints exist). Needs Debian's chromium and python playwright.
"""
from __future__ import annotations

import argparse
import functools
import io
import shutil
import sys
import tempfile
from pathlib import Path

from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # the repository root, for `benchmarks`
from benchmarks import harness  # noqa: E402  (the server, browser and page helpers)

REPO = harness.REPO
WIDTH = 1400
MAX_BYTES = 400 * 1024
TIMEOUT_MS = 120_000


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def save_small(png: Path, max_bytes: int = MAX_BYTES) -> int:
    """Re-encode `png` optimised, as a 256-colour palette if the RGB file is over `max_bytes`."""
    img = Image.open(png).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, "PNG", optimize=True)
    if buf.tell() > max_bytes:
        buf = io.BytesIO()
        palette = img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        palette.save(buf, "PNG", optimize=True)
    png.write_bytes(buf.getvalue())
    return buf.tell()


PICKER_KEY = {"bias": "bias_click", "similarity": "similarity_click", "compare": "compare_click"}


def page_name(page) -> str:
    return harness.url_params(page.url).get("page", "bias")


def click(page, patch: tuple[int, int], grid: tuple[int, int]) -> None:
    """Click `patch` on the bias explorer's patch picker (a Plotly chart: its plot area spans the image)."""
    area = harness.picker_area(page, "bias_click")
    area.click(position=harness.click_point(area.bounding_box(), patch, grid))


def wait_ready(page, patch: tuple[int, int]) -> None:
    page.get_by_text(harness.patch_label(patch), exact=True).wait_for(timeout=TIMEOUT_MS)
    harness.picker_area(page, PICKER_KEY[page_name(page)]).wait_for(timeout=TIMEOUT_MS)
    harness.wait_script_run(page, TIMEOUT_MS / 1000)
    page.wait_for_timeout(1500)                                          # plotly finishes drawing


def shoot_bias(page, base: str, ckpt: str, grid: tuple[int, int], out: Path) -> None:
    H, W = grid
    page.goto(harness.share_url(base, ckpt=ckpt, image="photo-chelsea", patch=(H // 2, W // 2), layer=0, head="mean"))
    wait_ready(page, (H // 2, W // 2))
    target = (max(0, H // 2 - 2), min(W - 1, W // 2 + 1))               # click a patch off the centre
    click(page, target, grid)
    wait_ready(page, target)
    harness.full_page_screenshot(page, out)


def shoot_similarity(page, base: str, ckpt: str, grid: tuple[int, int], out: Path) -> None:
    H, W = grid
    patch = (H // 2 - 1, W // 2 - 2)
    page.goto(harness.share_url(base, page="similarity", ckpt=ckpt, patch=patch))
    wait_ready(page, patch)
    harness.full_page_screenshot(page, out)


def shoot_compare(page, base: str, ckpt: str, grid: tuple[int, int], out: Path) -> None:
    H, W = grid
    patch = (max(0, H // 2 - 2), min(W - 1, W // 2 + 1))
    page.goto(harness.share_url(base, page="compare", ckpt=ckpt, image="photo-chelsea", patch=patch, layer=0,
                                head="mean"))
    wait_ready(page, patch)
    harness.full_page_screenshot(page, out)


def shoot_own(page, base: str, ckpt: str, grid: tuple[int, int], out: Path, layer: int = 0) -> None:
    H, W = grid
    page.goto(harness.share_url(base, ckpt=ckpt, image="photo-astronaut", patch=(H // 2, W // 2), layer=layer,
                                head="mean"))
    wait_ready(page, (H // 2, W // 2))
    target = (round(3 * H / 14), round(5 * W / 14))                      # the astronaut's face
    click(page, target, grid)
    wait_ready(page, target)
    harness.full_page_screenshot(page, out)


def shoot_resolution(page, base: str, ckpt: str, grid: tuple[int, int], out: Path) -> None:
    """The compare page showing `ckpt` alone, its resolution explorer swept at the default sizes:
    the section from its heading to its CSV button."""
    page.goto(harness.share_url(base, page="compare", ckpt=ckpt, image="photo-chelsea", layer=0, head="mean"))
    harness.wait_script_run(page, TIMEOUT_MS / 1000)
    sidebar = page.locator("[data-testid='stSidebar']")
    picks = sidebar.locator("[data-testid='stMultiSelect']").first
    for _ in range(40):                                       # show `ckpt` only: the sweep's model list is the shown
        tags = picks.locator("[data-baseweb='tag']")
        others = [t for t in tags.all() if ckpt not in t.inner_text()]
        if not others:
            break
        others[0].locator("[role='presentation'], svg").last.click()
        harness.wait_script_run(page, TIMEOUT_MS / 1000)
    page.get_by_role("button", name="Sweep these sizes").click()
    page.locator(".st-key-compare_res_chart .js-plotly-plot").wait_for(timeout=30 * TIMEOUT_MS)
    harness.wait_script_run(page, 30 * TIMEOUT_MS / 1000)
    page.wait_for_timeout(1500)                                          # plotly finishes drawing
    page.set_viewport_size({"width": WIDTH, "height": 6000})
    page.wait_for_timeout(1500)
    top = page.get_by_text("At other input sizes", exact=False).first.bounding_box()
    bottom = page.locator(".st-key-compare_res_csv").bounding_box()
    y0, y1 = top["y"] - 10, bottom["y"] + bottom["height"] + 10
    page.screenshot(path=str(out), clip={"x": 0, "y": y0, "width": WIDTH, "height": y1 - y0}, full_page=True)
    page.set_viewport_size({"width": WIDTH, "height": 1000})


def random_swin(tmp: Path) -> Path:
    """`transformers.Swinv2ForImageClassification(Swinv2Config())` (random weights, seed 0), saved
    and imported with the CLI; the checkpoint's path."""
    import torch
    import transformers

    from vitpe_core.__main__ import main as cli
    torch.manual_seed(0)
    transformers.Swinv2ForImageClassification(transformers.Swinv2Config()).save_pretrained(tmp / "swinv2_src")
    out = tmp / "swinv2_random_tiny.safetensors"
    assert cli(["import", str(tmp / "swinv2_src" / "model.safetensors"), "--out", str(out),
                "--licence", "random weights (transformers Swinv2Config defaults)"]) == 0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", default="checkpoints", help="checkpoint folder (relative to the repository)")
    ap.add_argument("--own", help="an imported checkpoint (python -m vitpe_core import): shoot only its bias explorer")
    ap.add_argument("--name", default="own_model", help="with --own: writes docs/screenshot_NAME.png")
    ap.add_argument("--layer", type=int, default=0, help="with --own / --random-swin: the layer (Swin: block) shown")
    ap.add_argument("--random-swin", action="store_true", help="shoot a random-weight Swin-V2 of swinv2-tiny's shape "
                                                                   "(the window view's layout; needs transformers)")
    ap.add_argument("--resolution", action="store_true", help="shoot the compare page's resolution explorer only "
                    "(of `ape`, or of --own)")
    ap.add_argument("--out", default=str(REPO / "docs"))
    ap.add_argument("--port", type=int, default=None)
    args = ap.parse_args(argv)
    if shutil.which("chromium") is None:
        ap.error("Debian's chromium is needed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from vitpe_core.checkpoint import list_checkpoints
    from vitpe_core.viewstate import PREFERRED_CKPT

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vitpe-shots-") as tmp:
        folder = Path(args.checkpoints)
        if args.random_swin:
            args.own, args.name = str(random_swin(Path(tmp))), "swin"
        if args.own:
            own = Path(args.own).resolve()
            folder = Path(tmp) / "own"
            folder.mkdir()
            for suffix in (".safetensors", ".json"):
                if own.with_suffix(suffix).exists():
                    shutil.copy(own.with_suffix(suffix), folder / own.with_suffix(suffix).name)
        names = list_checkpoints(REPO / folder) if (REPO / folder).is_dir() else []
        if not names:
            print(f"no checkpoints in {folder}: using tiny random-weight ones (re-run after training)", file=sys.stderr)
            folder = harness.write_random_checkpoints(Path(tmp) / "checkpoints")
            names = list_checkpoints(folder)
        grids = harness.checkpoint_grids(REPO / folder)
        table = [n for n in ("ape", "sape2+ape", "ape2d", "sincos2d") if n in names] or names
        bias_ckpt = PREFERRED_CKPT if PREFERRED_CKPT in names else names[0]
        port = args.port or (8501 if port_free(8501) else None)             # the link as `streamlit run` shows it
        with harness.streamlit_server(folder, port=port) as server, sync_playwright() as p:
            base = server.url.replace("127.0.0.1", "localhost")            # the link the sidebar shows
            browser = harness.launch_chromium(p)
            page = browser.new_page(viewport={"width": WIDTH, "height": 1000})
            shots = {"screenshot_bias.png": (shoot_bias, bias_ckpt),
                     "screenshot_similarity.png": (shoot_similarity, table[0]),
                     "screenshot_compare.png": (shoot_compare, bias_ckpt)}
            if args.own:
                shots = {f"screenshot_{args.name}.png": (functools.partial(shoot_own, layer=args.layer), names[0])}
            if args.resolution:
                ckpt = names[0] if args.own else table[0]
                shots = {f"screenshot_{args.name if args.own else 'resolution'}.png": (shoot_resolution, ckpt)}
            for name, (shoot, ckpt) in shots.items():
                shoot(page, base, ckpt, grids[ckpt], out / name)
                size = save_small(out / name)
                w, h = Image.open(out / name).size
                print(f"{out / name}: {ckpt}, {w}x{h}, {size / 1024:.0f} KB")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
