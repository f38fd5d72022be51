// The training page: the group's last 15 minutes as small multiples, one sparkline per rank and
// series (steps/s, compute seconds, every scalar) and per GPU (utilization, memory), each with
// its value now; stragglers and a hung group marked, restarts on the time axis.
import { badge, card, el, table, text } from "./dom.js";
import { clock, fmt, followHover, range, restoreHover, sparkline, timeAxis } from "./spark.js";

const COLLAPSE_AT = 16;
/* More ranks (or GPUs) than this: each node's are folded into one plot of all its lines. */
const opened = new Set();
/* The folded groups a person opened (series|node), kept across redraws. */
let cache = new Map();
let drawn = new Map();
/* key -> { stamp, plot }: a plot is drawn again only when its points or marks change (the
   plots of the last draw are kept, no others). */
let hovering = false;

export function mergeWindow(held, next) {
  /* A window topic's update: the whole window, or its newest points merged into `held`. */
  const version = ((held && held.version) || 0) + 1;
  if (!next.tail || !held || held.bin_s !== next.bin_s) return { ...next, version };
  const shift = Math.round((next.t0 + next.bins * next.bin_s - (held.t0 + held.bins * held.bin_s)) / held.bin_s);
  if (shift < 0) return held;
  const merged = { ...held, t0: held.t0 + shift * held.bin_s, version };
  const fold = (old, fresh) => {
    if (Array.isArray(fresh) && !fresh.some((v) => v !== null && typeof v === "object")) {
      const kept = (old || []).slice(Math.max(0, shift));
      while (kept.length < held.bins) kept.push(null);
      kept.splice(held.bins - fresh.length, fresh.length, ...fresh);
      return kept.slice(-held.bins);
    }
    if (Array.isArray(fresh)) return fresh.map((item, i) => fold((old || [])[i], item));
    if (fresh && typeof fresh === "object") {
      const out = { ...(old || {}) };
      for (const [k, v] of Object.entries(fresh)) out[k] = fold((old || {})[k], v);
      return out;
    }
    return fresh;
  };
  merged.ranks = fold(held.ranks, next.ranks);
  merged.gpus = fold(held.gpus, next.gpus);
  return merged;
}

function cachedPlot(key, stamp, draw) {
  const found = cache.get(key);
  const plot = found && found.stamp === stamp ? found.plot : draw();
  drawn.set(key, { stamp, plot });
  return plot;
}

function seriesOf(history, now) {
  /* Every series the page plots per rank: steps/s, compute seconds, then each scalar. */
  const names = new Set();
  for (const rank of Object.values(history.ranks || {})) for (const n of Object.keys(rank.scalars || {})) names.add(n);
  for (const rank of now.ranks || []) for (const n of Object.keys(rank.scalars || {})) names.add(n);
  return [
    { id: "steps_per_s", label: "steps/s", values: (h) => h.steps_per_s, now: (r) => r.steps_per_s, min: 0 },
    { id: "compute_s", label: "compute s", values: (h) => h.compute_s, now: (r) => r.compute_s, min: 0 },
    ...[...names].sort().map((n) => ({ id: `scalar:${n}`, label: n, values: (h) => (h.scalars || {})[n], now: (r) => (r.scalars || {})[n] })),
  ];
}

function rankFigure(ctx, series, rank, row) {
  const values = (ctx.history.ranks[rank] && series.values(ctx.history.ranks[rank])) || ctx.empty;
  const straggler = Boolean(row && row.straggler);
  const hung = ctx.now.hung && series.id === "steps_per_s";
  const key = `${series.id}|${rank}`;
  const stamp = `${ctx.stamp}|${straggler}|${hung}|${ctx.scale[series.id]}`;
  const label = `${series.label} of rank ${rank}${row ? ` on ${row.node}` : ""}`;
  const plot = cachedPlot(key, stamp, () => sparkline({
    key, label, lines: [{ values, cls: straggler || hung ? "bad" : "" }], t0: ctx.history.t0, binS: ctx.history.bin_s,
    fixed: { min: ctx.scale[series.id][0], max: ctx.scale[series.id][1] }, restarts: ctx.restarts,
  }));
  const nowValue = row ? series.now(row) : null;
  return el("figure", { class: `spark-fig${straggler ? " straggler" : ""}`, "data-rank": rank, "data-series": series.id, "data-straggler": String(straggler) },
    el("figcaption", {}, el("span", { class: "who" }, `rank ${rank}`), " ",
      el("span", { class: "now" }, fmt(nowValue ?? null)),
      straggler ? el("span", { class: "flag" }, "straggler") : null,
      el("span", { class: "at", "aria-live": "off" })),
    plot);
}

