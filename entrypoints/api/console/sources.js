// dpr console, part 3 (after api.js and console.js): the Sources tab over GET /v1/sources, GET /v1/sources/{name}
// and POST /v1/sources/{name}/sync (docs/sources.md): each source's last sync, outcome, counts and next run, and a
// button to sync it now (shown to keys that may write; the server refuses the others anyway). Text nodes only.
"use strict";

const SOURCE_POLL_MS = 1000;
const COUNTS = ["added", "changed", "removed", "failed"];

function when(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

function outcomeOf(source) {
  if (source.running) return "running";
  return (source.last && source.last.outcome) || "never synced";
}

function sourceRow(source) {
  const last = source.last || {};
  const outcome = outcomeOf(source);
  const button = el("button", { type: "button", class: "link", "data-needs": "write", "data-source": source.name },
    "sync now");
  button.hidden = !(document.body.dataset.may || "write").split(" ").includes("write");
  button.disabled = source.running;
  button.addEventListener("click", () => syncNow(source.name, button));
  const counts = last.outcome ? COUNTS.map((k) => `${fmt(last[k] || 0)} ${k}`).join(", ") : "–";
  return el("tr", { "data-source": source.name },
    el("td", {}, el("strong", {}, source.name)),
    el("td", {}, source.kind),
    el("td", { class: "muted", title: source.uri }, source.uri),
    el("td", {}, when(last.finished)),
    el("td", { class: `outcome ${outcome.replace(/ /g, "-")}`, title: last.error || "" }, outcome),
    el("td", {}, counts),
    el("td", {}, source.next_run ? when(source.next_run) : "when asked"),
    el("td", {}, button));
}

function renderSources(sources) {
  const body = $("sources-body");
  body.replaceChildren();
  const message = $("sources-message");
  if (!sources.length) {
    setMessage(message, "No sources yet: add one with `dpr sources add NAME URI` or POST /v1/sources.");
    $("sources-table").hidden = true;
    return;
  }
  setMessage(message, "");
  $("sources-table").hidden = false;
  for (const source of sources) body.append(sourceRow(source));
}

async function loadSources() {
  try {
    renderSources((await apiJson("/v1/sources")).sources || []);
  } catch (e) {
    setMessage($("sources-message"), `sources: ${e.message}`, true);
  }
}

async function syncNow(name, button) {
  const message = $("sources-message");
  const path = `/v1/sources/${encodeURIComponent(name)}`;
  button.disabled = true;
  let said = "";
  let failed = false;
  try {
    const before = ((await apiJson(path)).last || {}).finished;
    await apiJson(`${path}/sync`, { method: "POST" });
    setMessage(message, `syncing ${name}…`);
    for (;;) {  // until the sync started here has ended (its record's end time moves)
      await new Promise((done) => setTimeout(done, SOURCE_POLL_MS));
      const source = await apiJson(path);
      if (!source.running && (source.last || {}).finished && source.last.finished !== before) {
        const last = source.last;
        said = `${name}: ${last.outcome}` + (last.error ? ` (${last.error})` : "");
        failed = last.outcome !== "ok";
        break;
      }
    }
  } catch (e) {
    said = `${name}: ${e.message}`;
    failed = true;
  }
  await loadSources();
  setMessage(message, said, failed);
  if (typeof loadStatus === "function") loadStatus();
}

function setUpSources() {
  $("sources-refresh").addEventListener("click", loadSources);
  window.addEventListener("hashchange", () => { if (location.hash === "#sources") loadSources(); });
  if (location.hash === "#sources") loadSources();
}

document.addEventListener("DOMContentLoaded", setUpSources);
