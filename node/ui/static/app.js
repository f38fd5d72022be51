// shoal dashboard: one EventSource per page view, every value written with textContent.
const main = document.getElementById("main");
const live = document.getElementById("live");
const state = { data: {}, page: "", job: null, logs: { stdout: "", stderr: "" }, source: null };

const PAGES = {
  cluster: { topics: ["status", "members"], render: renderCluster },
  jobs: { topics: ["jobs"], render: renderJobs },
  job: { topics: ["jobs"], render: renderJob },
  runs: { topics: ["runs"], render: renderRuns },
  sync: { topics: ["sync", "history"], render: renderSync },
  rl: { topics: ["rl"], render: renderRl },
  node: { topics: ["node", "status", "history"], render: renderNode },
};

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const text = (value) => (value === null || value === undefined || value === "" ? "–" : String(value));
const badge = (value) => el("span", { class: `state state-${value}` }, text(value));

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function ago(epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  return s < 120 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

function table(caption, headers, rows, rowAttrs = () => ({})) {
  const head = el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)));
  const body = rows.map((row, i) => el("tr", rowAttrs(row, i), row.cells.map((c) => el("td", {}, c))));
  return el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption },
    el("table", {}, el("caption", { class: "muted" }, caption), el("thead", {}, head), el("tbody", {}, body)));
}

function card(label, value, id) {
  return el("div", { class: "card" }, el("span", { class: "k" }, label), el("span", { class: "v", id }, value));
}

function banners(status) {
  const out = [];
  for (const problem of status.health_problems || []) out.push(el("p", { class: "banner bad" }, problem));
  for (const note of status.notes || []) out.push(el("p", { class: "banner" }, note));
  return out;
}

function gpuCell(m) {
  if (!m.gpu_list) return m.gpus ? `${m.gpus} × ${text(m.gpu)}` : "none";
  if (!m.gpu_list.length) return "none";
  return el("ul", { class: "gpus" }, m.gpu_list.map((g) => el("li", { "data-gpu": String(g.index) },
    `${g.index}: ${text(g.name)} `, badge(g.healthy ? "healthy" : "degraded"),
    g.problems.length ? ` ${g.problems.join("; ")}` : "")));
}

function heardCell(m) {
  const heard = `${m.last_seen_s} s`;
  if (!m.stale) return heard;
  const since = m.status_at ? `, status from ${ago(m.status_at)}` : "";
  return el("span", {}, heard, " ", el("span", { class: "state state-stale", title: text(m.status_error) }, `stale${since}`));
}

function stateCell(m) {
  if (!m.refused) return badge(m.state);
  return el("span", { title: m.refused }, badge(m.state), " ", el("span", { class: "state state-dead" }, "refused"));
}

function drainCell(m) {
  if (!m.drain && !m.quarantine) return "–";
  const after = m.drain ? m.drain.kill_after_s : null;
  const quarantine = m.quarantine ? el("span", { "data-quarantine": m.quarantine }, badge("quarantined"), ` ${m.quarantine}`) : null;
  return el("span", {}, m.drain ? badge("draining") : null,
    after === null || after === undefined ? "" : ` (jobs killed after ${after} s)`, quarantine);
}

function renderCluster(data) {
  const status = data.status || {};
  const members = (data.members || {}).members || [];
  const plan = (data.members || {}).plan;
  const alive = members.filter((m) => m.state === "alive").length;
  const problems = members.filter((m) => !m.is_self && (m.health_problems || []).length)
    .flatMap((m) => m.health_problems.map((p) => el("p", { class: "banner bad" }, `${m.node_id}: ${p}`)));
  const rows = members.map((m) => ({
    node: m.node_id, state: m.state, stale: m.stale ? "yes" : "no", drain: m.drain ? "draining" : "no",
    cells: [m.node_id + (m.is_self ? " (this node)" : ""), stateCell(m), drainCell(m), text(m.role), text(m.rank),
      text(m.version), gpuCell(m), m.health ? badge(m.health) : "–", heardCell(m), m.address],
  }));
  const draining = members.filter((m) => m.drain).map((m) => m.node_id);
  return [
    ...banners(status),
    ...problems,
    el("div", { class: "cards" },
      card("Cluster", text(status.cluster)), card("Members alive", `${alive} of ${members.length}`, "alive-count"),
      card("Coordinator", text(status.coordinator)), card("Term", text(status.term)),
      card("Plan version", text(plan ? plan.version : status.plan_version)),
      card("Draining", draining.length ? draining.join(", ") : "none", "draining"),
      card("This node", text(status.node_id)), card("Health", badge(status.health))),
    el("h2", {}, "Members"),
    table("Every member of this node's view, with what its own status says", ["Node", "State", "Drain", "Role", "Rank", "Release", "GPUs", "Health", "Last heard", "Address"],
      rows, (row) => ({ "data-node": row.node, "data-state": row.state, "data-stale": row.stale, "data-drain": row.drain })),
  ];
}

