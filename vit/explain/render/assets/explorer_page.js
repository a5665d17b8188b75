// The attention explorer's page: the heads' grid, the view with its overlays and legend, the side panel, the
// controls and the hooks for tests. The second half of one function body, after explorer.js (which defines D, $, the
// decoding and the rows); vit.explain.render.explorer.explorer_script joins and wraps them.
  function importanceTop() { // the largest logit drop of any head (1 when none is positive)
    return Math.max(1e-12, ...D.importance.flat().map((v) => v ?? 0));
  }

  function buildImportance() { // the heads ranked by their mean-ablation logit drop, each a button that shows it
    if (!D.importance) return;
    const ranked = D.importance.flatMap((row, b) => row.map((drop, h) => ({ b, h, drop })))
      .filter((r) => r.drop !== null).sort((x, y) => y.drop - x.drop);
    $("importance").innerHTML = ranked.map((r) => `<li><button data-block="${r.b}" data-head="${r.h}">block ${r.b}, `
      + `head ${r.h}: ${fixed(r.drop, 3)}</button></li>`).join("");
    for (const button of $("importance").querySelectorAll("button")) {
      button.addEventListener("click", () => timed(() => update({ block: +button.dataset.block,
        head: +button.dataset.head, overlay: "attention" })));
    }
    $("importance-box").hidden = false;
  }

  function buildGrid() {
    const table = $("heads");
    table.textContent = "";
    const size = Math.max(40, Math.min(72, Math.floor(560 / (H + 1))));
    const head = table.insertRow();
    head.insertCell().outerHTML = "<th></th>";
    for (let h = 0; h < H; h++) head.insertCell().outerHTML = `<th>head ${h}</th>`;
    head.insertCell().outerHTML = "<th>mean</th>";
    head.insertCell().outerHTML = `<th id="stats-head">selected head</th>`;
    const rows = [...D.blocks.map((_, b) => b), -1];
    for (const b of rows) {
      if (b === -1 && !LAT) continue;
      const tr = table.insertRow();
      tr.dataset.block = b;
      const label = tr.insertCell();
      label.className = "block";
      label.innerHTML = b >= 0 ? `block ${b}<small>${D.blocks[b].label}</small>` : "MAP head<small>latent → patches</small>";
      for (const h of [...Array(H).keys(), "mean"]) {
        const td = tr.insertCell();
        const cell = document.createElement("div");
        cell.className = "cell" + (h === "mean" ? " mean" : "");
        cell.style.width = cell.style.height = `${size}px`;
        cell.dataset.block = b;
        cell.dataset.head = h;
        cell.title = `${b >= 0 ? "block " + b : "MAP head"}, ${h === "mean" ? "mean of the heads" : "head " + h}`;
        const heat = document.createElement("canvas");
        heat.className = "heat";
        const query = document.createElement("div"); // the query's square: an element, not a canvas to redraw
        query.className = "query";
        cell.append(heat, query);
        if (b >= 0 && D.blocks[b].mask) { // only window and sliding blocks outline a neighbourhood
          const marks = document.createElement("canvas");
          marks.className = "marks";
          marks.width = marks.height = 2 * size;
          cell.append(marks);
        }
        const drop = b >= 0 && h !== "mean" && D.importance ? D.importance[b][h] : null;
        if (drop !== null && drop !== undefined) { // mean ablation: the bar's width is the logit drop
          const bar = document.createElement("div");
          bar.className = "bar";
          bar.style.width = `${Math.round(100 * Math.max(0, drop) / importanceTop())}%`;
          cell.title += `; mean ablation: target logit drops ${fixed(drop, 3)}`;
          cell.append(bar);
        }
        cell.addEventListener("click", () => {
          if (isPool() !== (b === -1)) return; // a greyed-out row: it has no map for this query
          timed(() => update({ block: b, head: h, overlay: "attention" }));
        });
        td.append(cell);
      }
      const st = tr.insertCell();
      st.className = "stats";
      st.dataset.block = b;
    }
  }

  function drawGrid() {
    const shown = new Set(gridRows().map((r) => r.block));
    for (const tr of $("heads").querySelectorAll("tr[data-block]")) {
      const off = !shown.has(Number(tr.dataset.block));
      tr.classList.toggle("off", off);
      if (off) for (const square of tr.querySelectorAll("div.query")) square.hidden = true; // not this query's row
    }
    for (const r of gridRows()) {
      const allowed = allowedPatches(r.block);
      for (const cell of $("heads").querySelectorAll(`.cell[data-block="${r.block}"]`)) {
        const h = cell.dataset.head === "mean" ? "mean" : Number(cell.dataset.head);
        paint(cell.querySelector("canvas.heat"), r.values(h));
        const marks = cell.querySelector("canvas.marks");
        if (marks) {
          const ctx = marks.getContext("2d");
          ctx.clearRect(0, 0, marks.width, marks.height);
          if (allowed) outline(ctx, allowed, marks.width, "#00e5ff");
        }
        placeQuery(cell.querySelector("div.query"));
        cell.classList.toggle("on", r.block === state.block && h === state.head);
      }
      const s = stats(r.full(state.head));
      const td = $("heads").querySelector(`td.stats[data-block="${r.block}"]`);
      td.textContent = `H ${s.entropy.toFixed(2)}` + (s.distance === null ? "" : ` · d ${s.distance.toFixed(1)} px`)
        + (P > 0 && !isPool() ? ` · prefix ${(100 * s.prefix).toFixed(0)} %` : "");
      td.dataset.entropy = s.entropy;
      td.dataset.distance = s.distance === null ? "" : s.distance;
    }
    $("stats-head").textContent = `statistics of ${state.head === "mean" ? "the head mean" : "head " + state.head}`;
  }

  function overlayValues() {
    if (state.overlay === "none") return null;
    if (state.overlay === "attention") {
      const r = gridRows().find((x) => x.block === state.block) || gridRows()[gridRows().length - 1];
      return r.values(state.head);
    }
    return mapValues(state.image, state.overlay);
  }
  const heatCanvas = document.createElement("canvas"); // the overlay at one pixel per patch, before upscaling
  heatCanvas.id = "overlay-map";
  heatCanvas.hidden = true;
  const rampCanvas = document.createElement("canvas");
  // A colour-bar number: two significant digits, as vit.explain.colors.format_value writes it.
  const tick = (v) => (v === 0 ? "0" : String(Number(v.toPrecision(2))));
  function drawLegend(scale) { // the colour bar of the overlay, one pixel per colour, and its numbers
    const bar = $("colorbar"), size = scale.size;
    if (bar.width !== size) bar.width = size;
    const ctx = bar.getContext("2d"), img = ctx.createImageData(size, bar.height);
    for (let i = 0; i < size * bar.height; i++) {
      const c = i % size;
      img.data.set([scale.lut[3 * c], scale.lut[3 * c + 1], scale.lut[3 * c + 2], 255], 4 * i);
    }
    ctx.putImageData(img, 0, 0);
    $("tick-low").textContent = tick(scale.low);
    $("tick-mid").textContent = scale.signed ? "0" : "";
    $("tick-high").textContent = tick(scale.high);
  }
  function drawView() {
    const ctx = $("view").getContext("2d");
    const [h, w] = D.size;
    ctx.imageSmoothingEnabled = Math.max(h, w) > 64;
    ctx.drawImage(current.picture, 0, 0, VIEW, VIEW);
    const values = overlayValues();
    if (values) {
      const scale = scaleOf(values, SIGNED.has(state.overlay));
      paint(heatCanvas, values, false, scale); // opaque colours, kept for reading back
      paint(rampCanvas, values, true, scale);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(rampCanvas, 0, 0, VIEW, VIEW);
      drawLegend(scale);
    }
    $("legend").style.visibility = values ? "visible" : "hidden";
    ctx.strokeStyle = "rgba(255,255,255,0.25)";
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (let c = 1; c < GW; c++) { ctx.moveTo((c * VIEW) / GW, 0); ctx.lineTo((c * VIEW) / GW, VIEW); }
    for (let r = 1; r < GH; r++) { ctx.moveTo(0, (r * VIEW) / GH); ctx.lineTo(VIEW, (r * VIEW) / GH); }
    ctx.stroke();
    if (state.overlay === "attention") {
      const allowed = allowedPatches(state.block);
      if (allowed) outline(ctx, allowed, VIEW, "#00e5ff");
    }
    markQuery(ctx, VIEW);
    const where = isPool() ? "the MAP head" : `block ${state.block}`;
    const note = state.overlay === "attention"
      ? `Overlay: the query's attention in ${where}, ${state.head === "mean" ? "mean of the heads" : "head " + state.head}.`
      : state.overlay === "none" ? "" : `Overlay: ${state.overlay} (image level: no query).`;
    $("overlay-note").textContent = note;
  }

  const className = (c) => (D.class_names && D.class_names[c] !== undefined ? D.class_names[c] : String(c));
  function queryName() {
    const t = state.query.index;
    if (isPool()) return `MAP latent query ${t}`;
    if (t < P) return D.cls && t === 0 ? "class token" : `register token ${t - (D.cls ? 1 : 0)}`;
    const p = t - P;
    return `patch (row ${Math.floor(p / GW)}, col ${p % GW})`;
  }
  function drawSide() {
    const im = D.images[state.image];
    const truth = im.label === null || im.label < 0 ? "" : `true ${className(im.label)} · `;
    $("caption").textContent = `${im.name} · ${truth}pred ${className(im.pred)}`;
    $("query-name").textContent = queryName();
    $("selected").textContent = `query: ${queryName()} · ${isPool() ? "MAP head" : "block " + state.block}, `
      + `${state.head === "mean" ? "mean of heads" : "head " + state.head}`;
    for (const b of $("tokens").querySelectorAll("button")) {
      b.classList.toggle("on", b.dataset.kind === state.query.kind && Number(b.dataset.index) === state.query.index);
    }
    for (const b of $("thumbs").querySelectorAll("button")) b.classList.toggle("on", Number(b.dataset.index) === state.image);
    $("top").innerHTML = im.top.map(([c, p]) => `<div class="bar${c === im.pred ? " pred" : ""}">`
      + `<span class="name">${esc(className(c))}</span><span class="fill" style="width:${Math.round(140 * (p ?? 0))}px">`
      + `</span><span>${p === null ? "–" : `${fixed(100 * p, 1)} %`}</span></div>`).join("");
    $("overlay").value = state.overlay;
  }

  async function draw() {
    const opening = early && state.image === 0 && state.query.kind === "token" && state.query.index === P;
    current = opening ? await early : await decoded(state.image);
    early = null; // the opening rows serve the first drawing only
    maskRows = await masks;
    drawView();
    drawGrid();
    drawSide();
  }
  let pending = Promise.resolve();
  function update(change) {
    Object.assign(state, change);
    pending = pending.then(draw).catch(fail); // a failed draw is shown; the next change draws again
    return pending;
  }
  const nextFrame = () => new Promise((r) => requestAnimationFrame(() => r()));
  const timings = { open: null, click: [] }; // ms: navigation start to the first drawn frame; each answered click
  async function timed(action) {
    const start = performance.now();
    await action();
    await nextFrame();
    timings.click.push(performance.now() - start);
  }

  function setup() {
    if (D.note) {
      $("note").textContent = D.note;
      $("note").hidden = false;
    }
    D.images.forEach((im, i) => {
      const b = document.createElement("button");
      b.dataset.index = i;
      b.title = im.name;
      b.innerHTML = `<img alt="${esc(im.name)}">`; // its picture comes once the page is drawn
      b.addEventListener("click", () => timed(() => update({ image: i })));
      $("thumbs").append(b);
    });
    setupMistakes();
    const tokens = [];
    for (let t = 0; t < P; t++) tokens.push(["token", t, D.cls && t === 0 ? "class token" : `reg ${t - (D.cls ? 1 : 0)}`]);
    for (let i = 0; i < LAT; i++) tokens.push(["latent", i, `MAP query ${i}`]);
    for (const [kind, index, text] of tokens) {
      const b = document.createElement("button");
      Object.assign(b.dataset, { kind, index });
      b.textContent = text;
      b.addEventListener("click", () => timed(() => update({ query: { kind, index }, block: kind === "latent" ? -1
        : state.block < 0 ? D.blocks.length - 1 : state.block })));
      $("tokens").append(b);
    }
    if (!tokens.length) $("tokens").style.display = "none";
    const names = [["attention", "attention of the query (selected map)"], ...D.map_names.map((n) => [n, n]),
      ["none", "none"]];
    $("overlay").innerHTML = names.map(([v, t]) => `<option value="${esc(v)}">${esc(t)}</option>`).join("");
    $("overlay").addEventListener("change", (e) => timed(() => update({ overlay: e.target.value })));
    const f = D.faithfulness;
    if (f && f.deletion_auc) {
      $("faith").innerHTML = "<tr><th>map</th><th>deletion</th><th>insertion</th></tr>" + Object.keys(f.deletion_auc)
        .map((n) => `<tr><td>${esc(n)}</td><td>${fixed(f.deletion_auc[n], 3)}</td>`
          + `<td>${fixed((f.insertion_auc || {})[n], 3)}</td></tr>`).join("");
    } else {
      $("faith-box").style.display = "none";
    }
    buildGrid();
    buildImportance();
    const view = $("view");
    view.addEventListener("click", (e) => {
      const rect = view.getBoundingClientRect();
      const c = Math.min(GW - 1, Math.floor(((e.clientX - rect.left) / rect.width) * GW));
      const r = Math.min(GH - 1, Math.floor(((e.clientY - rect.top) / rect.height) * GH));
      view.focus();
      timed(() => update({ query: { kind: "token", index: P + r * GW + c },
        block: state.block < 0 ? D.blocks.length - 1 : state.block }));
    });
    view.addEventListener("keydown", (e) => {
      const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
      if (!moves[e.key]) return;
      e.preventDefault();
      let p = isPool() || state.query.index < P ? 0 : state.query.index - P;
      const r = Math.max(0, Math.min(GH - 1, Math.floor(p / GW) + moves[e.key][0]));
      const c = Math.max(0, Math.min(GW - 1, (p % GW) + moves[e.key][1]));
      p = r * GW + c;
      timed(() => update({ query: { kind: "token", index: P + p }, block: state.block < 0 ? D.blocks.length - 1
        : state.block }));
    });
  }

  // "Mistakes only": the thumbnails of the images predicted wrong (a known label other than the prediction), the most
  // confident first; the shown image moves to the first of them when it is not one.
  const wrong = D.images.map((im, i) => (im.label !== null && im.label >= 0 && im.label !== im.pred ? i : -1))
    .filter((i) => i >= 0)
    .sort((a, b) => D.images[b].top[0][1] - D.images[a].top[0][1] || a - b);
  function showMistakes(only) {
    for (const b of $("thumbs").children) {
      const k = wrong.indexOf(Number(b.dataset.index));
      b.hidden = only && k < 0;
      b.style.order = only ? String(k) : "";
    }
    return only && wrong.length && !wrong.includes(state.image) ? update({ image: wrong[0] }) : Promise.resolve();
  }
  function setupMistakes() {
    if (!wrong.length) return;
    $("mistakes-count").textContent = String(wrong.length);
    $("mistakes-box").hidden = false;
    $("mistakes-only").addEventListener("change", (e) => timed(() => showMistakes(e.target.checked)));
  }

  setup();
  $("stage").append(heatCanvas);
  const ready = update({}).then(nextFrame).then(() => { timings.open = performance.now(); });
  ready.then(() => update({})); // drawn again once the image's codes are inflated: they answer any query
  ready.then(() => Promise.all(D.images.map(async (_, i) => { // the thumbnails, once the first image is drawn
    const img = $("thumbs").children[i].querySelector("img");
    if (Math.max(...D.size) > 64) img.style.imageRendering = "auto"; // a photograph, shrunk: smoothed, not pixelated
    img.src = pictureUrl(await element("picture", i));
  }))).catch(fail);
  // For tests and benchmarks: the state, the decoded rows of the shown image, and a way to select.
  window.explorer = {
    data: D, state, errors, timings, ready,
    select: (change) => update(change),
    mistakes: (only) => showMistakes(only),
    shown: () => Array.from($("thumbs").children).filter((b) => !b.hidden)
      .sort((a, b) => Number(a.style.order || 0) - Number(b.style.order || 0)).map((b) => Number(b.dataset.index)),
    row: (b, h, t) => Array.from(row(b, h, t)),
    poolRow: (h, i) => Array.from(poolRow(h, i)),
    stats: (full) => stats(Float32Array.from(full)),
    map: (name, index = state.image) => Array.from(mapValues(index, name)),
    ticks: () => ["low", "mid", "high"].map((t) => $(`tick-${t}`).textContent),
    png: async (b64) => { const p = await png(b64); return { ...p, data: Array.from(p.data) }; },
    allowed: (b) => { const a = allowedPatches(b); return a ? Array.from(a, (v) => (v ? 1 : 0)) : null; },
  };
