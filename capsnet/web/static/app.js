// CapsNet demo page: draw (pointer events: mouse, pen, touch) or upload -> /api/predict;
// the routing maps of the reply are drawn on canvases; sliders move the winning capsule's
// pose -> /api/decode. Classes are shown by name; a model that is not of handwritten digits
// says so (GET /api/model), and uploading is the way to use it. No libraries.
"use strict";

const STROKE_WIDTH = 26;        // pixels on the 280x280 canvas: MNIST-like 2-3 pixel strokes at 28x28
const PREDICT_DELAY_MS = 150;   // wait after the pen lifts before predicting
const SLIDER_RANGE = 0.25;      // the paper's Figure 4 perturbations: -0.25 .. 0.25
const SLIDER_STEP = 0.01;
const NAME_CHARS = 10;          // class names shortened to this on bars and buttons
const SHORT_NAME = 2;           // longer names ("cat", not "7") are written upwards under the bars
const SUPPORT_ALPHA = 0.85;     // opacity of the strongest support cell over the input
const INK_ALPHA = 0.6;          // opacity of the input drawn over the coupling map
const INK_RGB = [40, 40, 40];
const FIELD_COLOR = "#17becf";  // dashed square: the strongest cell's receptive field
const MAP_BACKGROUND = "#eef0f3"; // the coupling map outside the primary grid
const GRID_EDGE_COLOR = "#999";
// Colour ramps as [position, [r, g, b]] stops, as in `capsnet routing`: matplotlib's RdBu_r
// (diverging around the uniform coupling 1/J) and magma (support).
const COUPLING_RAMP = [[0, [33, 102, 172]], [0.25, [146, 197, 222]], [0.5, [247, 247, 247]],
                       [0.75, [244, 165, 130]], [1, [178, 24, 43]]];
const SUPPORT_RAMP = [[0, [0, 0, 4]], [0.25, [81, 18, 124]], [0.5, [183, 55, 121]],
                      [0.75, [252, 137, 97]], [1, [252, 253, 191]]];

const pad = document.getElementById("pad");
const ctx = pad.getContext("2d");
const statusLine = document.getElementById("status");
const digitEl = document.getElementById("digit");
const lengthEl = document.getElementById("length");
const seenImg = document.getElementById("seen");
const reconImg = document.getElementById("recon");
const barsEl = document.getElementById("bars");
const slidersEl = document.getElementById("sliders");
const resetBtn = document.getElementById("reset");
const routingPanel = document.getElementById("routing-panel");
const routingHint = document.getElementById("routing-hint");
const supportCanvas = document.getElementById("routing-support");
const couplingCanvas = document.getElementById("routing-couplings");
const typesCanvas = document.getElementById("routing-types");
const capsulesEl = document.getElementById("routing-capsules");
const iterationsEl = document.getElementById("routing-iterations");
const stepBtn = document.getElementById("routing-step");
const routingCaption = document.getElementById("routing-caption");

let drawing = false;
let predictTimer = null;
let current = null;             // last prediction: {index, pose}
let decodeBusy = false;
let decodePending = false;
let routing = null;             // {maps: reply.routing, winner, capsule, iteration (0-based), ink}

function setStatus(text, isError = false) {
  statusLine.textContent = text;
  statusLine.classList.toggle("error", isError);
}

// ---- drawing -----------------------------------------------------------------------
function clearPad() {
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, pad.width, pad.height);
}

function padPoint(event) {
  const box = pad.getBoundingClientRect();
  return [(event.clientX - box.left) * pad.width / box.width,
          (event.clientY - box.top) * pad.height / box.height];
}

pad.addEventListener("pointerdown", (event) => {
  event.preventDefault();
  pad.setPointerCapture(event.pointerId);
  drawing = true;
  clearTimeout(predictTimer);
  const [x, y] = padPoint(event);
  ctx.strokeStyle = "#000";
  ctx.lineWidth = STROKE_WIDTH;
  ctx.lineCap = "round";
  ctx.lineJoin = "round";
  ctx.beginPath();
  ctx.moveTo(x, y);
  ctx.lineTo(x, y);
  ctx.stroke();
});

