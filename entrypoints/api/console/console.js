// dpr console, part 2 (after api.js): the page over the public JSON API (/v1/status, /v1/search,
// /v1/documents, /v1/jobs, /v1/eval/report). No framework, no build step. Every piece of data goes into the page
// as text nodes (never innerHTML), so a passage or a document id cannot inject markup.
"use strict";

const MODES = { dense: "dense", sparse: "sparse (BM25)", hybrid: "hybrid" };
const STOPWORDS = new Set(("a about an and are as at be but by can do does for from has have how i if in into is it " +
  "its not of on or so than that the their then there this to was what when where which who why with you your my " +
  "me we").split(" "));
const POLL_MS = 500;
const state = { status: null };

// --- tabs -------------------------------------------------------------------------------------------------------

function showTab() {
  const name = (location.hash || "#search").slice(1);
  const offered = [...document.querySelectorAll(".tabs a")].filter((a) => !a.hidden).map((a) => a.dataset.tab);
  const tab = offered.includes(name) ? name : "search";  // a tab this key may not use is not offered
  for (const section of document.querySelectorAll(".tab")) section.hidden = section.id !== `tab-${tab}`;
  for (const link of document.querySelectorAll(".tabs a")) link.classList.toggle("active", link.dataset.tab === tab);
  if (tab === "eval") loadReport();
}

// --- the collection panel ---------------------------------------------------------------------------------------

function describeServing(s) {
  // the mode a search without one gets, and why (`serving` in /v1/status: tuned, label-free default, dense-only)
  const serving = s.serving || {};
  const fusion = serving.fusion || {};
  const name = serving.mode !== "hybrid" ? "-" : fusion.fusion === "linear"
    ? `linear, dense weight ${fusion.linear_weight}` : `rrf k=${fusion.rrf_k ?? 60}`;
  return [name, serving.reason || ""];
}

function renderStatus(s) {
  const fields = $("status-fields");
  fields.replaceChildren();
  const add = (label, value, note, cls) => fields.append(el("dt", { text: label }),
    el("dd", { class: cls }, value, note ? el("small", { text: note }) : null));
  add("alias", s.collection, s.backend === "edge" ? "embedded engine" : "Qdrant server");
  if (!s.exists) {
    setMessage($("status-message"), "No collection yet: ingest something (Ingest tab).");
    add("model", s.configured_model.name, s.configured_model.fingerprint, "mono");
    return;
  }
  setMessage($("status-message"), "");
  add("generation", s.generation, null, "mono");
  add("points", fmt(s.points));
  add("model", s.model_name || "(unknown name)", `fingerprint ${s.model}`);
  if (!s.model_matches) {
    add("configured", s.configured_model.name, `${s.configured_model.fingerprint}: differs, run \`dpr reembed\``,
      "error");
  }
  add("vectors", `dense ${s.dim}-dim${s.sparse ? " + BM25" : ""}`);
  const [fusion, why] = describeServing(s);
  add("default mode", s.default_mode || "dense", why);
  add("hybrid fusion", fusion);
  if (s.memory) add("memory", s.memory.choice, s.memory.reason);  // the memory budget's choice and why
  const rollback = s.rollback;
  add("rollback to", rollback ? rollback.generation : "none kept",
    rollback ? `${fmt(rollback.points)} points, model ${rollback.model}` : "`dpr rollback` has no target", "mono");
  if ("queue_depth" in s) add("queue depth", fmt(s.queue_depth));
  if (s.feedback) {  // judgements given with the buttons on each hit (docs/feedback.md)
    add("feedback", `${fmt(s.feedback.judgements)} judgements`,
      `${fmt(s.feedback.relevant)} relevant, ${fmt(s.feedback.questions)} questions`);
  }
}

function renderModes(s) {
  const sparse = !s || s.sparse !== false;
  const fill = (select, first) => {
    const previous = select.value;
    select.replaceChildren(first);
    for (const [value, label] of Object.entries(MODES)) {
      select.append(el("option", { value, disabled: !sparse && value !== "dense" }, label));
    }
    if ([...select.options].some((o) => o.value === previous && !o.disabled)) select.value = previous;
  };
  const tuned = (s && s.default_mode) || "dense";
  fill($("mode"), el("option", { value: "" }, `default (${tuned})`));
  fill($("compare"), el("option", { value: "" }, "nothing"));
}

