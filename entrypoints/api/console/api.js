// dpr console, part 1: DOM helpers, the API key and the one fetch wrapper every call goes through (console.js
// builds the page on top). Loaded before console.js; plain scripts sharing one global scope, no build step.
"use strict";

const KEY_NAME = "dpr-api-key";
let keyPrompt = null; // the open key dialog, shared by every request that got a 401 meanwhile

// --- small DOM helpers --------------------------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setMessage(node, text, isError) {
  node.textContent = text || "";
  node.classList.toggle("error", Boolean(isError));
}

const fmt = (n, digits) => (typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: digits ?? 0 }) : "–");

// --- the API key and the one fetch wrapper --------------------------------------------------------------------------

function storedKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME);
}

function showKeyState() {
  const key = storedKey();
  $("key-state").textContent = key ? "API key set" : "";
  $("key-forget").hidden = !key;
}

function askForKey(refused) {
  // One dialog for every request that got a 401 meanwhile; they all retry with the key it returns.
  if (keyPrompt) return keyPrompt;
  keyPrompt = new Promise((resolve) => {
    const dialog = $("key-dialog");
    $("key-reason").textContent = refused
      ? "The server refused that key. Enter the key it was started with (DPR_API__API_KEY)."
      : "This server asks for an API key (DPR_API__API_KEY). It is sent as the X-API-Key header.";
    $("key-input").value = "";
    const submit = (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      sessionStorage.removeItem(KEY_NAME);
      localStorage.removeItem(KEY_NAME);
      ($("key-remember").checked ? localStorage : sessionStorage).setItem(KEY_NAME, key);
      $("key-form").removeEventListener("submit", submit);
      dialog.close();
      keyPrompt = null;
      showKeyState();
      resolve(key);
      loadWhoami();  // another key may have another role
    };
    $("key-form").addEventListener("submit", submit);
    dialog.addEventListener("cancel", (event) => event.preventDefault(), { once: true });
    dialog.showModal();
    $("key-input").focus();
  });
  return keyPrompt;
}

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.type = error.type || "http_error";
  }
}

async function api(path, options) {
  // The same request again after a 401, with the key the user typed (asked once, kept for the session).
  for (;;) {
    const headers = new Headers((options && options.headers) || {});
    const key = storedKey();
    if (key) headers.set("X-API-Key", key);
    const response = await fetch(path, { ...options, headers });
    if (response.status === 401) {
      // sent with a key the user has replaced meanwhile (requests in flight when the dialog closed): retry with the
      // new one; asking again would reopen the dialog as "refused" after the right key was given
      if (storedKey() === key) await askForKey(Boolean(key));
      continue;
    }
    return response;
  }
}

async function apiJson(path, options) {
  const response = await api(path, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

// --- what this key may do -------------------------------------------------------------------------------------------

// GET /v1/whoami says the key's role and what it may do here; elements marked data-needs="write" (or "admin") are
// hidden when it may not, and so are the hit's feedback buttons (CSS on body[data-may]). The server enforces the
// roles anyway (403): this only keeps the page from offering what would be refused.
async function loadWhoami() {
  let may = { read: true, write: true, admin: true };
  try {
    const who = await apiJson("/v1/whoami");
    may = who.may || may;
    const key = who.key || {};
    $("key-role").textContent = who.locked ? `${key.name || key.id} (${key.role})` : "";
  } catch (e) {
    // an older server without /v1/whoami: offer everything and let the server refuse
  }
  document.body.dataset.may = Object.keys(may).filter((role) => may[role]).join(" ");
  for (const node of document.querySelectorAll("[data-needs]")) node.hidden = !may[node.dataset.needs];
  if (typeof showTab === "function") showTab();
}