pad.addEventListener("pointermove", (event) => {
  if (!drawing) return;
  const events = event.getCoalescedEvents ? event.getCoalescedEvents() : [event];
  for (const e of (events.length ? events : [event])) {
    const [x, y] = padPoint(e);
    ctx.lineTo(x, y);
  }
  ctx.stroke();
});

function endStroke() {
  if (!drawing) return;
  drawing = false;
  clearTimeout(predictTimer);
  predictTimer = setTimeout(predictDrawing, PREDICT_DELAY_MS);
}
pad.addEventListener("pointerup", endStroke);
pad.addEventListener("pointercancel", endStroke);

let readyText = "Draw a digit in the box.";

document.getElementById("clear").addEventListener("click", () => {
  clearPad();
  showEmpty();
  setStatus(readyText);
});

// What the model tells apart: a model that is not of handwritten digits says so.
async function describeModel() {
  let info;
  try {
    info = await readJson(await fetch("/api/model"));
  } catch (_) {
    return;  // the page works without it: the classes come with each prediction
  }
  if (info.digits) return;
  const kind = info.channels === 3 ? "colour" : "grey";
  readyText = `Upload an image: this model (${info.dataset}, ${info.image_size}\u00d7` +
    `${info.image_size} ${kind}) tells apart ${info.classes.length} classes: ` +
    `${info.classes.join(", ")}. Drawing works too, but it was not trained on drawings.`;
  document.getElementById("input-title").textContent = "Your image";
  setStatus(readyText);
}

function predictDrawing() {
  pad.toBlob((blob) => sendImage(blob, "drawing.png"), "image/png");
}

document.getElementById("upload").addEventListener("change", (event) => {
  const file = event.target.files[0];
  event.target.value = "";      // choosing the same file again fires change again
  if (file) sendImage(file, file.name);
});

// ---- prediction ----------------------------------------------------------------------
async function sendImage(blob, name) {
  const form = new FormData();
  form.append("image", blob, name);
  setStatus("Predicting\u2026");
  let reply;
  try {
    const response = await fetch("/api/predict", { method: "POST", body: form });
    reply = await readJson(response);
  } catch (err) {
    setStatus(String(err.message || err), true);
    return;
  }
  showPrediction(reply);
  setStatus(`Predicted ${reply.class} (capsule length ${reply.length.toFixed(3)}).`);
}

async function readJson(response) {
  let body = null;
  try { body = await response.json(); } catch (_) { /* not JSON */ }
  if (!response.ok) {
    throw new Error((body && body.error) || `server answered ${response.status}`);
  }
  return body;
}

function showPrediction(reply) {
  current = { index: reply.index, pose: reply.pose };
  const names = reply.classes;
  digitEl.textContent = reply.class;
  digitEl.title = `class ${reply.index}`;
  digitEl.classList.toggle("named", reply.class.length > SHORT_NAME);
  const others = reply.top.slice(1).map(([j, s]) => `${names[j]}: ${s.toFixed(2)}`).join(", ");
  lengthEl.textContent = `length ${reply.length.toFixed(3)}` + (others ? ` (then ${others})` : "");
  seenImg.src = reply.input;
  if (reply.reconstruction) reconImg.src = reply.reconstruction; else reconImg.removeAttribute("src");
  drawBars(reply.lengths, reply.index, names);
  showRouting(reply);
  buildSliders(reply.pose);
}

function showEmpty() {
  current = null;
  digitEl.textContent = "\u2013";
  lengthEl.textContent = "";
  seenImg.removeAttribute("src");
  reconImg.removeAttribute("src");
  barsEl.replaceChildren();
  routing = null;
  routingPanel.hidden = true;
  slidersEl.replaceChildren();
  resetBtn.disabled = true;
}

function shortName(name) {
  return name.length <= NAME_CHARS ? name : name.slice(0, NAME_CHARS - 1) + "\u2026";
}

function drawBars(lengths, winner, names) {
  const top = Math.max(1, ...lengths);
  barsEl.classList.toggle("named", names.some((name) => name.length > SHORT_NAME));
  barsEl.replaceChildren(...lengths.map((value, j) => {
    const bar = document.createElement("div");
    bar.className = "bar" + (j === winner ? " winner" : "");
    bar.title = `${names[j]}: ${value.toFixed(3)}`;
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.height = `${(100 * value / top).toFixed(1)}%`;
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = shortName(names[j]);
    bar.append(fill, label);
    return bar;
  }));
}

