// The attention explorer's data and rows: decode the attention codes (one grayscale PNG per image) of the shown
// image, the rows of the selected query in every block and head, their colours and statistics. The first half of one
// function body, with explorer_page.js after it (vit.explain.render.explorer.explorer_script joins and wraps them).
  "use strict";
  const D = JSON.parse(document.getElementById("explorer-data").textContent);
  const [GH, GW] = D.grid;
  const [PH, PW] = D.patch;
  const P = D.prefix;
  const NP = GH * GW;
  const N = P + NP;
  const H = D.heads;
  const LAT = D.latent || 0;
  const VIEW = 320;
  const $ = (id) => document.getElementById(id);
  // A number with `digits` decimals; "–" for a missing or non-finite one (written as null: NaN is not JSON).
  const fixed = (v, digits) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(digits) : "–");
  const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`); // names into HTML
  const errors = [];
  function fail(error) { // an error is recorded (for tests), logged and shown above the explorer, never swallowed
    errors.push(String(error && error.message ? error.message : error));
    console.error(error);
    $("note").textContent = `The explorer failed: ${errors[errors.length - 1]}`;
    $("note").hidden = false;
  }
  window.addEventListener("error", (e) => fail(e.error || e.message));
  window.addEventListener("unhandledrejection", (e) => fail(e.reason));

  function bytes(b64) {
    if (Uint8Array.fromBase64) return Uint8Array.fromBase64(b64); // native where the browser has it (Chrome 140)
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function halfToFloat(h) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e === 0) return s * f * 2 ** -24;
    if (e === 31) return f ? NaN : s * Infinity;
    return s * (1 + f / 1024) * 2 ** (e - 15);
  }
  function halves(b64) {
    const raw = bytes(b64);
    const view = new DataView(raw.buffer);
    const out = new Float32Array(raw.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = halfToFloat(view.getUint16(2 * i, true));
    return out;
  }
  // An 8-bit grayscale or RGB PNG (as vit.explain.explorer writes them) as its bytes, exactly as stored: the zlib
  // stream is inflated by the browser (DecompressionStream), the row filters of the PNG format undone here. No canvas
  // is involved, so no colour management or premultiplication can touch a code.
  async function png(b64) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot inflate the data (DecompressionStream: Chrome 80, Firefox 113, Safari 16.4)");
    }
    const raw = bytes(b64);
    const view = new DataView(raw.buffer);
    const parts = [];
    let width = 0, height = 0, channels = 0;
    for (let p = 8; p < raw.length; ) {
      const length = view.getUint32(p), type = String.fromCharCode(...raw.subarray(p + 4, p + 8));
      if (type === "IHDR") {
        width = view.getUint32(p + 8);
        height = view.getUint32(p + 12);
        channels = { 0: 1, 2: 3 }[raw[p + 17]];
        if (raw[p + 16] !== 8 || !channels || raw[p + 20] !== 0) throw new Error("unsupported PNG layout");
      } else if (type === "IDAT") {
        parts.push(raw.subarray(p + 8, p + 8 + length));
      }
      p += 12 + length;
    }
    // Written straight into the stream: a Blob's stream is read through the browser process, tens of ms later.
    const inflater = new DecompressionStream("deflate"), writer = inflater.writable.getWriter();
    const written = Promise.all([...parts.map((part) => writer.write(part)), writer.close()]);
    const [buffer] = await Promise.all([new Response(inflater.readable).arrayBuffer(), written]);
    const filtered = new Uint8Array(buffer);
    const stride = width * channels, out = new Uint8Array(stride * height);
    for (let y = 0; y < height; y++) { // one loop per filter: the 2.8 million codes of a ViT-S/16 image are many
      const filter = filtered[y * (stride + 1)], src = y * (stride + 1) + 1, at = y * stride, up = at - stride;
      if (filter > 4) throw new Error(`PNG row ${y} has an unknown filter ${filter}`);
      if (filter === 0 || (filter === 2 && y === 0)) {
        out.set(filtered.subarray(src, src + stride), at);
      } else if (filter === 1 || (filter === 4 && y === 0)) { // Paeth without a row above predicts from the left
        for (let x = 0; x < stride; x++) out[at + x] = filtered[src + x] + (x >= channels ? out[at + x - channels] : 0);
      } else if (filter === 2) {
        for (let x = 0; x < stride; x++) out[at + x] = filtered[src + x] + out[up + x];
      } else if (filter === 3) {
        for (let x = 0; x < stride; x++) {
          const a = x >= channels ? out[at + x - channels] : 0, b = y > 0 ? out[up + x] : 0;
          out[at + x] = filtered[src + x] + ((a + b) >> 1);
        }
      } else {
        for (let x = 0; x < stride; x++) {
          const a = x >= channels ? out[at + x - channels] : 0, b = out[up + x];
          const c = x >= channels ? out[up + x - channels] : 0;
          const pa = Math.abs(b - c), pb = Math.abs(a - c), pc = Math.abs(a + b - 2 * c);
          out[at + x] = filtered[src + x] + (pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
        }
      }
    }
    return { width, height, channels, data: out };
  }
  // An image's picture: a PNG, or a JPEG for a photograph-sized one (its base64 starts "/9j/"), decoded by the browser.
  const pictureUrl = (b64) => `data:image/${b64.startsWith("/9j/") ? "jpeg" : "png"};base64,${b64}`;
  async function picture(b64) {
    const img = new Image();
    img.src = pictureUrl(b64);
    await img.decode();
    return img;
  }

  const LUT = bytes(D.lut); // 256 RGB colours (inferno): attention and unsigned maps
  const LUT_SIGNED = bytes(D.lut_signed || D.lut); // 255 RGB colours (bwr): signed maps, white in the middle entry
  const SIGNED = new Set(D.signed || []);
  const LEVELS = 2 ** D.bits - 1;
  const SQUARE = Float32Array.from({ length: LEVELS + 1 }, (_, c) => (c / LEVELS) ** 2); // a code's share of its max
  const masks = Promise.all(D.blocks.map(async (b) => (b.mask ? (await png(b.mask)).data : null)));
  // Each image's picture and codes are script elements of their own; those of the images after the first come after
  // this script, so they are read only once the document is parsed (an element being parsed is incomplete).
  const parsed = new Promise((r) => (document.readyState === "loading"
    ? document.addEventListener("DOMContentLoaded", () => r()) : r()));
  async function element(kind, index) {
    if (index > 0) await parsed;
    return JSON.parse(document.getElementById(`explorer-${kind}-${index}`).textContent);
  }
  async function decode(index) {
    const codes = await element("codes", index);
    const [attn, pool, shown] = await Promise.all([png(codes.attn), codes.pool ? png(codes.pool) : null,
      element("picture", index).then(picture)]);
    return { attn: attn.data, share: codes.share ? halves(codes.share) : null, pool: pool ? pool.data : null,
      picture: shown };
  }
  const cache = new Map();
  function decoded(index) { // one image's codes, shares and picture, decoded once (a failure is retried next time)
    if (!cache.has(index)) cache.set(index, decode(index).catch((error) => { cache.delete(index); throw error; }));
    return cache.get(index);
  }
  // The page opens on the first image's first patch: its rows of every block and head are in the data, so the first
  // frame needs neither the image's codes element nor their inflating (both follow it).
  async function opening() {
    const first = D.images[0].first;
    const img = $("explorer-opening"); // loaded while the page was parsed
    const [attn, shown] = await Promise.all([png(first.attn), img.decode().then(() => img)]);
    return { attn: attn.data, share: first.share ? halves(first.share) : null, pool: null, picture: shown, query: P };
  }
  let early = D.images.length && D.images[0].first ? opening() : null;
  function mapValues(index, name) { // an image-level map, decoded from float16
    const m = D.images[index].maps[name];
    return halves(m.f16).map((v) => v * m.max);
  }

  const state = { image: 0, query: { kind: "token", index: P }, block: D.blocks.length - 1, head: "mean",
    overlay: "attention" };
  let current = null; // decoded data of state.image
  let maskRows = [];

  // The decoded attention of query t in block b, head h ("mean": the mean over heads), as N values: each key group's
  // codes squared, scaled to the group's share of the row (the smaller share is stored, as float16).
  function rescale(codes, base, length, prefix, frontShare, backShare) {
    const out = new Float32Array(length);
    let front = 0, rest = 0;
    for (let j = 0; j < length; j++) {
      out[j] = SQUARE[codes[base + j]];
      if (j < prefix) front += out[j]; else rest += out[j];
    }
    const a = front > 0 ? frontShare / front : 0, b = rest > 0 ? backShare / rest : 0;
    for (let j = 0; j < length; j++) out[j] *= j < prefix ? a : b;
    return out;
  }
  function row(b, h, t) {
    if (h === "mean") {
      const out = new Float32Array(N);
      for (let k = 0; k < H; k++) row(b, k, t).forEach((v, j) => { out[j] += v / H; });
      return out;
    }
    if (current.query !== undefined && t !== current.query) throw new Error(`no rows of query ${t} yet`);
    const at = current.query === undefined ? (b * H + h) * N + t : b * H + h; // a row of the opening rows
    if (!P) return rescale(current.attn, at * N, N, 0, 0, 1);
    const small = current.share[at], patches = small < 0 || Object.is(small, -0); // the smaller share: see quantize_rows
    return patches ? rescale(current.attn, at * N, N, P, 1 + small, -small)
      : rescale(current.attn, at * N, N, P, small, 1 - small);
  }
  function poolRow(h, i) { // the attention-pooling head's latent query i over the patches
    if (h === "mean") {
      const out = new Float32Array(NP);
      for (let k = 0; k < H; k++) poolRow(k, i).forEach((v, j) => { out[j] += v / H; });
      return out;
    }
    return rescale(current.pool, (h * LAT + i) * NP, NP, 0, 0, 1);
  }
  const isPool = () => state.query.kind === "latent";
  // Rows shown in the grid: [{label, kind, block, values(h)}]; values are over the patches only.
  function gridRows() {
    if (isPool()) {
      return [{ label: "MAP head", kind: "pool", block: -1,
        values: (h) => poolRow(h, state.query.index), full: (h) => poolRow(h, state.query.index) }];
    }
    return D.blocks.map((blk, b) => ({ label: `block ${b}`, kind: blk.label, block: b,
      full: (h) => row(b, h, state.query.index), values: (h) => row(b, h, state.query.index).subarray(P) }));
  }

  // The colour map and limits of a map, the rule of vit.explain.colors.color_scale: a signed map on bwr from -m to +m
  // (m = max |value|), anything else on inferno from 0 (or its minimum, if below 0) to its maximum.
  function scaleOf(values, signed = false) {
    let low = 0, high = 0, top = 0;
    for (const v of values) { low = Math.min(low, v); high = Math.max(high, v); top = Math.max(top, Math.abs(v)); }
    if (signed) return { signed, low: -(top || 1), high: top || 1, lut: LUT_SIGNED, size: LUT_SIGNED.length / 3 };
    return { signed, low, high: high > low ? high : low + 1, lut: LUT, size: LUT.length / 3 };
  }
  function codesOf(values, scale) { // colour-map indices between the limits (matplotlib's binning)
    const span = scale.high - scale.low;
    return Uint8Array.from(values, (v) => Math.min(scale.size - 1,
      Math.floor(Math.min(1, Math.max(0, (v - scale.low) / span)) * scale.size)));
  }
  // ramp: see-through, so the image shows: by the code (unsigned) or by |value| / m (signed: clear at zero)
  function paint(canvas, values, ramp = false, scale = scaleOf(values)) {
    if (canvas.width !== GW || canvas.height !== GH) [canvas.width, canvas.height] = [GW, GH];
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(GW, GH), data = img.data, codes = codesOf(values, scale), lut = scale.lut;
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      data[4 * i] = lut[3 * c];
      data[4 * i + 1] = lut[3 * c + 1];
      data[4 * i + 2] = lut[3 * c + 2];
      data[4 * i + 3] = !ramp ? 255 : scale.signed ? Math.min(1, Math.abs(values[i]) / scale.high) * 215
        : 40 + (c * 175) / 255;
    }
    ctx.putImageData(img, 0, 0);
  }
  function outline(ctx, allowed, size, color) { // the border of the allowed patches
    const cw = size / GW, ch = size / GH;
    ctx.strokeStyle = color;
    ctx.lineWidth = Math.max(1.5, size / 80);
    ctx.beginPath();
    const ok = (r, c) => r >= 0 && c >= 0 && r < GH && c < GW && allowed[r * GW + c];
    for (let r = 0; r < GH; r++) for (let c = 0; c < GW; c++) {
      if (!ok(r, c)) continue;
      const x = c * cw, y = r * ch;
      if (!ok(r - 1, c)) { ctx.moveTo(x, y); ctx.lineTo(x + cw, y); }
      if (!ok(r + 1, c)) { ctx.moveTo(x, y + ch); ctx.lineTo(x + cw, y + ch); }
      if (!ok(r, c - 1)) { ctx.moveTo(x, y); ctx.lineTo(x, y + ch); }
      if (!ok(r, c + 1)) { ctx.moveTo(x + cw, y); ctx.lineTo(x + cw, y + ch); }
    }
    ctx.stroke();
  }
  function allowedPatches(b) { // the patches query t may attend to in block b, or null (all)
    if (isPool() || b < 0 || !maskRows[b] || state.query.index < P) return null;
    return maskRows[b].subarray(state.query.index * N + P, state.query.index * N + N);
  }
  function placeQuery(square) { // a small map's query square, in percent of the map
    square.hidden = isPool() || state.query.index < P;
    if (square.hidden) return;
    const p = state.query.index - P;
    Object.assign(square.style, { left: `${(100 * (p % GW)) / GW}%`, top: `${(100 * Math.floor(p / GW)) / GH}%`,
      width: `${100 / GW}%`, height: `${100 / GH}%` });
  }
  function markQuery(ctx, size) {
    if (isPool() || state.query.index < P) return;
    const p = state.query.index - P, cw = size / GW, ch = size / GH;
    ctx.strokeStyle = "#7cfc00"; // the query: green; the allowed neighbourhood: cyan
    ctx.lineWidth = Math.max(1.5, size / 60);
    ctx.strokeRect((p % GW) * cw + 1, Math.floor(p / GW) * ch + 1, cw - 2, ch - 2);
  }

  // Statistics of one row: entropy (nats) over every key, mean distance (pixels) from the query patch to the
  // patch keys given that it attends to a patch, and the share on prefix tokens.
  const centres = Array.from({ length: NP }, (_, p) => [Math.floor(p / GW) * PH + PH / 2, (p % GW) * PW + PW / 2]);
  function stats(full) {
    let entropy = 0, total = 0, prefix = 0;
    for (const v of full) total += v;
    for (const v of full) if (v > 0) entropy -= (v / total) * Math.log(v / total);
    const offset = full.length - NP;
    for (let j = 0; j < offset; j++) prefix += full[j];
    let distance = null;
    const t = state.query.index - P;
    if (!isPool() && t >= 0) {
      let mass = 0, sum = 0;
      const [y, x] = centres[t];
      for (let j = 0; j < NP; j++) {
        const w = full[offset + j];
        mass += w;
        sum += w * Math.hypot(centres[j][0] - y, centres[j][1] - x);
      }
      distance = mass > 0 ? sum / mass : 0;
    }
    return { entropy, distance, prefix: total > 0 ? prefix / total : 0 };
  }
