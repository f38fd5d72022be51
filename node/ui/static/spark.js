// Sparklines drawn by the page itself as inline SVG (no library, no inline style): a series on a
// fixed time window, gaps left open, restarts marked on the time axis, a readout on hover.
const NS = "http://www.w3.org/2000/svg";
export const WIDTH = 180;
export const HEIGHT = 40;
const PAD = 3;
const GAP_POINTS = 3;
/* A run of this many missing points breaks the line (one missed sample does not). */

const plots = new WeakMap();
/* svg -> { values, t0, binS, format, key }: what the hover reads. */
const hover = { key: null, index: null };
/* The plot under the pointer (by key: a redrawn plot keeps its readout). */

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== null && value !== undefined) node.setAttribute(key, String(value));
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

export function fmt(value, unit = "") {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  let shown;
  if (abs >= 1000) shown = value.toFixed(0);
  else if (abs >= 100) shown = value.toFixed(1);
  else if (abs === 0) shown = "0";
  else shown = String(Number(value.toPrecision(3)));
  return unit ? `${shown} ${unit}` : shown;
}

export function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function range(series, fixed = {}) {
  /* The [low, high] of every value of `series` (arrays), `fixed.min`/`fixed.max` where given. */
  let low = Infinity, high = -Infinity;
  for (const values of series) {
    for (const v of values) if (v !== null && v !== undefined) { low = Math.min(low, v); high = Math.max(high, v); }
  }
  if (low === Infinity) { low = 0; high = 1; }
  if (fixed.min !== undefined) low = Math.min(low, fixed.min);
  if (fixed.max !== undefined && fixed.max !== null) high = Math.max(high, fixed.max);
  if (high - low < 1e-12) { high = low + (Math.abs(low) || 1) * 0.1; low -= (Math.abs(low) || 1) * 0.1; }
  return [low, high];
}

function xOf(index, count) {
  return (index / Math.max(1, count - 1)) * WIDTH;
}

export function pathOf(values, [low, high]) {
  /* The `d` of a line through `values` (null: no point), broken at GAP_POINTS missing points. */
  const y = (v) => (HEIGHT - PAD - ((v - low) / (high - low)) * (HEIGHT - 2 * PAD)).toFixed(1);
  let d = "", missing = GAP_POINTS;
  values.forEach((v, i) => {
    if (v === null || v === undefined) { missing += 1; return; }
    d += `${missing >= GAP_POINTS ? "M" : "L"}${xOf(i, values.length).toFixed(1)},${y(v)}`;
    missing = 0;
  });
  return d;
}

export function timeX(t, t0, binS, count) {
  return ((t - t0) / (binS * Math.max(1, count - 1))) * WIDTH;
}

function markX(t, t0, binS, count) {
  /* A restart's x: the newest point stands for its whole bin, and the window is sent once a
     bin, so a restart up to two bins newer than the newest point is drawn at the right edge
     (the page shows it as soon as it learns of it); null outside the window. */
  const x = timeX(t, t0, binS, count);
  if (x < 0 || x > WIDTH + 2 * timeX(t0 + binS, t0, binS, count)) return null;
  return Math.min(x, WIDTH);
}

function restartMarks(restarts, t0, binS, count) {
  return restarts.map((r) => {
    const x = markX(r.at, t0, binS, count);
    if (x === null) return null;
    return svg("line", { class: "restart", x1: x.toFixed(1), x2: x.toFixed(1), y1: 0, y2: HEIGHT, "data-reason": r.reason },
      svg("title", {}, document.createTextNode(`restart: ${r.reason} (generation ${r.generation}) at ${clock(r.at)}`)));
  });
}

export function sparkline({ key, label, lines, t0, binS, fixed = {}, restarts = [], format = fmt }) {
  /* One plot of `lines` ([{ values, cls }], the first is the one the hover reads) over the
     window from `t0`; shared y-range when `fixed.min`/`fixed.max` say so. */
  const count = lines[0].values.length;
  const scale = range(lines.map((l) => l.values), fixed);
  const first = lines[0].values;
  const now = [...first].reverse().find((v) => v !== null && v !== undefined);
  const plot = svg("svg", {
    class: "plot", width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img",
    "aria-label": `${label}: last ${Math.round((count * binS) / 60)} minutes, now ${format(now ?? null)}, from ${format(scale[0])} to ${format(scale[1])}`,
    "data-points": first.filter((v) => v !== null && v !== undefined).length, "data-key": key,
  });
  plot.append(...restartMarks(restarts, t0, binS, count).filter(Boolean));
  for (const line of lines) plot.append(svg("path", { class: `line ${line.cls || ""}`.trim(), d: pathOf(line.values, scale) }));
  plot.append(svg("g", { class: "hover" }, svg("line", { x1: -9, x2: -9, y1: 0, y2: HEIGHT }), svg("circle", { cx: -9, cy: -9, r: 2.5 })));
  plots.set(plot, { key, values: first, t0, binS, scale, format });
  return plot;
}