// ---- routing maps ----------------------------------------------------------------------
function rampColor(ramp, t) {
  const x = Math.min(1, Math.max(0, t));
  for (let k = 1; k < ramp.length; k++) {
    const [p1, c1] = ramp[k];
    if (x <= p1) {
      const [p0, c0] = ramp[k - 1];
      const f = (x - p0) / (p1 - p0);
      return c0.map((v, i) => Math.round(v + f * (c1[i] - v)));
    }
  }
  return ramp[ramp.length - 1][1];
}

function rgba([r, g, b], alpha = 1) { return `rgba(${r}, ${g}, ${b}, ${alpha})`; }

function showRouting(reply) {
  const maps = reply.routing;
  if (!maps) { routing = null; routingPanel.hidden = true; return; }
  routingPanel.hidden = false;
  const state = { maps, names: reply.classes, winner: reply.index, capsule: reply.index,
                  iteration: maps.iterations - 1, ink: null };
  routing = state;
  delete supportCanvas.dataset.input;  // set to "drawn" once the input is under the maps
  const spatial = maps.grid > 1;  // a 1x1 grid (Efficient-CapsNet at 28x28): per type only
  routingHint.textContent = (spatial
    ? `Where a class capsule's input comes from: each cell is one position of the ` +
      `${maps.grid}\u00d7${maps.grid} ${maps.children}-capsule grid (${maps.types} capsule ` +
      `types each), drawn at the centre of its ${maps.field}-pixel receptive field; the strip ` +
      `below shows each capsule type.`
    : `The ${maps.types} ${maps.children} capsule types sit on one cell that sees the whole ` +
      `input: the strip shows how each type is coupled to a class capsule.`) +
    ` Routing algorithm: ${maps.routing}; shown: ${maps.meaning}.`;
  document.getElementById("support-figure").hidden = !spatial;
  document.getElementById("coupling-figure").hidden = !spatial;
  document.getElementById("support-caption").textContent =
    `support ${maps.support_label}, summed over capsule types`;
  document.getElementById("coupling-caption").textContent =
    `coupling ${maps.symbol}, mean over types (white: uniform)`;
  document.getElementById("types-caption").textContent =
    `coupling ${maps.symbol} per capsule type (0\u2013${maps.types - 1}), mean over ` +
    `positions (white: uniform)`;
  buildChoices(capsulesEl, maps.capsules, "caps", (j) => shortName(state.names[j]),
               (j) => { state.capsule = j; drawRouting(); }, (j) => String(j));
  capsulesEl.children[state.winner].classList.add("winner");
  buildChoices(iterationsEl, maps.iterations, "iter", (r) => String(r + 1),
               (r) => { state.iteration = r; drawRouting(); });
  drawColorbar("support-bar", SUPPORT_RAMP);
  drawColorbar("coupling-bar", COUPLING_RAMP);
  drawColorbar("types-bar", COUPLING_RAMP);
  document.getElementById("support-max").textContent = maps.support_max.toFixed(2);
  for (const [prefix, spread] of [["coupling", maps.coupling_spread], ["types", maps.type_spread]]) {
    document.getElementById(`${prefix}-min`).textContent = (maps.uniform - spread).toFixed(4);
    document.getElementById(`${prefix}-mid`).textContent = maps.uniform.toFixed(4);
    document.getElementById(`${prefix}-max`).textContent = (maps.uniform + spread).toFixed(4);
  }
  drawRouting();
  const image = new Image();
  image.onload = () => {
    if (routing !== state) return;  // a newer prediction came meanwhile
    const grey = document.createElement("canvas");
    [grey.width, grey.height] = [image.naturalWidth, image.naturalHeight];
    grey.getContext("2d").drawImage(image, 0, 0);
    state.ink = grey;
    drawRouting();
    supportCanvas.dataset.input = "drawn";
  };
  image.src = reply.input;
}