function nodeGroup(ctx, series, node, ranks) {
  /* A node's ranks folded: one plot of all their lines (a straggler's in red), open on demand. */
  const id = `${series.id}|${node}`;
  const rows = ranks.map((r) => ctx.rows.get(r));
  const slow = ranks.filter((r) => (ctx.rows.get(r) || {}).straggler);
  const lines = ranks.map((r) => ({ values: (ctx.history.ranks[r] && series.values(ctx.history.ranks[r])) || ctx.empty, cls: ctx.rows.get(r)?.straggler ? "bad" : "thin" }));
  const plot = cachedPlot(`fold|${id}`, `${ctx.stamp}|${slow.join(",")}|${ctx.scale[series.id]}`, () => sparkline({
    key: `fold|${id}`, label: `${series.label} of the ${ranks.length} ranks on ${node}`, lines,
    t0: ctx.history.t0, binS: ctx.history.bin_s, fixed: { min: ctx.scale[series.id][0], max: ctx.scale[series.id][1] }, restarts: ctx.restarts,
  }));
  const nows = rows.map((r) => (r ? series.now(r) : null)).filter((v) => v !== null && v !== undefined);
  const details = el("details", { "data-node": node, "data-series": series.id, ...(opened.has(id) || slow.length ? { open: "" } : {}) },
    el("summary", {}, el("figure", { class: `spark-fig fold${slow.length ? " straggler" : ""}`, "data-straggler": String(slow.length > 0) },
      el("figcaption", {}, el("span", { class: "who" }, `${node}: ranks ${ranks[0]}–${ranks.at(-1)}`), " ",
        el("span", { class: "now" }, nows.length ? `${fmt(Math.min(...nows))} – ${fmt(Math.max(...nows))}` : "–"),
        slow.length ? el("span", { class: "flag" }, `straggler: rank ${slow.join(", ")}`) : null,
        el("span", { class: "at" })),
      plot)),
    el("div", { class: "multiples" }, ranks.map((r) => rankFigure(ctx, series, r, ctx.rows.get(r)))));
  details.addEventListener("toggle", () => { if (details.open) opened.add(id); else opened.delete(id); });
  return details;
}

function seriesSection(ctx, series) {
  const ranks = ctx.ranks;
  let body;
  if (ranks.length <= COLLAPSE_AT) {
    body = el("div", { class: "multiples" }, ranks.map((r) => rankFigure(ctx, series, r, ctx.rows.get(r))));
  } else {
    body = [...ctx.byNode.entries()].map(([node, held]) => nodeGroup(ctx, series, node, held));
  }
  return el("section", { class: "series", "data-series": series.id, "aria-label": series.label }, el("h3", {}, series.label), body);
}

function gpuFigures(ctx, node, gpu) {
  const total = gpu.memory_total_mb;
  const used = gpu.memory_used_mb.filter((v) => v !== null).at(-1);
  const util = gpu.util_pct.filter((v) => v !== null).at(-1);
  const gib = (mb) => (mb === null || mb === undefined ? "–" : `${(mb / 1024).toFixed(1)} GiB`);
  const figure = (what, values, fixed, shown, format) => {
    const key = `gpu|${node}|${gpu.index}|${what}`;
    const plot = cachedPlot(key, ctx.stamp, () => sparkline({ key, label: `GPU ${gpu.index} of ${node} ${what}`,
      lines: [{ values }], t0: ctx.history.t0, binS: ctx.history.bin_s, fixed, restarts: ctx.restarts, format }));
    return el("figure", { class: "spark-fig", "data-node": node, "data-gpu": String(gpu.index), "data-series": what },
      el("figcaption", {}, el("span", { class: "who" }, `GPU ${gpu.index} ${what}`), " ", el("span", { class: "now" }, shown), el("span", { class: "at" })), plot);
  };
  return [
    figure("util", gpu.util_pct, { min: 0, max: 100 }, util === undefined ? "–" : `${fmt(util)} %`, (v) => fmt(v, "%")),
    figure("memory", gpu.memory_used_mb, { min: 0, max: total }, total ? `${gib(used)} of ${gib(total)}` : gib(used), gib),
  ];
}

