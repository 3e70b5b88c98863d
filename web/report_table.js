// Speculative AR Report Table: show the table the node returns, in the node.
//
// The server sends the markdown table as the node's "text" output; the page has no
// generic place for a custom node's text, so a DOM widget (the extension API's own kind)
// shows it as an HTML table that fits the node's width: cells wrap, columns with one
// value in every row (the prompt of a mode comparison, its seed) are said once above the
// table, and a table still too wide widens the node.  The widget is not saved in the
// workflow (serialize = false): a run fills it again.
import { app } from "../../scripts/app.js";

const NODE = "SpecAR_ReportTable";
const BOX = "table_text";
const NUMBER = /^-?[\d.]+x?$/;

/** The header and rows of a markdown table, or null when ``block`` is no table. */
function parse(block) {
  const lines = block.split("\n").map((l) => l.trim()).filter((l) => l.startsWith("|"));
  if (lines.length < 2 || !/^\|(\s*:?-+:?\s*\|)+$/.test(lines[1])) return null;
  const cells = (line) => line.replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
  return { head: cells(lines[0]), rows: lines.slice(2).map(cells) };
}

function cell(tag, text, style) {
  const e = document.createElement(tag);
  e.textContent = text;
  Object.assign(e.style, { padding: "2px 5px", borderBottom: "1px solid rgba(128,128,128,0.35)",
                           verticalAlign: "top", overflowWrap: "break-word" }, style);
  return e;
}

/** One markdown block as the node shows it: a caption and a table, or the text as it is. */
function render(block) {
  const parsed = parse(block);
  if (!parsed) {
    const pre = document.createElement("pre");
    pre.textContent = block;
    Object.assign(pre.style, { margin: "0", whiteSpace: "pre-wrap", overflowWrap: "anywhere" });
    return [pre];
  }
  const { head, rows } = parsed;
  // a column that repeats one value in every row says nothing per row: said once, above
  const same = head.map((_, i) => rows.length > 1 && rows.every((r) => r[i] === rows[0][i]));
  const out = [];
  if (same.some(Boolean)) {
    const caption = document.createElement("div");
    caption.className = "specar-table-caption";
    caption.textContent = head.map((h, i) => same[i] && `${h}: ${rows[0][i]}`).filter(Boolean).join(" · ");
    Object.assign(caption.style, { padding: "2px 5px 4px", overflowWrap: "anywhere", opacity: "0.8" });
    out.push(caption);
  }
  const keep = head.map((_, i) => i).filter((i) => !same[i]);
  const table = document.createElement("table");
  Object.assign(table.style, { borderCollapse: "collapse", width: "100%" });
  const top = table.createTHead().insertRow();
  for (const i of keep) top.appendChild(cell("th", head[i], { textAlign: "left", fontWeight: "600" }));
  const body = table.createTBody();
  for (const r of rows) {
    const tr = body.insertRow();
    for (const i of keep) {
      const text = r[i] ?? "";
      tr.appendChild(cell("td", text, NUMBER.test(text) ? { textAlign: "right", whiteSpace: "nowrap" } : {}));
    }
  }
  out.push(table);
  return out;
}

/** The widget's element: ``element`` (DOMWidgetImpl), ``inputEl`` on frontends from before it. */
const elementOf = (box) => box.element ?? box.inputEl;

function show(node, text) {
  let box = node.widgets?.find((w) => w.name === BOX);
  if (!box) {
    const view = document.createElement("div");
    view.className = "specar-report-table";
    Object.assign(view.style, { fontFamily: "sans-serif", fontSize: "12px", lineHeight: "1.3", width: "100%",
                                boxSizing: "border-box", overflow: "auto", color: "var(--input-text, #ddd)",
                                background: "var(--comfy-input-bg, #222)", borderRadius: "6px",
                                padding: "4px", userSelect: "text" });
    view.dataset.text = "";
    box = node.addDOMWidget(BOX, "specar_table", view, {
      getValue: () => view.dataset.text,
      setValue: (value) => { view.dataset.text = value ?? ""; },
      getMinHeight: () => 120,
    });
    box.serialize = false;
    if (!box.element) box.inputEl = view;
  }
  const view = elementOf(box);
  view.dataset.text = text;
  view.replaceChildren(...text.split(/\n\s*\n/).flatMap(render));
  const [width, height] = node.computeSize();
  node.setSize([Math.max(node.size[0], width), Math.max(node.size[1], height)]);
  node.setDirtyCanvas?.(true, true);
  // once laid out: a table wider than the node even with its cells wrapped widens the node,
  // and one taller than its box (a long prompt list) makes the node taller
  requestAnimationFrame(() => requestAnimationFrame(() => {
    const wide = view.scrollWidth - view.clientWidth, tall = view.scrollHeight - view.clientHeight;
    if (wide > 0 || tall > 0) {
      node.setSize([node.size[0] + Math.max(0, wide), node.size[1] + Math.max(0, tall)]);
      node.setDirtyCanvas?.(true, true);
    }
  }));
}

app.registerExtension({
  name: "SpeculativeAR.ReportTableText",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE) return;
    const executed = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      const out = executed?.apply(this, arguments);
      const text = message?.text;
      if (text?.length) show(this, Array.isArray(text) ? text.join("\n\n") : String(text));
      return out;
    };
  },
});