// Buttons labelled label(k), with ids prefix-key(k), calling choose(k).
function buildChoices(container, count, prefix, label, choose, key = label) {
  container.replaceChildren(...Array.from({ length: count }, (_, k) => {
    const button = document.createElement("button");
    Object.assign(button, { type: "button", id: `${prefix}-${key(k)}`, textContent: label(k) });
    button.addEventListener("click", () => choose(k));
    return button;
  }));
}

stepBtn.addEventListener("click", () => {
  if (!routing) return;
  routing.iteration = (routing.iteration + 1) % routing.maps.iterations;
  drawRouting();
});

function drawColorbar(id, ramp) {
  const bar = document.getElementById(id);
  const barCtx = bar.getContext("2d");
  for (let x = 0; x < bar.width; x++) {
    barCtx.fillStyle = rgba(rampColor(ramp, x / (bar.width - 1)));
    barCtx.fillRect(x, 0, 1, bar.height);
  }
}

// Canvas pixels per input pixel on the routing maps (168 / 28 = 6 for MNIST).
function mapScale(maps) { return supportCanvas.width / maps.size; }

// Cell (row, col) of the primary grid as a canvas square, one grid step wide, centred on
// its receptive-field centre (input pixel k spans k..k+1 times the map scale).
function cellRect(maps, row, col) {
  const scale = mapScale(maps);
  const c = maps.centres;
  const step = c.length > 1 ? c[1] - c[0] : 1;
  return [(c[col] + 0.5 - step / 2) * scale, (c[row] + 0.5 - step / 2) * scale,
          step * scale, step * scale];
}

function drawRouting() {
  if (!routing) return;
  const { maps, names, capsule, iteration, winner, ink } = routing;
  const support = maps.support[iteration][capsule];       // (G, G)
  const couplings = maps.couplings[iteration][capsule];   // (G, G)
  [...capsulesEl.children].forEach((b, j) => b.setAttribute("aria-pressed", String(j === capsule)));
  [...iterationsEl.children].forEach((b, r) => b.setAttribute("aria-pressed", String(r === iteration)));

  const sctx = supportCanvas.getContext("2d");
  sctx.imageSmoothingEnabled = false;
  sctx.fillStyle = "#000";
  sctx.fillRect(0, 0, supportCanvas.width, supportCanvas.height);
  if (ink) sctx.drawImage(ink, 0, 0, supportCanvas.width, supportCanvas.height);
  let best = [0, 0];
  support.forEach((line, r) => line.forEach((value, c) => {
    const t = maps.support_max > 0 ? value / maps.support_max : 0;
    sctx.fillStyle = rgba(rampColor(SUPPORT_RAMP, t), SUPPORT_ALPHA * t);
    sctx.fillRect(...cellRect(maps, r, c));
    if (value > support[best[0]][best[1]]) best = [r, c];
  }));
  const [x, y, w] = cellRect(maps, ...best);
  const side = maps.field * mapScale(maps);
  sctx.setLineDash([4, 3]);
  sctx.strokeStyle = FIELD_COLOR;
  sctx.strokeRect(x + w / 2 - side / 2, y + w / 2 - side / 2, side, side);
  sctx.setLineDash([]);

  const cctx = couplingCanvas.getContext("2d");
  cctx.imageSmoothingEnabled = false;
  cctx.fillStyle = MAP_BACKGROUND;
  cctx.fillRect(0, 0, couplingCanvas.width, couplingCanvas.height);
  const spread = maps.coupling_spread || 1;
  let sum = 0;
  couplings.forEach((line, r) => line.forEach((value, c) => {
    sum += value;
    cctx.fillStyle = rgba(rampColor(COUPLING_RAMP, 0.5 + (value - maps.uniform) / (2 * spread)));
    cctx.fillRect(...cellRect(maps, r, c));
  }));
  const [gx, gy] = cellRect(maps, 0, 0);
  const [gx1, gy1, gw] = cellRect(maps, maps.grid - 1, maps.grid - 1);
  cctx.strokeStyle = GRID_EDGE_COLOR;
  cctx.strokeRect(gx, gy, gx1 + gw - gx, gy1 + gw - gy);
  if (ink) cctx.drawImage(inkLayer(routing), 0, 0, couplingCanvas.width, couplingCanvas.height);
  drawTypes(maps, maps.type_couplings[iteration][capsule]);

  const share = 100 * maps.shares[iteration][capsule];
  const mean = sum / (maps.grid * maps.grid);
  routingCaption.textContent = `Capsule ${names[capsule]}` + (capsule === winner ? " (the prediction)" : "") +
    `, iteration ${iteration + 1} of ${maps.iterations}` +
    (iteration === 0 && maps.first_uniform ? " (uniform)" : "") +
    `: ${share.toFixed(1)}% of the ${maps.children} capsules' output is routed here ` +
    `(uniform: ${(100 * maps.uniform).toFixed(1)}%); mean coupling ${mean.toFixed(4)}.`;
}