function jobFilters() {
  const chosen = state.filters || { state: "", text: "" };
  const select = el("select", { id: "filter-state", name: "state" },
    ["", "pending", "running", "succeeded", "failed", "killed", "timed_out", "lost"].map((s) =>
      el("option", s === chosen.state ? { value: s, selected: "" } : { value: s }, s || "any")));
  const input = el("input", { id: "filter-text", name: "text", type: "search", value: chosen.text });
  const update = () => { state.filters = { state: select.value, text: input.value }; draw(); };
  select.addEventListener("change", update);
  input.addEventListener("input", update);
  return el("div", { class: "filters" },
    el("label", { for: "filter-state" }, "State", select), el("label", { for: "filter-text" }, "Name or command", input));
}

function renderJobs(data) {
  const jobs = (data.jobs || {}).jobs || [];
  const chosen = state.filters || { state: "", text: "" };
  const shown = jobs.filter((j) => (!chosen.state || j.state === chosen.state) &&
    (!chosen.text || `${j.name} ${j.argv.join(" ")}`.includes(chosen.text)));
  const summary = (data.jobs || {}).summary || {};
  const rows = shown.map((j) => ({
    id: j.job_id,
    cells: [el("a", { href: `#job/${j.job_id}` }, j.job_id), text(j.name), badge(j.state), text(j.exit_code),
      j.argv.join(" "), ago(j.created_at), j.gang ? "gang" : ""],
  }));
  return [
    el("div", { class: "cards" }, Object.entries(summary).map(([k, v]) => card(k, v))),
    jobFilters(),
    table(`${shown.length} of ${jobs.length} jobs on this node`, ["Job", "Name", "State", "Exit", "Command", "Created", ""],
      rows, (row) => ({ "data-job": row.id })),
  ];
}

function renderJob(data) {
  const job = ((data.jobs || {}).jobs || []).find((j) => j.job_id === state.job);
  if (!job) return [el("p", {}, `No job ${state.job} on this node (yet).`)];
  const fields = ["job_id", "name", "node", "state", "exit_code", "signal", "reason", "pid", "cwd", "timeout_s", "role"];
  const record = el("dl", { class: "record" }, fields.flatMap((f) => [el("dt", {}, f), el("dd", {}, text(job[f]))]),
    el("dt", {}, "command"), el("dd", {}, job.argv.join(" ")),
    el("dt", {}, "started"), el("dd", {}, ago(job.started_at)));
  return [el("p", {}, el("a", { href: "#jobs" }, "← all jobs")), el("h2", {}, `Job ${job.job_id}`), record,
    ...gangOf(job), ...logPanes()];
}

function gangOf(job) {
  if (!job.gang) return [];
  if (Array.isArray(job.gang.members)) {
    const rows = job.gang.members.map((m) => ({
      cells: [text(m.rank), text(m.node), text(m.job_id), badge(m.state), text(m.exit_code), text(m.signal), text(m.reason)],
    }));
    return [el("h2", {}, "Gang members"), el("p", {}, `Fence ${typeof job.gang.fence === "string" ? job.gang.fence : JSON.stringify(job.gang.fence)}`),
      table("Every member of this gang job, by rank", ["Rank", "Node", "Job", "State", "Exit", "Signal", "Reason"], rows)];
  }
  const rows = Object.entries(job.gang).map(([k, v]) => ({ cells: [k, typeof v === "object" ? JSON.stringify(v) : text(v)] }));
  return [el("h2", {}, "Gang"), table("This member's place in its gang", ["Key", "Value"], rows)];
}

function logPanes() {
  return [
    el("h2", { id: "stdout-title" }, "stdout"),
    el("pre", { class: "log", id: "log-stdout", "aria-labelledby": "stdout-title", tabindex: "0" }, state.logs.stdout),
    el("h2", { id: "stderr-title" }, "stderr"),
    el("pre", { class: "log", id: "log-stderr", "aria-labelledby": "stderr-title", tabindex: "0" }, state.logs.stderr),
  ];
}