async function loadStatus() {
  try {
    state.status = await apiJson("/v1/status");
    renderStatus(state.status);
  } catch (e) {
    setMessage($("status-message"), `status: ${e.message}`, true);
  }
  renderModes(state.status);
}

// --- search -----------------------------------------------------------------------------------------------------

function parseFilters(text) {
  // "key=value, key=value" as `dpr query --filter`: a JSON value (number, true/false) or a string; a key given
  // twice means any of its values.
  const filters = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const at = part.indexOf("=");
    if (at < 1) throw new Error(`filter "${part}" is not key=value; e.g. lang=en`);
    const key = part.slice(0, at).trim();
    const raw = part.slice(at + 1).trim();
    let value = raw;
    try { value = JSON.parse(raw); } catch (e) { value = raw; }
    if (key in filters) filters[key] = [].concat(filters[key], value);
    else filters[key] = value;
  }
  return filters;
}

function questionTerms(question) {
  const words = question.toLowerCase().match(/[\p{L}\p{N}]+/gu) || [];
  return [...new Set(words.filter((w) => w.length > 1 && !STOPWORDS.has(w)))];
}

function highlighted(text, terms) {
  // Text nodes and <mark>s: a word is marked when it is a term of the question, or starts with one of 4+ letters
  // ("read" marks "reading"); the passage itself is never parsed as HTML.
  const out = el("p", { class: "passage" });
  const parts = text.split(/([\p{L}\p{N}]+)/u);
  for (let i = 0; i < parts.length; i++) {
    const part = parts[i];
    if (!part) continue;
    const lower = part.toLowerCase();
    const hit = i % 2 === 1 && terms.some((t) => lower === t || (t.length >= 4 && lower.startsWith(t)));
    out.append(hit ? el("mark", {}, part) : document.createTextNode(part));
  }
  out.addEventListener("click", () => out.classList.toggle("open"));
  return out;
}

function feedbackButtons(question, hit) {
  // "relevant / not relevant": POST /v1/feedback with the hit's document and chunk (a write key when keys are on).
  const note = el("span", { class: "feedback-note" });
  const buttons = [true, false].map((relevant) => {
    const button = el("button", { type: "button", class: "feedback-button", "data-relevant": String(relevant),
      text: relevant ? "relevant" : "not relevant" });
    button.addEventListener("click", async () => {
      try {
        const done = await apiJson("/v1/feedback", {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ question, doc_id: hit.doc_id, chunk: hit.chunk_index, relevant }),
        });
        buttons.forEach((b) => b.classList.toggle("chosen", b === button));
        setMessage(note, done.outcome === "unchanged" ? "already judged" : "saved");
        loadStatus();  // the collection panel's count of judgements
      } catch (e) {
        setMessage(note, e.message, true);
      }
    });
    return button;
  });
  return el("span", { class: "feedback" }, buttons, note);
}

function hitCard(hit, rank, terms, other, question) {
  const only = other && !other.ranks.has(hit.doc_id);
  const badge = !other ? null : only
    ? el("span", { class: "badge only", text: `not in ${other.label}` })
    : el("span", { class: "badge", text: `#${other.ranks.get(hit.doc_id)} in ${other.label}` });
  return el("article", { class: `hit${only ? " only" : ""}`, "data-doc": hit.doc_id },
    el("div", { class: "hit-head" },
      el("span", { class: "rank", text: `#${rank}` }),
      el("span", { class: "doc mono", text: hit.doc_id }),
      hit.place ? el("span", { class: "place", text: hit.place }) : null,  // manual.pdf p. 112 / guide.docx › Setup
      hit.title ? el("span", { class: "title", text: hit.title }) : null,
      el("span", { class: "chunk", text: `chunk ${hit.chunk_index}` }),
      el("span", { class: "score", text: `score ${hit.score.toFixed(4)}` }),
      badge,
      question ? feedbackButtons(question, hit) : null),
    highlighted(hit.text, terms));
}

function firstRanks(hits) {
  const ranks = new Map();
  hits.forEach((h, i) => { if (!ranks.has(h.doc_id)) ranks.set(h.doc_id, i + 1); });
  return ranks;
}

function modeLabel(mode) {
  const tuned = (state.status && state.status.default_mode) || "dense";
  return mode ? MODES[mode] : `default (${tuned})`;
}