function gpuSection(ctx) {
  const nodes = Object.entries(ctx.history.gpus || {}).filter(([, gpus]) => gpus.length);
  if (!nodes.length) return [el("h2", {}, "GPUs"), el("p", { class: "muted" }, "No training node owns a GPU.")];
  const count = nodes.reduce((n, [, gpus]) => n + gpus.length, 0);
  return [el("h2", {}, "GPUs"), ...nodes.map(([node, gpus]) => {
    const names = [...new Set(gpus.map((g) => g.name))].join(", ");
    const body = el("div", { class: "multiples" }, gpus.flatMap((g) => gpuFigures(ctx, node, g)));
    if (count <= COLLAPSE_AT) return el("section", { class: "series", "data-node": node, "aria-label": `GPUs of ${node}` }, el("h3", {}, `${node}: ${names}`), body);
    const id = `gpus|${node}`;
    const details = el("details", { "data-node": node, ...(opened.has(id) ? { open: "" } : {}) }, el("summary", {}, `${node}: ${gpus.length} × ${names}`), body);
    details.addEventListener("toggle", () => { if (details.open) opened.add(id); else opened.delete(id); });
    return details;
  })];
}

function context(now, history) {
  const rows = new Map((now.ranks || []).map((r) => [String(r.rank), r]));
  const ranks = [...new Set([...rows.keys(), ...Object.keys(history.ranks || {})])].sort((a, b) => a - b);
  const byNode = new Map();
  for (const r of ranks) {
    const node = rows.get(r) ? rows.get(r).node : "earlier generations";
    if (!byNode.has(node)) byNode.set(node, []);
    byNode.get(node).push(r);
  }
  const restarts = (now.restarts || []).filter((r) => r.at >= history.t0);
  const ctx = { now, history, rows, ranks, byNode, restarts, empty: new Array(history.bins).fill(null),
    stamp: `${history.t0}|${restarts.length}|${history.version}`, scale: {} };
  for (const series of seriesOf(history, now)) {
    const all = Object.values(history.ranks || {}).map((h) => series.values(h) || []);
    ctx.scale[series.id] = range(all, series.min === undefined ? {} : { min: series.min });
  }
  return ctx;
}

function banners(now) {
  const out = [];
  if (now.hung) {
    const stalled = Math.min(...(now.ranks || []).map((r) => r.last_advance_age_s));
    out.push(el("p", { class: "banner bad", role: "alert", id: "hung" },
      `The group is hung: no rank advanced for ${Number.isFinite(stalled) ? stalled : "–"} s (hang timeout ${fmt(now.hang_timeout_s)} s); it will be restarted.`));
  }
  for (const r of (now.ranks || []).filter((x) => x.straggler)) {
    out.push(el("p", { class: "banner", "data-straggler-rank": String(r.rank) },
      `Rank ${r.rank} on ${r.node}${r.gpu ? ` (GPU ${r.gpu})` : ""} straggles: compute ${fmt(r.compute_s)} s per step.`));
  }
  if ((now.missing || []).length) out.push(el("p", { class: "banner" }, `No answer in time from ${now.missing.join(", ")}: their ranks are missing.`));
  return out;
}

const MAX_SCALAR_COLUMNS = 3;
/* The ranks table shows this many scalars (loss first); the plots show every one. */

function scalarNames(now) {
  const names = new Set();
  for (const r of now.ranks || []) for (const n of Object.keys(r.scalars || {})) names.add(n);
  return [...names].sort((a, b) => (a === "loss" ? -1 : b === "loss" ? 1 : a.localeCompare(b))).slice(0, MAX_SCALAR_COLUMNS);
}

function nodesTable(now) {
  const rows = (now.nodes || []).map((n) => ({
    node: n.node,
    cells: [n.node, n.reachable ? text((n.ranks || []).length) : badge("missing"),
      n.step_min === undefined ? "–" : (n.step_min === n.step_max ? String(n.step_max) : `${n.step_min}–${n.step_max}`),
      fmt(n.steps_per_s ?? null), (n.stragglers || []).length ? `rank ${n.stragglers.join(", ")}` : "none"],
  }));
  if (!rows.length) return el("p", { class: "muted" }, "No training node in the plan.");
  return table("Every training node: its ranks, their steps and summed steps per second", ["Node", "Ranks", "Step", "Steps/s", "Stragglers"],
    rows, (row) => ({ "data-node": row.node }));
}

