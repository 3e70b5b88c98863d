// Speculative AR Report Table: show the table the node returns, in the node.
//
// The server sends the markdown table as the node's "text" output; the page has no
// generic place for a custom node's text, so a read-only text box (a DOM widget, the
// extension API's own kind) shows it.  The box is not saved in the workflow
// (serialize = false): a run fills it again.
import { app } from "../../scripts/app.js";

const NODE = "SpecAR_ReportTable";
const BOX = "table_text";

function show(node, text) {
  let box = node.widgets?.find((w) => w.name === BOX);
  if (!box) {
    const area = document.createElement("textarea");
    area.readOnly = true;
    Object.assign(area.style, { fontFamily: "monospace", fontSize: "11px", whiteSpace: "pre", width: "100%",
                                boxSizing: "border-box", resize: "none" });
    box = node.addDOMWidget(BOX, "specar_table", area, {
      getValue: () => area.value,
      setValue: (value) => { area.value = value; },
      getMinHeight: () => 120,
    });
    box.serialize = false;
    box.inputEl = area;
  }
  box.inputEl.value = text;
  const [width, height] = node.computeSize();
  node.setSize([Math.max(node.size[0], width), Math.max(node.size[1], height)]);
  node.setDirtyCanvas?.(true, true);
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