function renderResults(question, runs) {
  const terms = questionTerms(question);
  const results = $("results");
  results.replaceChildren();
  results.classList.toggle("compare", runs.length === 2);
  const ranks = runs.map((run) => firstRanks(run.body.hits));
  if (runs.length === 2) {
    const [a, b] = ranks;
    const shared = [...a.keys()].filter((d) => b.has(d)).length;
    const union = new Set([...a.keys(), ...b.keys()]).size;
    const top = runs[0].body.hits[0] && runs[1].body.hits[0]
      && runs[0].body.hits[0].doc_id === runs[1].body.hits[0].doc_id;
    results.append(el("div", { class: "summary", id: "compare-summary" },
      `${shared} of ${union} documents in both lists; ${union - shared} only in one (marked). `,
      `Top hit ${top ? "the same" : "differs"}.`));
  }
  runs.forEach((run, i) => {
    const other = runs.length === 2 ? { ranks: ranks[1 - i], label: modeLabel(runs[1 - i].mode) } : null;
    const column = el("div", { class: "column", "data-mode": run.mode || "default" },
      el("h3", { text: `${modeLabel(run.mode)} · ${run.body.hits.length} hits · ${fmt(run.body.took_ms, 1)} ms` }));
    run.body.hits.forEach((hit, rank) => column.append(hitCard(hit, rank + 1, terms, other, question)));
    if (!run.body.hits.length) column.append(el("p", { class: "muted", text: "No passages match." }));
    results.append(column);
  });
}

async function search(event) {
  if (event) event.preventDefault();
  const question = $("question").value.trim();
  if (!question) return;
  const message = $("search-message");
  let filters;
  try { filters = parseFilters($("filters").value); } catch (e) { setMessage(message, e.message, true); return; }
  const k = Number($("k").value) || 10;
  const modes = [$("mode").value || null];
  if ($("compare").value) modes.push($("compare").value);
  setMessage(message, "searching…");
  try {
    const runs = await Promise.all(modes.map(async (mode) => {
      const body = { question, k, filters, ...(mode ? { mode } : {}) };
      const answer = await apiJson("/v1/search", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
      return { mode, body: answer };
    }));
    setMessage(message, "");
    renderResults(question, runs);
  } catch (e) {
    setMessage(message, e.message, true);
  }
}

// --- ingest -----------------------------------------------------------------------------------------------------

function jobCard(file) {
  const card = el("article", { class: "job" },
    el("div", { class: "job-head" },
      el("strong", { text: file.name }),
      el("span", { class: "state", text: "uploading" }),
      el("span", { class: "mono muted job-id" })),
    el("div", { class: "bar" }, el("div")),
    el("div", { class: "counters" }),
    el("ul", { class: "failures" }));
  $("jobs").prepend(card);
  return card;
}

function renderJob(card, job, rate) {
  const stateNode = card.querySelector(".state");
  stateNode.textContent = job.state;
  stateNode.className = `state ${job.state}`;
  card.dataset.state = job.state;
  card.querySelector(".job-id").textContent = `job ${job.job}`;
  const total = job.batches_total || 0;
  const done = job.state === "done" ? 1 : total ? (job.batches_done || 0) / total : 0;
  card.querySelector(".bar > div").style.width = `${Math.round(done * 100)}%`;
  const documents = job.documents_total ? `${fmt(job.documents)} / ${fmt(job.documents_total)}` : fmt(job.documents);
  const counters = [["documents", documents], ["passages", fmt(job.chunks)], ["passages/s", fmt(rate, 1)],
    ["unchanged", fmt(job.unchanged)], ["failed", fmt(job.failed_total ?? (job.failed || []).length)],
    ["batches", `${fmt(job.batches_done)} / ${fmt(total)}`]];
  card.querySelector(".counters").replaceChildren(
    ...counters.map(([label, value]) => el("span", { "data-counter": label }, `${label} `, el("b", {}, value))));
  const failures = [...(job.failed || []), ...(job.errors || []).map((e) => ({ error: String(e) }))];
  card.querySelector(".failures").replaceChildren(...failures.map((f) => el("li", {},
    f.reason ? el("code", { text: f.reason }) : null, f.reason ? " " : null, f.error || f.source || "")));
}

async function followJob(card, accepted) {
  // passages/s from successive polls (the change in stored passages over the change in time); once the job ends,
  // the average over the whole job as this page saw it.
  const started = performance.now();
  let last = { t: started, chunks: 0 };
  let rate = null;
  let misses = 0;
  for (;;) {
    let job;
    try {
      job = await apiJson(`/v1/jobs/${encodeURIComponent(accepted.job)}`);
      misses = 0;
    } catch (e) {
      // the store or broker busy for a moment (503), or the connection dropped: the job goes on, so ask again
      if ((e.status && e.status !== 503) || ++misses > 20) throw e;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS * 2));
      continue;
    }
    const now = performance.now();
    const finished = job.state === "done" || job.state === "failed";
    if (finished) rate = job.chunks / Math.max((now - started) / 1000, job.seconds || 0.001);
    else if (now > last.t && job.chunks !== last.chunks) rate = (job.chunks - last.chunks) / ((now - last.t) / 1000);
    last = { t: now, chunks: job.chunks };
    renderJob(card, job, rate);
    if (finished) return job;
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

async function upload(file) {
  const card = jobCard(file);
  const form = new FormData();
  form.append("file", file, file.name);
  try {
    const accepted = await apiJson("/v1/documents", { method: "POST", body: form });
    renderJob(card, accepted, null);
    await followJob(card, accepted);
    loadStatus();
  } catch (e) {
    const stateNode = card.querySelector(".state");
    stateNode.textContent = "failed";
    stateNode.className = "state failed";
    card.dataset.state = "failed";
    card.querySelector(".failures").replaceChildren(el("li", { text: e.message }));
  }
}

function setUpDropzone() {
  const zone = $("dropzone");
  const take = (files) => { for (const file of files) upload(file); };
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); take(e.dataTransfer.files); });
  $("file-input").addEventListener("change", (e) => { take(e.target.files); e.target.value = ""; });
}

