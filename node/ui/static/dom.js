// The dashboard's DOM helpers: every value is written as text (textContent), never as HTML.
export function el(tag, attrs = {}, ...children) {
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

export const text = (value) => (value === null || value === undefined || value === "" ? "–" : String(value));
export const badge = (value) => el("span", { class: `state state-${value}` }, text(value));

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function ago(epoch) {
  if (!epoch) return "–";
  const s = Math.max(0, Date.now() / 1000 - epoch);
  return s < 120 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

export function table(caption, headers, rows, rowAttrs = () => ({})) {
  const head = el("tr", {}, headers.map((h) => el("th", { scope: "col" }, h)));
  const body = rows.map((row, i) => el("tr", rowAttrs(row, i), row.cells.map((c) => el("td", {}, c))));
  return el("div", { class: "scroll", tabindex: "0", role: "region", "aria-label": caption },
    el("table", {}, el("caption", { class: "muted" }, caption), el("thead", {}, head), el("tbody", {}, body)));
}

export function card(label, value, id) {
  return el("div", { class: "card" }, el("span", { class: "k" }, label), el("span", { class: "v", id }, value));
}