function renderRuns(data) {
  const runs = data.runs || {};
  const queue = (runs.runs || []).map((r) => ({ cells: [text(r.seq), text(r.run_id), text(r.group), badge(r.state), text(r.node), ago(r.submitted_at)] }));
  const locks = Object.entries(runs.locks || {}).map(([name, l]) => ({
    cells: [name, text(l.holder), l.fence ? l.fence.join(".") : "–", (l.waiters || []).map((w) => w.holder).join(", ") || "–",
      l.expires_at ? ago(-l.expires_at + 2 * Date.now() / 1000).replace("ago", "left") : "–"],
  }));
  return [
    el("div", { class: "cards" }, card("Coordinator", text(runs.coordinator)), card("Table version", text((runs.version || []).join("."))) ),
    el("h2", {}, "Run queue"), table("Queued and running runs, in order", ["#", "Run", "Group", "State", "Node", "Submitted"], queue),
    el("h2", {}, "Locks"), table("Locks, their holders and fences", ["Lock", "Holder", "Fence", "Waiting", "Expires"], locks),
  ];
}

function sparkline(label, samples, key) {
  const values = samples.map((s) => s[key]).filter((v) => typeof v === "number");
  const w = 220, h = 44, max = Math.max(1, ...values);
  const points = values.map((v, i) => `${(i / Math.max(1, values.length - 1)) * w},${h - 2 - (v / max) * (h - 4)}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${label}: last ${values.length} samples, now ${values.at(-1) ?? "–"}`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.append(line);
  return el("figure", { class: "spark" }, svg, el("figcaption", {}, `${label}: ${text(values.at(-1))}`));
}

function renderSync(data) {
  const sync = data.sync || {};
  const p = sync.progress || { files_total: 0, files_done: 0, bytes_total: 0, bytes_done: 0 };
  const last = sync.last_run || {};
  const files = last.files || {};
  const categories = new Set([...Object.keys(sync.deletions || {}), ...Object.keys(sync.fanout || {}), ...Object.keys(files)]);
  const rows = [...categories].sort().map((c) => {
    const fan = (sync.fanout || {})[c] || {}, del = (sync.deletions || {})[c] || {};
    const stats = files[c] || {};
    return { category: c, cells: [c, text(stats.files_transferred), bytes(stats.bytes_transferred), bytes(fan.served_bytes), text(stats.deleted), text(del.policy), text(del.tombstones)] };
  });
  return [
    el("div", { class: "cards" }, card("Running", sync.running ? "yes" : "no"),
      card("Files", `${p.files_done} of ${p.files_total}`, "sync-files"),
      card("Bytes", `${bytes(p.bytes_done)} of ${bytes(p.bytes_total)}`, "sync-bytes"),
      card("Peers", (sync.peers || []).join(", ") || "none")),
    el("label", { for: "sync-progress" }, "Transfers in flight"),
    el("progress", { id: "sync-progress", max: String(p.bytes_total || 1), value: String(p.bytes_done), "data-bytes": String(p.bytes_done) }),
    sparkline("bytes done", ((data.history || {}).samples || []), "sync_bytes_done"),
    el("h2", {}, "Categories"),
    table("Per category: last run, bytes served to peers, deletions", ["Category", "Files (last run)", "Bytes (last run)", "Served to peers", "Deleted (last run)", "Deletions", "Tombstones"],
      rows, (row) => ({ "data-category": row.category })),
  ];
}

function renderRl(data) {
  const rl = data.rl || {};
  const rows = Object.entries(rl.runs || {}).map(([run, r]) => ({
    cells: [run, text(r.offered_version), text(r.applied_version), text(r.pending), text(r.max_pending), r.refusing ? "yes" : "no"],
  }));
  const names = rl.cluster_runs || Object.keys(rl.runs || {}).sort();
  const nodes = Object.entries(rl.nodes || {}).sort(([a], [b]) => a.localeCompare(b)).map(([node, n]) => ({
    node, stale: n.stale ? "yes" : "no",
    cells: [node, ...names.map((run) => text(((n.runs || {})[run] || {}).version)),
      n.stale ? el("span", { class: "state state-stale", title: text(n.error) }, n.answered_at ? `stale, from ${ago(n.answered_at)}` : "no answer yet") : "current"],
  }));
  return [
    el("div", { class: "cards" }, card("Staleness drops", text(rl.stale_drops))),
    el("h2", {}, "Runs on this node"),
    table("Weights version offered and applied, rollouts pending", ["Run", "Offered", "Applied", "Rollouts pending", "Max pending", "Refusing"], rows),
    el("h2", {}, "Weights version per node"),
    names.length ? table("The weights version each alive member applied, per run any of them knows", ["Node", ...names, "Answer"],
      nodes, (row) => ({ "data-node": row.node, "data-stale": row.stale }))
      : el("p", { class: "muted" }, "No run has weights on any member, nor rollouts on this node, yet."),
  ];
}

function renderNode(data) {
  const node = data.node || {};
  const comps = ((node.health || {}).components || []).map((c) => ({ cells: [c.name, badge(c.status), c.message] }));
  const breakers = (node.breakers || []).map((b) => ({ cells: [b.peer, b.transport, badge(b.state), text(b.failures), text(b.retry_after_s)] }));
  const samples = (data.history || {}).samples || [];
  const gpus = ((data.status || {}).gpus || []).map((g) => ({
    cells: [text(g.index), text(g.name), text(g.util_pct), `${text(g.memory_used_mb)} / ${text(g.memory_total_mb)}`,
      text(g.temperature_c), badge((g.problems || []).length ? "degraded" : "healthy"), (g.problems || []).join("; ") || "–"],
  }));
  return [
    ...banners(data.status || {}),
    el("div", { class: "cards" }, card("Node", text(node.node_id)), card("Health", badge((node.health || {}).status)),
      card("WAL pending", text((node.wal || {}).pending)), card("Oldest pending", text((node.wal || {}).oldest_pending_age_s))),
    el("h2", {}, "Last minutes"),
    el("div", {}, sparkline("CPU %", samples, "cpu_percent"), sparkline("Memory MiB", samples, "rss_mb"),
      sparkline("WAL pending", samples, "wal_pending"), sparkline("Members alive", samples, "alive"),
      sparkline("Jobs running", samples, "jobs_running")),
    el("h2", {}, "Health components"), table("Every health check of this node", ["Component", "Status", "Message"], comps),
    el("h2", {}, "GPUs"), gpus.length ? table("This node's GPUs and their health", ["GPU", "Name", "Util %", "Memory MiB", "Temp °C", "Health", "Problems"], gpus)
      : el("p", { class: "muted" }, "No GPU on this node."),
    el("h2", {}, "Circuit breakers"), table("Breakers per peer and transport", ["Peer", "Transport", "State", "Failures", "Retry after (s)"], breakers),
  ];
}

function draw() {
  const page = PAGES[state.page];
  const focused = document.activeElement && document.activeElement.id;
  main.replaceChildren(...page.render(state.data));
  const again = focused && document.getElementById(focused);
  if (again && again !== document.activeElement) again.focus();
  for (const stream of ["stdout", "stderr"]) {
    const pre = document.getElementById(`log-${stream}`);
    if (pre) pre.scrollTop = pre.scrollHeight;
  }
}

async function lost() {
  live.textContent = "reconnecting"; live.className = "live off";
  try {
    const answer = await fetch("/v1/events?topics=-", { credentials: "same-origin" });
    if (answer.status === 401) window.location.assign("/ui/login");
  } catch (err) { /* the node is down: EventSource retries on its own */ }
}

function open() {
  const [page, job] = (window.location.hash.slice(1) || "cluster").split("/");
  state.page = PAGES[page] ? page : "cluster";
  state.job = job || null;
  state.logs = { stdout: "", stderr: "" };
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.page === state.page || (state.page === "job" && link.dataset.page === "jobs")) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (state.source) state.source.close();
  const topics = [...PAGES[state.page].topics, ...(state.job ? [`log:${state.job}`] : [])];
  const source = new EventSource(`/v1/events?topics=${encodeURIComponent(topics.join(","))}`);
  state.source = source;
  source.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  source.addEventListener("error", lost);
  for (const topic of PAGES[state.page].topics) {
    source.addEventListener(topic, (event) => { state.data[topic] = JSON.parse(event.data); draw(); });
  }
  source.addEventListener("log", (event) => {
    const chunk = JSON.parse(event.data);
    state.logs[chunk.stream] += chunk.text;
    const pre = document.getElementById(`log-${chunk.stream}`);
    if (pre) { pre.append(chunk.text); pre.scrollTop = pre.scrollHeight; }
  });
  draw();
}

window.addEventListener("hashchange", open);
open();