// One cell per capsule type, coloured by its mean coupling (T,) to the chosen capsule.
function drawTypes(maps, couplings) {
  const tctx = typesCanvas.getContext("2d");
  tctx.fillStyle = MAP_BACKGROUND;
  tctx.fillRect(0, 0, typesCanvas.width, typesCanvas.height);
  const width = typesCanvas.width / couplings.length;
  const spread = maps.type_spread || 1;
  couplings.forEach((value, t) => {
    tctx.fillStyle = rgba(rampColor(COUPLING_RAMP, 0.5 + (value - maps.uniform) / (2 * spread)));
    tctx.fillRect(t * width, 0, Math.ceil(width), typesCanvas.height);
  });
}

// The input as dark, semi-transparent ink over the coupling map (its brightness, the mean of
// the channels, sets the opacity), made once per input.
function inkLayer(state) {
  if (state.inkLayer) return state.inkLayer;
  const { width, height } = state.ink;
  const pixels = state.ink.getContext("2d").getImageData(0, 0, width, height);
  const layer = document.createElement("canvas");
  [layer.width, layer.height] = [width, height];
  const lctx = layer.getContext("2d");
  const out = lctx.createImageData(width, height);
  for (let p = 0; p < width * height; p++) {
    const [r, g, b] = pixels.data.subarray(4 * p, 4 * p + 3);
    out.data.set([...INK_RGB, Math.round(INK_ALPHA * (r + g + b) / 3)], 4 * p);
  }
  lctx.putImageData(out, 0, 0);
  state.inkLayer = layer;
  return layer;
}

// ---- pose sliders ----------------------------------------------------------------------
function buildSliders(pose) {
  slidersEl.replaceChildren();
  resetBtn.disabled = !pose;
  if (!pose) return;
  pose.forEach((_, d) => {
    const label = document.createElement("label");
    label.htmlFor = `dim-${d}`;
    label.textContent = `dim ${d}`;
    const slider = document.createElement("input");
    Object.assign(slider, { type: "range", id: `dim-${d}`, min: -SLIDER_RANGE, max: SLIDER_RANGE,
                            step: SLIDER_STEP, value: 0 });
    slider.className = "slider";
    const shown = document.createElement("output");
    shown.htmlFor = slider.id;
    shown.textContent = "+0.00";
    slider.addEventListener("input", () => {
      const v = Number(slider.value);
      shown.textContent = (v >= 0 ? "+" : "") + v.toFixed(2);
      requestDecode();
    });
    slidersEl.append(label, slider, shown);
  });
}

resetBtn.addEventListener("click", () => {
  slidersEl.querySelectorAll("input.slider").forEach((s) => {
    s.value = 0;
    s.dispatchEvent(new Event("input"));
  });
});

function movedPose() {
  const deltas = [...slidersEl.querySelectorAll("input.slider")].map((s) => Number(s.value));
  return current.pose.map((v, d) => v + (deltas[d] || 0));
}

// At most one request in flight; slider moves during it are coalesced into one more.
async function requestDecode() {
  if (!current || !current.pose) return;
  if (decodeBusy) { decodePending = true; return; }
  decodeBusy = true;
  try {
    const response = await fetch("/api/decode", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ index: current.index, pose: movedPose() }),
    });
    const reply = await readJson(response);
    reconImg.src = reply.reconstruction;
  } catch (err) {
    setStatus(String(err.message || err), true);
  } finally {
    decodeBusy = false;
    if (decodePending) { decodePending = false; requestDecode(); }
  }
}

clearPad();
describeModel();