export function restoreHover() {
  /* After a redraw: the readout of the plot under the pointer again. */
  if (hover.key === null) return;
  const plot = document.querySelector(`svg.plot[data-key="${CSS.escape(hover.key)}"]`);
  if (plot && plots.has(plot)) showAt(plot, Math.min(hover.index, plots.get(plot).values.length - 1));
}

function showAt(plot, index) {
  const info = plots.get(plot);
  const [mark, dot] = plot.querySelector("g.hover").children;
  const x = xOf(index, info.values.length).toFixed(1);
  mark.setAttribute("x1", x); mark.setAttribute("x2", x);
  const v = info.values[index];
  const [low, high] = info.scale;
  dot.setAttribute("cx", x);
  dot.setAttribute("cy", v === null || v === undefined ? -9 : (HEIGHT - PAD - ((v - low) / (high - low)) * (HEIGHT - 2 * PAD)).toFixed(1));
  const readout = plot.closest("figure")?.querySelector(".at");
  if (readout) readout.textContent = `${clock(info.t0 + index * info.binS)}: ${info.format(v ?? null)}`;
}

function hideFrom(plot) {
  const [mark, dot] = plot.querySelector("g.hover").children;
  mark.setAttribute("x1", -9); mark.setAttribute("x2", -9); dot.setAttribute("cy", -9);
  const readout = plot.closest("figure")?.querySelector(".at");
  if (readout) readout.textContent = "";
}

export function followHover(container) {
  /* One listener for every plot under `container`: the value under the pointer, in the
     figure's readout, kept across redraws. */
  let shown = null;
  container.addEventListener("pointermove", (event) => {
    const plot = event.target.closest && event.target.closest("svg.plot");
    if (shown && shown !== plot) { hideFrom(shown); shown = null; hover.key = null; }
    if (!plot || !plots.has(plot)) return;
    const info = plots.get(plot);
    const box = plot.getBoundingClientRect();
    const index = Math.round(((event.clientX - box.left) / box.width) * (info.values.length - 1));
    hover.key = info.key; hover.index = Math.max(0, Math.min(info.values.length - 1, index));
    showAt(plot, hover.index);
    shown = plot;
  });
  container.addEventListener("pointerleave", () => { if (shown) hideFrom(shown); shown = null; hover.key = null; });
}

export function timeAxis(t0, binS, count, restarts) {
  /* The window's time axis: ticks every 5 minutes, each restart marked with its reason. */
  const height = 34;
  const axis = svg("svg", { class: "axis", width: WIDTH, height, viewBox: `0 0 ${WIDTH} ${height}`, role: "img",
    "aria-label": `time axis from ${clock(t0)} to ${clock(t0 + (count - 1) * binS)}, ${restarts.length} restarts` });
  for (let minutes = 0; minutes * 60 <= (count - 1) * binS + 1e-6; minutes += 5) {
    const x = WIDTH - timeX(t0 + minutes * 60, t0, binS, count);
    axis.append(svg("line", { class: "tick", x1: x.toFixed(1), x2: x.toFixed(1), y1: 0, y2: 5 }),
      svg("text", { x: Math.min(WIDTH - 2, Math.max(2, x)).toFixed(1), y: 15, "text-anchor": minutes === 0 ? "end" : (x < 10 ? "start" : "middle") },
        document.createTextNode(minutes === 0 ? "now" : `−${minutes} min`)));
  }
  for (const r of restarts) {
    const x = markX(r.at, t0, binS, count);
    if (x === null) continue;
    axis.append(svg("line", { class: "restart", x1: x.toFixed(1), x2: x.toFixed(1), y1: 0, y2: 20 }),
      svg("text", { class: "reason", x: x.toFixed(1), y: 30, "text-anchor": x > WIDTH / 2 ? "end" : "start" }, document.createTextNode(r.reason)));
  }
  return axis;
}
