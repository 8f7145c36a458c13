// The vitpe report's own script: inflate the embedded Plotly, draw every chart, and run the
// offline bias explorer (a click on any map picks a patch; its rows are read from the
// embedded float16 arrays, packed by vitpe_core/html_report/encode.py: float16 little-endian,
// all low bytes then all high bytes, gzip, base64). No network is used.
"use strict";

const status = (text) => { document.getElementById("status").textContent = text; };

async function inflate(b64) {
  const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

async function loadPlotly() {
  const code = new TextDecoder().decode(await inflate(document.getElementById("plotly-gz").textContent));
  const script = document.createElement("script");
  script.textContent = code;
  document.head.appendChild(script);       // runs at once: window.Plotly
}

// ---------------------------------------------------------------------------- float16 arrays
const F16 = (() => {                          // every float16 bit pattern -> its value
  const out = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    out[h] = e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
  }
  return out;
})();

const TYPED = {i1: Int8Array, u1: Uint8Array, i2: Int16Array, u2: Uint16Array, i4: Int32Array, u4: Uint32Array,
               f2: Uint16Array};

// a packed array (encode.pack / pack_ints) -> {shape, values}: float16 as a Float32Array
async function unpack(packed) {
  const d = await inflate(packed.gz), Typed = TYPED[packed.dtype], size = Typed.BYTES_PER_ELEMENT;
  const n = d.length / size, bytes = new Uint8Array(d.length);
  for (let k = 0; k < size; k++) for (let i = 0; i < n; i++) bytes[i * size + k] = d[k * n + i];
  const raw = new Typed(bytes.buffer);
  return {shape: packed.shape, values: packed.dtype === "f2" ? Float32Array.from(raw, (h) => F16[h]) : raw};
}

function nested(values, shape, offset = 0) {   // flat values of `shape` -> nested plain arrays
  if (shape.length <= 1) return Array.from(values.subarray(offset, offset + (shape[0] ?? values.length)));
  const step = shape.slice(1).reduce((a, b) => a * b, 1), out = [];
  for (let i = 0; i < shape[0]; i++) out.push(nested(values, shape.slice(1), offset + i * step));
  return out;
}

// a figure spec with its packed arrays (encode.compact_figure) turned back into nested arrays
async function revive(node) {
  if (Array.isArray(node)) return Promise.all(node.map(revive));
  if (node === null || typeof node !== "object") return node;
  if (node.vitpe_packed) {
    const a = await unpack(node.vitpe_packed);
    return nested(a.values, a.shape);
  }
  const out = {};
  for (const [k, v] of Object.entries(node)) out[k] = await revive(v);
  return out;
}

// ---------------------------------------------------------------------------- static charts
function lookup(data, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), data);
}

function draw(el, spec) {
  return Plotly.newPlot(el, {data: spec.data, layout: spec.layout, frames: spec.frames || [], config: spec.config});
}

// ---------------------------------------------------------------------------- the explorer
function mapOf(values, H, W) {             // flat (H*W) -> rows for Plotly's z
  const z = [];
  for (let r = 0; r < H; r++) z.push(Array.from(values.subarray(r * W, (r + 1) * W)));
  return z;
}

function normalize01(v) {
  let lo = Infinity, hi = -Infinity;
  for (const x of v) { lo = Math.min(lo, x); hi = Math.max(hi, x); }
  const span = hi > lo ? hi - lo : 1;
  return v.map((x) => (x - lo) / span);
}

class Explorer {
  constructor(ex, blobs) {
    this.ex = ex;
    this.blobs = blobs;
    [this.H, this.W] = ex.grid;
    this.N = this.H * this.W;
    this.state = {image: 0, patch: ex.patch.slice(), layer: 0, head: "mean", fusion: "mean", source: "patch",
                  part: Object.keys(ex.parts)[0] || null};
    this.el = (id) => document.getElementById(id);
  }

  // the (N) row of `component` at the current layer and query, for one head or the mean of heads
  row(component, head) {
    const im = this.ex.images[this.state.image], b = this.blobs[im.components[component][this.state.layer]];
    const k = b.shape[0], i = this.state.patch[0] * this.W + this.state.patch[1], out = new Float32Array(this.N);
    const heads = head === "mean" ? [...Array(k).keys()] : [Number(head)];
    for (const j of heads) {
      const base = (j * this.N + i) * this.N;
      for (let n = 0; n < this.N; n++) out[n] += b.values[base + n];
    }
    if (heads.length > 1) for (let n = 0; n < this.N; n++) out[n] /= heads.length;
    return out;
  }

  biasRow() {
    const comps = this.ex.part_components[this.state.part], out = new Float32Array(this.N);
    for (const c of comps) this.row(c, this.state.head).forEach((x, n) => { out[n] += x; });
    return normalize01(out);
  }

  rolloutRow() {
    const im = this.ex.images[this.state.image], b = this.blobs[im.rollout[this.state.fusion]];
    const P = this.ex.num_prefix, T = b.shape[0], src = this.ex.rollout_sources.indexOf(this.state.source);
    const token = this.state.source === "patch" ? P + this.state.patch[0] * this.W + this.state.patch[1] : src - 1;
    const row = b.values.subarray(token * T, (token + 1) * T);
    return {map: row.subarray(P), prefix: row.subarray(0, P).reduce((a, x) => a + x, 0)};
  }

