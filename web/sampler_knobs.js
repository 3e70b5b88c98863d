// Speculative AR Sampler: show only the knobs the chosen mode (and schedule, and
// draft source) reads.
//
// Which widget belongs to which mode is not written here: the server sends the
// knob table's answer with the node definition (the mode input's option
// "spec_ar_knob_visibility", built by nodes/common.py knob_visibility()).  Hidden
// widgets keep their values, so a saved workflow is the same whatever is shown.
import { app } from "../../scripts/app.js";

const NODE = "SpecAR_Sampler";
const KEY = "spec_ar_knob_visibility";

function widget(node, name) {
  return node.widgets?.find((w) => w.name === name);
}

function linked(node, name) {
  // a widget fed by a link stays visible: the link shows where its value comes from
  return node.inputs?.some((i, slot) => i.widget?.name === name && node.isInputConnected(slot));
}

// Frontend 1.3x skips hidden widgets when it draws and sizes a node, but still
// lays them out (each keeps its row); a zero height removes the gap.  Its Vue
// nodes read options.hidden instead, which later frontends (1.53 on) make the
// same property as hidden: both are set.
function setHidden(w, hidden) {
  if (!!w.hidden === hidden && !!w.options?.hidden === hidden) return false;
  w.hidden = hidden;
  if (w.options) w.options.hidden = hidden;
  if (hidden) {
    w.__specArOwnSize = Object.getOwnPropertyDescriptor(w, "computeSize");
    w.computeSize = () => [0, -4];
  } else if (w.__specArOwnSize) {
    Object.defineProperty(w, "computeSize", w.__specArOwnSize);
  } else {
    delete w.computeSize;
  }
  return true;
}

function refresh(node, table) {
  const mode = widget(node, "mode")?.value;
  const schedule = widget(node, table.schedule)?.value;
  // a linked draft model replaces Jacobi drafting: its depth shows, the window and init hide
  const drafted = node.inputs?.some((i, slot) => i.name === table.drafter_input && node.isInputConnected(slot));
  const byMode = drafted ? table.drafted[widget(node, table.tree)?.value] : table.visible;
  const shown = byMode?.[mode]?.[schedule] ?? table.knobs;  // an unknown mode: hide nothing
  const family = widget(node, table.switch)?.value === true;
  let changed = false;
  for (const name of table.knobs) {
    const w = widget(node, name);
    if (!w) continue;
    const hide = !linked(node, name) && (!shown.includes(name) || (family && table.switched.includes(name)));
    changed = setHidden(w, hide) || changed;
  }
  // the node's height follows its visible widgets; a user's wider node stays wide
  const [width, height] = node.computeSize();
  if (changed || node.size[1] !== height) node.setSize([Math.max(node.size[0], width), height]);
  node.setDirtyCanvas?.(true, true);
}

function watch(node, name, table) {
  const w = widget(node, name);
  if (!w || w.__specArWatched) return;
  const callback = w.callback;
  w.callback = function (...args) {
    const out = callback?.apply(this, args);
    refresh(node, table);
    return out;
  };
  w.__specArWatched = true;
}

app.registerExtension({
  name: "SpeculativeAR.ModeAwareKnobs",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name !== NODE) return;
    const table = nodeData.input?.required?.mode?.[1]?.[KEY];
    if (!table) {
      console.warn(`[Speculative AR] ${NODE}: the server sent no ${KEY}; every knob stays visible`);
      return;
    }
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function (...args) {
      const out = created?.apply(this, args);
      for (const name of ["mode", table.schedule, table.switch, table.tree]) watch(this, name, table);
      refresh(this, table);
      return out;
    };
    const configured = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (...args) {
      const out = configured?.apply(this, args);
      refresh(this, table);  // a loaded workflow: its saved mode decides
      return out;
    };
    // loading a workflow sets every node's saved size after onConfigure: fit again once the graph is in
    const graphConfigured = nodeType.prototype.onAfterGraphConfigured;
    nodeType.prototype.onAfterGraphConfigured = function (...args) {
      const out = graphConfigured?.apply(this, args);
      refresh(this, table);
      return out;
    };
    // a link into a knob's input shows that knob (only input links matter)
    const connections = nodeType.prototype.onConnectionsChange;
    nodeType.prototype.onConnectionsChange = function (type, ...rest) {
      const out = connections?.call(this, type, ...rest);
      if (this.widgets && type === (window.LiteGraph?.INPUT ?? 1)) refresh(this, table);
      return out;
    };
  },
});
