// flow ui: the page's only script (no build step, no third-party code).
// Elements with data-sse follow a stream of "html" events ({id, html}: replace that
// element's content) until "end"; #log follows the task's log lines.
"use strict";

const MAX_LINES = 5000;  // lines kept in the log view; older ones are dropped

function followHtml(el) {
  const source = new EventSource(el.dataset.sse);
  source.addEventListener("html", (event) => {
    const update = JSON.parse(event.data);
    const target = document.getElementById(update.id);
    if (target) target.innerHTML = update.html;
  });
  source.addEventListener("end", () => {
    source.close();
    for (const id of ["cancel", "stacks-form"]) {
      const gone = document.getElementById(id);
      if (gone) gone.remove();
    }
  });
}

function logView(log) {
  const node = document.getElementById("log-node");
  const rank = document.getElementById("log-rank");
  const search = document.getElementById("log-search");
  const count = document.getElementById("log-count");
  let source = null;
  let pending = [];     // lines received, not yet drawn: drawn once per frame
  let scheduled = false;
  let following = true;  // at the bottom: new lines scroll into view
  log.addEventListener("scroll", () => {
    following = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  });

  function render() {
    scheduled = false;
    const lines = pending;
    pending = [];
    const batch = document.createDocumentFragment();
    for (const [n, r, kind, line] of lines) {
      const div = document.createElement("div");
      div.className = `line k-${kind}`;
      div.dataset.node = n === null ? "" : n;
      div.dataset.rank = r === null ? "" : r;
      div.textContent = line;
      if (!matches(div)) div.classList.add("hidden");
      batch.appendChild(div);
    }
    log.appendChild(batch);
    let extra = log.childElementCount - MAX_LINES;
    while (extra-- > 0) log.firstElementChild.remove();
    if (following) log.scrollTop = log.scrollHeight;
    showCount();
  }

  const matches = (div) => !search.value || div.textContent.includes(search.value);
  const showCount = () => {
    count.textContent = search.value
      ? `${log.querySelectorAll("div.line:not(.hidden)").length} matching line(s)`
      : `${log.childElementCount} line(s)`;
  };

  function connect() {
    if (source) source.close();
    log.replaceChildren();  // "waiting for lines" (data-empty) shows until lines come
    pending = [];
    const query = new URLSearchParams();
    if (node.value !== "") query.set("node", node.value);
    if (rank.value !== "") query.set("rank", rank.value);
    source = new EventSource(`${log.dataset.logs}?${query}`);
    source.addEventListener("lines", (event) => {
      for (const entry of JSON.parse(event.data)) pending.push(entry);
      if (!scheduled) { scheduled = true; requestAnimationFrame(render); }
    });
    source.addEventListener("end", () => {
      source.close();
      log.dataset.ended = "1";
      log.dataset.empty = "no lines";  // shown while the view holds none
    });
  }

  node.addEventListener("change", connect);
  rank.addEventListener("change", connect);
  search.addEventListener("input", () => {
    for (const div of log.children) div.classList.toggle("hidden", !matches(div));
    showCount();
  });
  connect();
}

document.addEventListener("DOMContentLoaded", () => {
  for (const el of document.querySelectorAll("[data-sse]")) followHtml(el);
  const log = document.getElementById("log");
  if (log) logView(log);
});