const shortGpu = (uuid) => (uuid.length > 16 ? `${uuid.slice(0, 12)}…${uuid.slice(-3)}` : uuid);

function ranksTable(now) {
  const names = scalarNames(now);
  const rows = (now.ranks || []).map((r) => ({
    rank: r,
    cells: [String(r.rank), r.node, r.gpu ? el("span", { title: r.gpu }, shortGpu(r.gpu)) : "–", el("span", { class: "num" }, String(r.step)), fmt(r.steps_per_s),
      fmt(r.compute_s), ...names.map((n) => fmt((r.scalars || {})[n] ?? null)), `${text(r.last_advance_age_s)} s`,
      r.straggler ? badge("straggler") : (now.hung ? badge("hung") : badge("advancing"))],
  }));
  if (!rows.length) return el("p", { class: "muted" }, "No rank reports.");
  return table("Every rank of the group now", ["Rank", "Node", "GPU", "Step", "Steps/s", "Compute s", ...names, "Advanced", "State"], rows,
    (row) => ({ "data-rank": String(row.rank.rank), "data-step": String(row.rank.step), "data-straggler": String(row.rank.straggler), class: row.rank.straggler ? "straggler" : null }));
}

function quarantineTable(now) {
  const rows = (now.quarantine || []).map((q) => ({ q, cells: [q.node, badge(q.state), text(q.reason), q.since ? clock(q.since) : "–", String(q.times)] }));
  if (!rows.length) return el("p", { class: "muted", id: "quarantine-none" }, "No node is quarantined for a GPU fault, and none was re-admitted in the last hour.");
  return table("GPU quarantine: nodes kept out of training for a GPU fault, and those re-admitted within the hour",
    ["Node", "State", "Reason", "Since", "Times (1 h)"], rows, (row) => ({ "data-quarantine": row.q.node, "data-state": row.q.state }));
}

export function renderTraining(data) {
  const now = data.training || {};
  const history = data.training_history;
  if (!history || now.generation === undefined) return [el("p", {}, "Loading the training group…")];
  const ctx = context(now, history);
  const stragglers = (now.ranks || []).filter((r) => r.straggler).map((r) => r.rank);
  const quarantined = (now.quarantine || []).filter((q) => q.state !== "readmitted").map((q) => q.node);
  const recent = ctx.restarts.slice().reverse().map((r) => ({ cells: [clock(r.at), text(r.generation), badge(r.reason), text(r.detail)] }));
  const page = [
    ...banners(now),
    el("div", { class: "cards" },
      card("Generation", text(now.generation)), card("Ranks", `${(now.ranks || []).length} of ${text(now.world_size)}`),
      card("State", now.hung ? badge("hung") : badge((now.ranks || []).length ? "advancing" : "idle"), "training-state"),
      card("Stragglers", stragglers.length ? `rank ${stragglers.join(", ")}` : "none", "stragglers"),
      card("Restarts (15 min)", String(ctx.restarts.length)), card("Coordinator", text(now.coordinator)),
      card("GPU quarantine", quarantined.length ? quarantined.join(", ") : "none", "quarantined")),
    el("h2", {}, "Nodes"), nodesTable(now),
    el("h2", {}, "Ranks"), ranksTable(now),
    el("h2", {}, "Last 15 minutes"),
    el("div", { class: "axis-row" }, timeAxis(history.t0, history.bin_s, history.bins, ctx.restarts),
      el("p", { class: "muted" }, "Each plot spans this window; a dashed line is a restart (hover it for its reason). Hover a plot for its value then.")),
    ...(ctx.ranks.length ? seriesOf(history, now).map((s) => seriesSection(ctx, s)) : [el("p", { class: "muted" }, "No rank has reported in the last 15 minutes.")]),
    ...gpuSection(ctx),
    el("h2", {}, "GPU quarantine"), quarantineTable(now),
    el("h2", {}, "Restarts"),
    recent.length ? table("Restarts of the group in the last 15 minutes, newest first", ["At", "Generation", "Reason", "Detail"], recent)
      : el("p", { class: "muted" }, "No restart in the last 15 minutes."),
  ];
  if (!hovering) { hovering = true; followHover(document.getElementById("main")); }
  cache = drawn; drawn = new Map();
  queueMicrotask(restoreHover);
  return page;
}
