// CapsNet demo page: draw (pointer events: mouse, pen, touch) or upload -> /api/predict;
// sliders move the winning capsule's pose -> /api/decode. No libraries.
"use strict";

const STROKE_WIDTH = 26;        // pixels on the 280x280 canvas: MNIST-like 2-3 pixel strokes at 28x28
const PREDICT_DELAY_MS = 150;   // wait after the pen lifts before predicting
const SLIDER_RANGE = 0.25;      // the paper's Figure 4 perturbations: -0.25 .. 0.25
const SLIDER_STEP = 0.01;

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

let drawing = false;
let predictTimer = null;
let current = null;             // last prediction: {digit, pose}
let decodeBusy = false;
let decodePending = false;

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

document.getElementById("clear").addEventListener("click", () => {
  clearPad();
  showEmpty();
  setStatus("Draw a digit in the box.");
});

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
  setStatus(`Predicted ${reply.digit} (capsule length ${reply.length.toFixed(3)}).`);
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
  current = { digit: reply.digit, pose: reply.pose };
  digitEl.textContent = String(reply.digit);
  const others = reply.top.slice(1).map(([d, s]) => `${d}: ${s.toFixed(2)}`).join(", ");
  lengthEl.textContent = `length ${reply.length.toFixed(3)}` + (others ? ` (then ${others})` : "");
  seenImg.src = reply.input;
  if (reply.reconstruction) reconImg.src = reply.reconstruction; else reconImg.removeAttribute("src");
  drawBars(reply.lengths, reply.digit);
  buildSliders(reply.pose);
}

function showEmpty() {
  current = null;
  digitEl.textContent = "\u2013";
  lengthEl.textContent = "";
  seenImg.removeAttribute("src");
  reconImg.removeAttribute("src");
  barsEl.replaceChildren();
  slidersEl.replaceChildren();
  resetBtn.disabled = true;
}

function drawBars(lengths, winner) {
  const top = Math.max(1, ...lengths);
  barsEl.replaceChildren(...lengths.map((value, j) => {
    const bar = document.createElement("div");
    bar.className = "bar" + (j === winner ? " winner" : "");
    bar.title = `${j}: ${value.toFixed(3)}`;
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.height = `${(100 * value / top).toFixed(1)}%`;
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = String(j);
    bar.append(fill, label);
    return bar;
  }));
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
      body: JSON.stringify({ digit: current.digit, pose: movedPose() }),
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