// --- the evaluation report --------------------------------------------------------------------------------------

function metricsTable(report) {
  const systems = Object.entries(report.systems || {});
  const names = [...new Set(systems.flatMap(([, s]) => Object.keys(s.metrics || {})))];
  const best = Object.fromEntries(names.map((n) => [n, Math.max(...systems.map(([, s]) => s.metrics[n] ?? -1))]));
  return el("table", { class: "metrics" },
    el("thead", {}, el("tr", {}, el("th", { text: "system" }), names.map((n) => el("th", { text: n })),
      el("th", { text: "seconds" }))),
    el("tbody", {}, systems.map(([system, s]) => el("tr", {}, el("td", { text: system }),
      names.map((n) => el("td", { class: s.metrics[n] === best[n] ? "best" : null,
        text: typeof s.metrics[n] === "number" ? s.metrics[n].toFixed(3) : "–" })),
      el("td", { text: fmt(s.seconds, 1) })))));
}

async function plotFigure(plot) {
  // Fetched with the key like any data route, then shown from a blob: URL (an <img src> could not send the key).
  const response = await api(plot.url);
  if (!response.ok) return el("figure", {}, el("figcaption", { class: "error", text: `${plot.label}: HTTP ${response.status}` }));
  const url = URL.createObjectURL(await response.blob());
  return el("figure", {}, el("img", { src: url, alt: plot.label }), el("figcaption", { text: plot.label }));
}

async function loadReport() {
  const body = $("eval-body");
  const message = $("eval-message");
  setMessage(message, "loading…");
  try {
    const report = await apiJson("/v1/eval/report");
    setMessage(message, `${report.dataset}: ${fmt(report.queries)} queries, ${fmt(report.documents)} documents; ` +
      `written ${report.written_at || "?"} from ${report.source || "?"}`);
    const plots = await Promise.all((report.plots || []).map(plotFigure));
    body.replaceChildren(metricsTable(report),
      (report.notes || []).length ? el("ul", {}, report.notes.map((n) => el("li", { text: n }))) : null,
      el("div", { class: "plots" }, plots));
  } catch (e) {
    body.replaceChildren();
    setMessage(message, e.message, e.status !== 404);
  }
}

// --- start ------------------------------------------------------------------------------------------------------

function start() {
  renderModes(null);
  showKeyState();
  loadWhoami();  // hide what this key may not do
  $("search-form").addEventListener("submit", search);
  $("status-refresh").addEventListener("click", loadStatus);
  $("eval-refresh").addEventListener("click", loadReport);
  $("key-forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_NAME);
    localStorage.removeItem(KEY_NAME);
    showKeyState();
  });
  setUpDropzone();
  window.addEventListener("hashchange", showTab);
  showTab();
  loadStatus();
}

document.addEventListener("DOMContentLoaded", start);