  prefixShare() {
    const im = this.ex.images[this.state.image], b = this.blobs[im.prefix_share];
    const [L, h, N] = b.shape, i = this.state.patch[0] * this.W + this.state.patch[1];
    const heads = this.state.head === "mean" ? [...Array(h).keys()] : [Number(this.state.head)];
    return heads.reduce((a, j) => a + b.values[(this.state.layer * h + j) * N + i], 0) / heads.length;
  }

  headOptions() {
    const sel = this.el("sel-head"), k = this.ex.heads_layers.includes(this.state.layer) ? this.ex.heads : 0;
    const values = ["mean", ...[...Array(k).keys()].map(String)];
    if (!values.includes(this.state.head)) this.state.head = "mean";
    sel.innerHTML = "";
    for (const v of values) sel.add(new Option(v === "mean" ? "mean over heads" : `head ${v}`, v));
    sel.value = this.state.head;
  }

  async restyle(key, values, title, extraShapes) {
    const gd = document.querySelector(`[data-fig="explorer.figures.${key}"]`);
    if (!gd || !gd.data) return;
    const im = this.ex.images[this.state.image], [r, c] = this.state.patch;
    const [w, h] = im.size, pw = w / this.W, ph = h / this.H;
    const heat = gd.data.findIndex((t) => t.type === "heatmap"), pic = gd.data.findIndex((t) => t.type === "image");
    const shapes = (gd.layout.shapes || []).slice(0, -1);
    const outline = {...gd.layout.shapes[gd.layout.shapes.length - 1], x0: c * pw, y0: r * ph, x1: (c + 1) * pw,
                     y1: (r + 1) * ph, visible: extraShapes !== false};
    await Plotly.restyle(gd, {z: [mapOf(values, this.H, this.W)]}, [heat]);
    if (pic >= 0 && gd.data[pic].source !== im.image) await Plotly.restyle(gd, {source: [im.image]}, [pic]);
    await Plotly.relayout(gd, {"title.text": title, shapes: [...shapes, outline]});
  }

  async update() {
    const s = this.state, [r, c] = s.patch, head = s.head === "mean" ? "mean over heads" : `head ${s.head}`;
    const im = this.ex.images[s.image], where = `layer ${s.layer}, ${head}`;
    this.el("patch-text").textContent = `Patch (${r}, ${c})`;
    this.el("prediction").textContent = "Prediction: " + im.top5.map(([n, p]) => `${n} ${(100 * p).toFixed(1)} %`)
      .join(" · ");
    if (s.part) {
      const part = this.ex.parts[s.part];
      this.el("bias-title").textContent = part.short;
      this.el("bias-caption").textContent = part.caption;
      await this.restyle("bias", this.biasRow(), where);
    }
    const share = this.ex.num_prefix ? ` (attention to the prefix tokens: ${(100 * this.prefixShare()).toFixed(0)} %)`
      : "";
    this.el("attn-caption").textContent = `Softmax weights from the query patch (${r}, ${c}) to every patch; the ` +
      `prefix tokens are left out of the map${share}.`;
    await this.restyle("attn", this.row("attn", s.head), where);
    const roll = this.rolloutRow(), what = s.source === "patch" ? `patch (${r}, ${c})` : s.source;
    this.el("rollout-caption").textContent = `How much of ${what}'s output comes from each input patch, through ` +
      `all ${this.ex.depth} layers` + (this.ex.num_prefix ? `; ${(100 * roll.prefix).toFixed(1)} % comes from ` +
      "the prefix tokens, not drawn." : ".");
    await this.restyle("rollout", roll.map, `heads fused by ${s.fusion}`, s.source === "patch");
    document.body.dataset.patch = `${r},${c}`;
  }

  bind() {
    const on = (id, key, parse = (v) => v) => {
      const sel = this.el(id);
      if (!sel) return;
      sel.addEventListener("change", () => {
        this.state[key] = parse(sel.value);
        if (key === "layer") this.headOptions();
        this.update();
      });
    };
    on("sel-image", "image", Number);
    on("sel-layer", "layer", Number);
    on("sel-head", "head");
    on("sel-part", "part");
    on("sel-source", "source");
    on("sel-fusion", "fusion");
    for (const gd of document.querySelectorAll('[data-fig^="explorer.figures."]')) {
      gd.on("plotly_click", (ev) => {
        const p = (ev.points || []).find((q) => q.data.type === "heatmap");
        if (!p) return;
        const rc = Array.isArray(p.customdata) ? p.customdata : p.pointNumber;
        this.state.patch = [Number(rc[0]), Number(rc[1])];
        this.update();
      });
    }
    this.headOptions();
  }
}

async function main() {
  if (typeof DecompressionStream === "undefined") {
    status("This browser cannot unpack the embedded charts (it lacks DecompressionStream: use Chrome or Edge 80+, " +
           "Firefox 113+ or Safari 16.4+).");
    return;
  }
  await loadPlotly();
  const data = JSON.parse(document.getElementById("report-data").textContent);
  for (const el of document.querySelectorAll("[data-fig]")) {
    const spec = lookup(data, el.dataset.fig);
    if (spec) await draw(el, await revive(spec));
  }
  const ex = data.explorer, blobs = await Promise.all(ex.blobs.map(unpack));
  const explorer = new Explorer(ex, blobs);
  window.vitpeExplorer = explorer;          // for a look from the browser's console
  explorer.bind();
  await explorer.update();
  status("Ready: click a patch in the bias explorer.");
  document.body.dataset.ready = "1";
}

main().catch((err) => { status(`The report could not be drawn: ${err}`); document.body.dataset.ready = "error"; });
