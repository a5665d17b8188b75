// The page of `vit serve`: each image picked, dropped or pasted is posted to /predict on its own and its answer shown
// in a card: the top-5 as bars, the explanation's overlay, the attention explorer. Written by vit.serve.page.
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const QUERY = $("results").dataset.query;
  const EXPLORER = JSON.parse($("explorer-assets").textContent); // the explorer's template, script, style, code fields
  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#x27;" };
  const esc = (text) => String(text).replace(/[&<>"']/g, (c) => ENTITIES[c]); // text into HTML, as html.escape

  class ServeError extends Error { // a failed request: its HTTP status (0: no answer, null: none) and the reason
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function headers(extra = {}) { // with the API key once one is entered
    const key = $("key").value.trim();
    return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
  }

  // An answer's JSON, or a ServeError with the status and the server's `error` (else the first line of its text).
  async function answer(response) {
    const text = await response.text();
    let body = null;
    try {
      body = JSON.parse(text);
    } catch (e) {
      body = null;
    }
    if (!response.ok) {
      const detail = body && body.detail; // FastAPI's (LitServe's) own errors: a string, or a list for bad fields
      const reason = body && (body.error || (typeof detail === "string" ? detail : detail && JSON.stringify(detail)));
      const line = reason || text.trim().split("\n")[0] || response.statusText;
      const retry = response.headers.get("Retry-After");
      if (response.status === 401 || response.status === 403) $("key-box").hidden = false;
      throw new ServeError(response.status, retry ? `${line} (try again in ${retry} s)` : line);
    }
    if (body === null) throw new ServeError(response.status, "the answer is not JSON");
    return body;
  }

  async function call(path, options = {}) {
    let response;
    try {
      response = await fetch(path, { ...options, headers: headers(options.headers) });
    } catch (error) {
      throw new ServeError(0, `the server did not answer (${error.message})`);
    }
    return answer(response);
  }

  const errorLine = (error) => (error.status ? `error ${error.status}: ${error.message}` : `error: ${error.message}`);

  // ---------------------------------------------------------------------------------------------------- the model
  const size = (s) => { // an input size as "H×W px": [3, H, W], [H, W] or a number
    const v = Array.isArray(s) ? s.slice(-2) : [s, s];
    return `${v.join("×")} px`;
  };
  async function showInfo() {
    try {
      const info = await call("info");
      const classes = info.classes || info.class_names || [];
      const input = info.input_size || info.img_size || info.size;
      $("model-name").textContent = info.model || info.name || "";
      const facts = [`${classes.length} classes`];
      if (input) facts.push(`input ${size(input)}`);
      if (info.backend) facts.push(`backend ${info.backend}`);
      if (typeof info.temperature === "number") facts.push(`calibrated, temperature ${info.temperature.toFixed(2)}`);
      const version = info.version || info.vit_version;
      if (version) facts.push(`vit ${version}`);
      $("model-info").textContent = facts.join(" · ");
      $("classes-count").textContent = `the ${classes.length} classes`;
      $("classes").textContent = classes.join(", ");
      $("classes-box").hidden = !classes.length;
    } catch (error) {
      $("model-info").textContent = `The model's description is unavailable: ${errorLine(error)}`;
      $("model-info").classList.add("error");
    }
  }

  // ----------------------------------------------------------------------------------------------------- a card
  function pixelatedWhenSmall(img) { // a small image (CIFAR's 32 px) is shown enlarged, its pixels kept sharp
    img.addEventListener("load", () => {
      img.classList.toggle("pixelated", Math.max(img.naturalWidth, img.naturalHeight) < 128);
    });
  }
  function newCard(file) {
    const card = $("result-template").content.firstElementChild.cloneNode(true);
    card.querySelector(".name").textContent = file.name || "pasted image";
    const img = card.querySelector(".input img");
    pixelatedWhenSmall(img);
    img.addEventListener("load", () => {
      img.nextElementSibling.textContent = `image, ${img.naturalWidth}×${img.naturalHeight} px`;
    });
    img.src = URL.createObjectURL(file);
    img.addEventListener("error", () => { img.closest("figure").hidden = true; }); // a file the browser cannot show
    $("results").append(card);
    $("clear").hidden = false;
    return card;
  }
  const percent = (score) => (score < 0.001 ? "<0.1%" : `${(100 * score).toFixed(1)}%`);
  function showPredictions(card, predictions) {
    const bars = card.querySelector(".bars");
    bars.innerHTML = predictions.map((p, i) => `<li${i === 0 ? ' class="first"' : ""}>`
      + `<span class="label" title="${esc(p.label)}">${esc(p.label)}</span>`
      + '<span class="track"><span class="fill"></span></span>'
      + `<span class="pct">${percent(p.score)}</span></li>`).join("");
    bars.querySelectorAll(".fill").forEach((fill, i) => {
      fill.style.width = `${Math.max(0, Math.min(1, predictions[i].score)) * 100}%`;
    });
    card.querySelector(".status").hidden = true;
  }
  function colourNote(explanation, label) {
    return explanation.signed
      ? `Signed relevance: red = evidence for “${label}”, blue = evidence against it, clear = none; the colours `
        + "run from −max to +max |relevance| of this image."
      : "Sequential scale (inferno): dark = little, bright = most, from 0 to this map's maximum.";
  }
  function showExplanation(card, explanation, label) {
    if (!explanation) return;
    const figure = card.querySelector(".overlay");
    const img = figure.querySelector("img");
    pixelatedWhenSmall(img);
    img.src = explanation.overlay;
    figure.querySelector("figcaption").innerHTML = `<b>${esc(explanation.method)}</b> for “${esc(label)}”`
      + `<span class="note">${esc(colourNote(explanation, label))}</span>`;
    figure.hidden = false;
    if (explanation.explorer) showExplorer(card, explanation.explorer);
  }
  function showError(card, error) {
    const line = card.querySelector(".error");
    line.textContent = errorLine(error);
    line.hidden = false;
    card.querySelector(".top").hidden = true; // nothing to show there
    card.dataset.state = "error";
  }

  // ---------------------------------------------------------------------------------------------- the explorer
  const scriptJson = (value) => JSON.stringify(value) // inert inside <script>, as vit.explain.render.explorer.page_json
    .replace(/</g, "\\u003c").replace(/>/g, "\\u003e").replace(/&/g, "\\u0026");
  // The explorer's page of one payload, filled as vit.explain.render.explorer.render_explorer fills it: the light data,
  // each image's picture and codes in script elements of their own, the first image's picture as the opening <img>.
  function explorerPage(payload) {
    const heavy = new Set([...EXPLORER.codes, "image"]);
    const pick = (entry, keep) => Object.fromEntries(Object.entries(entry).filter(([k]) => keep(k)));
    const light = { ...payload, images: payload.images.map((im) => pick(im, (k) => !heavy.has(k))) };
    const element = (kind, i, value) => `<script type="application/json" id="explorer-${kind}-${i}">`
      + `${scriptJson(value)}<\/script>`;
    const elements = payload.images.map((im, i) => element("picture", i, im.image)
      + element("codes", i, pick(im, (k) => EXPLORER.codes.includes(k))));
    const first = payload.images[0];
    const kind = first && first.image.startsWith("/9j/") ? "jpeg" : "png";
    const parts = {
      title: esc(payload.title || "attention explorer"),
      css: EXPLORER.css,
      extra: "",
      data: scriptJson(light),
      first: elements.slice(0, 1).join("\n"),
      opening: first ? `<img id="explorer-opening" hidden alt="" src="data:image/${kind};base64,${first.image}">` : "",
      js: EXPLORER.js,
      rest: elements.slice(1).join("\n"),
    };
    return EXPLORER.html.replace(/\{\{(\w+)\}\}/g, (_, name) => parts[name]); // one pass, as the Python side
  }
  function showExplorer(card, payload) {
    const box = card.querySelector(".explorer");
    const frame = box.querySelector("iframe");
    const fit = () => { // the frame as tall as the explorer, so the page scrolls as one
      const doc = frame.contentDocument;
      if (doc && doc.documentElement) frame.style.height = `${doc.documentElement.scrollHeight}px`;
    };
    frame.addEventListener("load", () => {
      fit();
      new ResizeObserver(fit).observe(frame.contentDocument.body);
    });
    frame.srcdoc = explorerPage(payload);
    box.hidden = false;
  }

  // ------------------------------------------------------------------------------------------------- requesting
  async function classify(file, card) {
    const start = performance.now();
    const took = () => { card.querySelector(".took").textContent = `${Math.round(performance.now() - start)} ms`; };
    try {
      const body = await call(`predict?${QUERY}`, {
        method: "POST", body: file, headers: { "Content-Type": file.type || "application/octet-stream" },
      }).finally(took);
      // With an explanation: [{predictions, explanation}]; without: [{label, score}, ...] (Hugging Face's shape).
      const explained = Array.isArray(body) && body[0] && typeof body[0] === "object" && !("label" in body[0]);
      const result = explained ? body[0] : body;
      if (result.error) throw new ServeError(null, result.error); // an image's own failure inside a batch's answer
      const predictions = Array.isArray(result) ? result : result.predictions;
      if (!Array.isArray(predictions) || !predictions.length) throw new ServeError(null, "no predictions in the answer");
      showPredictions(card, predictions);
      showExplanation(card, result.explanation, predictions[0].label);
      card.dataset.state = "done";
    } catch (error) {
      showError(card, error);
    }
  }
  let queue = Promise.resolve(); // one request at a time, in the order the images came
  function add(files) {
    for (const file of files) {
      const card = newCard(file);
      queue = queue.then(() => classify(file, card));
    }
  }

  $("files").addEventListener("change", (e) => {
    add(Array.from(e.target.files));
    e.target.value = ""; // the same file can be chosen again
  });
  $("clear").addEventListener("click", () => {
    for (const img of $("results").querySelectorAll(".input img")) URL.revokeObjectURL(img.src);
    $("results").replaceChildren();
    $("clear").hidden = true;
  });
  const dragging = (on) => document.body.classList.toggle("dragging", on);
  window.addEventListener("dragover", (e) => {
    e.preventDefault(); // without it the browser would open the dropped file instead
    dragging(true);
  });
  window.addEventListener("dragleave", (e) => { if (!e.relatedTarget) dragging(false); });
  window.addEventListener("drop", (e) => {
    e.preventDefault();
    dragging(false);
    add(Array.from(e.dataTransfer.files));
  });
  window.addEventListener("paste", (e) => {
    const files = Array.from(e.clipboardData ? e.clipboardData.files : []);
    if (files.length) add(files);
  });
  // For tests: the description read, every answer shown, the explorer's page of a payload.
  window.servePage = { info: showInfo(), done: () => queue, explorerPage };
})();
