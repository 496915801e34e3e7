// svc console: a small client of the REST API, no framework and no build step.
//
// Rules this file keeps (docs/console.md):
// - the API key lives in sessionStorage only and travels only as `Authorization: Bearer`;
//   never in a URL, a cookie or local storage;
// - every piece of server text reaches the page through textContent or an attribute set
//   with setAttribute on an element we made: never innerHTML, so labels, payloads and audit
//   details that carry markup show as text;
// - the live tail, once opened, keeps running while you look at other pages, until you
//   sign out or change its filters;
// - the role decides which buttons exist, but the server decides what is allowed: a 403 is
//   shown like any other error.
"use strict";

(function () {
  const KEY_NAME = "svc.apiKey";
  const ROLES = { readonly: 1, operator: 2, admin: 3 };
  const TAIL_ROWS = 500;
  const PAGES = ["fleet", "jobs", "events", "audit", "secrets", "health"];

  const state = {
    who: null,
    timer: null,
    tail: null, // { controller, lastSeq, received, gaps, filtered }
    historyCursors: [""],
    auditCursors: [""],
    job: null, // { id, after } of the job whose results are shown
    fleet: { shown: 0, cursor: "" }, // how many agents the fleet page holds, and what comes next
  };

  const $ = (id) => document.getElementById(id);

  // ---- small DOM helpers (text only) ----
  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell === undefined || cell === null ? "" : String(cell);
      tr.appendChild(td);
    }
    return tr;
  }

  function replaceRows(table, rows) {
    const body = $(table).tBodies[0];
    body.replaceChildren(...rows);
  }

  function showMessage(text, kind) {
    const box = $("message");
    box.textContent = text || "";
    box.className = "message " + (kind || "error");
    box.hidden = !text;
  }

  // ---- the API ----
  function key() {
    return sessionStorage.getItem(KEY_NAME);
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, options) {
    const opts = options || {};
    const headers = new Headers(opts.headers || {});
    headers.set("Authorization", "Bearer " + key());
    if (opts.body !== undefined) headers.set("Content-Type", "application/json");
    const response = await fetch(path, {
      method: opts.method || "GET",
      headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      cache: "no-store",
      credentials: "omit",
      signal: opts.signal,
    });
    if (!response.ok) {
      let code = "error";
      let message = response.status + " " + response.statusText;
      try {
        const body = await response.json();
        code = body.error.code;
        message = response.status + " " + body.error.message;
      } catch (_) {
        // not our JSON error; keep the status line
      }
      if (response.status === 401) signOut("Signed out: " + message);
      throw new ApiError(response.status, code, message);
    }
    return opts.raw ? response : response.json();
  }

  function query(params) {
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(params)) {
      if (value !== "" && value !== undefined && value !== null && value !== false) {
        search.set(name, String(value));
      }
    }
    const text = search.toString();
    return text ? "?" + text : "";
  }

  function mayOperate() {
    return state.who && ROLES[state.who.role] >= ROLES.operator;
  }

  function isAdmin() {
    return state.who && state.who.role === "admin";
  }

  // ---- sign-in ----
  async function signIn(candidate) {
    sessionStorage.setItem(KEY_NAME, candidate);
    try {
      state.who = await api("/api/v1/whoami");
    } catch (error) {
      sessionStorage.removeItem(KEY_NAME);
      state.who = null;
      showMessage("Sign-in failed: " + error.message);
      return;
    }
    showMessage("");
    $("who").textContent = state.who.name + " (" + state.who.role + ")";
    document.body.dataset.role = state.who.role;
    $("nav").hidden = false;
    $("sign-out").hidden = false;
    for (const node of document.querySelectorAll(".admin-only")) node.hidden = !isAdmin();
    if (!PAGES.includes(location.hash.slice(1))) location.hash = "#fleet";
    else route();
  }

  function signOut(reason) {
    sessionStorage.removeItem(KEY_NAME);
    state.who = null;
    stopTail();
    clearInterval(state.timer);
    state.timer = null;
    $("who").textContent = "";
    delete document.body.dataset.role;
    $("nav").hidden = true;
    $("sign-out").hidden = true;
    $("signin-key").value = "";
    for (const table of document.querySelectorAll("tbody")) table.replaceChildren();
    showPage("signin");
    showMessage(reason || "", "info");
  }

  // ---- pages ----
  function showPage(name) {
    for (const section of document.querySelectorAll(".page")) {
      section.hidden = section.id !== "page-" + name;
    }
    for (const link of document.querySelectorAll("#nav a")) {
      link.classList.toggle("current", link.dataset.page === name);
    }
  }

  function route() {
    if (!state.who) {
      showPage("signin");
      return;
    }
    const page = PAGES.includes(location.hash.slice(1)) ? location.hash.slice(1) : "fleet";
    showPage(page);
    showMessage("");
    clearInterval(state.timer);
    state.timer = null;
    const loaders = { fleet: loadFleet, jobs: loadJobs, events: openEvents, audit: loadAudit, secrets: loadSecrets, health: loadHealth };
    const refresh = { fleet: 2000, jobs: 5000, health: 10000 };
    const run = () => loaders[page]().catch((error) => showMessage(error.message));
    run();
    if (refresh[page]) state.timer = setInterval(run, refresh[page]);
  }

  // ---- fleet ----
  function labelChips(labels) {
    const span = el("span", null, "labels");
    for (const [name, value] of Object.entries(labels || {})) {
      span.appendChild(el("span", name + "=" + value, "label"));
    }
    return span;
  }

  function quarantineButton(agent) {
    const button = el("button", agent.quarantined ? "Unquarantine" : "Quarantine", "action");
    button.type = "button";
    button.dataset.agent = agent.id;
    button.dataset.action = agent.quarantined ? "unquarantine" : "quarantine";
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const path = "/api/v1/agents/" + encodeURIComponent(agent.id) + "/" + button.dataset.action;
        const body = button.dataset.action === "quarantine" ? { reason: "from the console" } : undefined;
        await api(path, { method: "POST", body });
        showMessage(agent.id + ": " + button.dataset.action + " done", "info");
        await loadFleet();
      } catch (error) {
        showMessage(error.message);
        button.disabled = false;
      }
    });
    return button;
  }

  function setCell(td, content) {
    if (content instanceof Node) td.replaceChildren(content);
    else td.textContent = content === undefined || content === null ? "" : String(content);
  }

  // The fleet page holds a page of agents at first and more on "Load more"; the 2 s refresh
  // reads as many as it holds (FLEET_PAGE at a time up to the server's 5000), never the
  // whole fleet.
  const FLEET_PAGE = 200;
  const FLEET_MAX_LIMIT = 5000;

  function fleetFilters() {
    return { target: $("fleet-target").value.trim(), state: $("fleet-state").value };
  }

  function fleetRow(agent, existing) {
    let tr = existing.get(agent.id);
    if (!tr) {
      tr = document.createElement("tr");
      tr.dataset.agent = agent.id;
      for (let index = 0; index < 7; index += 1) tr.appendChild(document.createElement("td"));
    }
    const cells = tr.cells;
    setCell(cells[0], agent.id);
    setCell(cells[1], el("span", agent.state, "state state-" + agent.state));
    setCell(cells[2], labelChips(agent.labels));
    setCell(cells[3], agent.last_heartbeat_at || "never");
    setCell(cells[4], agent.version);
    setCell(cells[5], agent.hostname);
    const wanted = mayOperate() ? (agent.quarantined ? "unquarantine" : "quarantine") : "";
    const current = cells[6].querySelector("button");
    if (!wanted) cells[6].replaceChildren();
    else if (!current || current.dataset.action !== wanted || current.disabled) {
      cells[6].replaceChildren(quarantineButton(agent));
    }
    return tr;
  }

  function showFleetCount(shown) {
    const more = state.fleet.cursor ? ", more to load" : "";
    $("fleet-count").textContent = shown + " agent(s)" + more;
    $("fleet-more").hidden = !state.fleet.cursor;
    $("fleet-table").classList.toggle("no-actions", !mayOperate());
  }

  // Rows are updated in place (every 2 s), so a button being clicked is never swapped for a
  // copy under the pointer; one is replaced only when its action changes.
  async function loadFleet() {
    const wanted = Math.max(state.fleet.shown, FLEET_PAGE);
    const agents = [];
    let cursor = "";
    do {
      const limit = Math.min(wanted - agents.length, FLEET_MAX_LIMIT);
      const page = await api("/api/v1/agents" + query({ ...fleetFilters(), limit, cursor }));
      agents.push(...page.agents);
      cursor = page.next_cursor || "";
    } while (cursor && agents.length < wanted);
    const body = $("fleet-table").tBodies[0];
    const existing = new Map([...body.rows].map((tr) => [tr.dataset.agent, tr]));
    body.replaceChildren(...agents.map((agent) => fleetRow(agent, existing)));
    state.fleet.shown = agents.length;
    state.fleet.cursor = cursor;
    showFleetCount(agents.length);
    document.body.dataset.fleetLoaded = String(agents.length);
  }

  async function loadMoreFleet() {
    if (!state.fleet.cursor) return;
    const page = await api("/api/v1/agents" + query({ ...fleetFilters(), limit: FLEET_PAGE, cursor: state.fleet.cursor }));
    const body = $("fleet-table").tBodies[0];
    body.append(...page.agents.map((agent) => fleetRow(agent, new Map())));
    state.fleet.shown = body.rows.length;
    state.fleet.cursor = page.next_cursor || "";
    showFleetCount(body.rows.length);
    document.body.dataset.fleetLoaded = String(body.rows.length);
  }

  // ---- events ----
  function eventFilters() {
    return {
      type: $("events-type").value.trim(),
      category: $("events-category").value,
      severity: $("events-severity").value,
      source: $("events-source").value.trim(),
    };
  }

  function eventRow(event) {
    const tr = row([
      event.seq,
      event.timestamp,
      event.type,
      el("span", event.severity, "sev sev-" + event.severity),
      event.source,
      el("code", JSON.stringify(event.payload)),
    ]);
    tr.dataset.seq = event.seq;
    tr.dataset.type = event.type;
    return tr;
  }

  async function loadHistory() {
    const cursor = state.historyCursors[state.historyCursors.length - 1];
    const filters = Object.assign(eventFilters(), { since: $("events-since").value.trim(), limit: 50, cursor });
    const page = await api("/api/v1/events" + query(filters));
    replaceRows("history-table", page.items.map(eventRow));
    $("history-next").disabled = !page.next_cursor;
    $("history-next").dataset.cursor = page.next_cursor || "";
    $("history-page").textContent = "page " + state.historyCursors.length + ", " + page.items.length + " event(s)";
  }

  async function openEvents() {
    state.historyCursors = [""];
    await loadHistory();
    if (!state.tail) startTail();
  }

  function stopTail() {
    if (state.tail) {
      state.tail.stopped = true;
      state.tail.controller.abort();
      state.tail = null;
    }
    $("tail-status").textContent = "closed";
  }

  function tailStats() {
    const tail = state.tail;
    if (!tail) return;
    let text = "received " + tail.received + ", last seq " + (tail.lastSeq || "-");
    if (!tail.filtered) text += ", gaps " + tail.gaps;
    $("tail-stats").textContent = text;
    $("tail-stats").dataset.received = String(tail.received);
    $("tail-stats").dataset.gaps = String(tail.gaps);
    $("tail-stats").dataset.lastSeq = String(tail.lastSeq || 0);
  }

  function onTailEvent(event) {
    const tail = state.tail;
    if (tail.lastSeq && !tail.filtered && event.seq !== tail.lastSeq + 1) {
      tail.gaps += Math.max(0, event.seq - tail.lastSeq - 1);
    }
    tail.lastSeq = event.seq;
    tail.received += 1;
    tail.pending.push(event);
  }

  // Rows are added once per animation frame, so a fast stream costs one layout per frame.
  function flushTail() {
    const tail = state.tail;
    if (!tail) return;
    if (tail.pending.length) {
      const body = $("tail-table").tBodies[0];
      const rows = tail.pending.splice(0).slice(-TAIL_ROWS).map(eventRow).reverse();
      body.prepend(...rows);
      while (body.rows.length > TAIL_ROWS) body.deleteRow(body.rows.length - 1);
      tailStats();
    }
    requestAnimationFrame(flushTail);
  }

  // Server-sent events read with fetch(), because EventSource cannot send the key in a
  // header. A dropped stream reconnects with Last-Event-ID, so nothing is missed or repeated.
  function startTail() {
    const filters = eventFilters();
    const tail = {
      controller: new AbortController(),
      lastSeq: 0,
      received: 0,
      gaps: 0,
      filtered: Object.values(filters).some((v) => v),
      pending: [],
      stopped: false,
      delay: 500,
    };
    state.tail = tail;
    $("tail-table").tBodies[0].replaceChildren();
    tailStats();
    requestAnimationFrame(flushTail);
    connectTail(tail, filters);
  }

  async function connectTail(tail, filters) {
    while (!tail.stopped) {
      const headers = { Accept: "text/event-stream" };
      if (tail.lastSeq) headers["Last-Event-ID"] = String(tail.lastSeq);
      try {
        const response = await api("/api/v1/events/stream" + query(filters), {
          headers,
          raw: true,
          signal: tail.controller.signal,
        });
        $("tail-status").textContent = "live";
        tail.delay = 500;
        await readEvents(response.body, tail);
      } catch (error) {
        if (tail.stopped) return;
        if (error instanceof ApiError && error.status !== 429 && error.status < 500) {
          showMessage("Live tail: " + error.message);
          $("tail-status").textContent = "closed";
          return;
        }
      }
      if (tail.stopped) return;
      $("tail-status").textContent = "reconnecting";
      await new Promise((resolve) => setTimeout(resolve, tail.delay));
      tail.delay = Math.min(tail.delay * 2, 10000);
    }
  }

  async function readEvents(stream, tail) {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done || tail.stopped) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message";
        const data = [];
        for (const line of frame.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (!data.length) continue;
        const parsed = JSON.parse(data.join("\n"));
        if (name === "event") onTailEvent(parsed);
        else if (name === "error") showMessage("Live tail: " + parsed.error.message);
      }
    }
  }

  // ---- audit ----
  function auditFilters() {
    return {
      since: $("audit-since").value.trim(),
      until: $("audit-until").value.trim(),
      user: $("audit-user").value.trim(),
      action: $("audit-action").value.trim(),
      resource_type: $("audit-resource-type").value.trim(),
      outcome: $("audit-outcome").value,
      min_severity: $("audit-severity").value,
    };
  }

  async function loadAudit() {
    const cursor = state.auditCursors[state.auditCursors.length - 1];
    const page = await api("/api/v1/audit" + query(Object.assign(auditFilters(), { limit: 50, cursor })));
    replaceRows(
      "audit-table",
      page.items.map((entry) => {
        const tr = row([
          entry.timestamp,
          entry.user,
          entry.action,
          entry.resource_type + (entry.resource_id ? ":" + entry.resource_id : ""),
          el("span", entry.outcome, "outcome outcome-" + entry.outcome),
          entry.severity,
          el("code", JSON.stringify(entry.detail)),
        ]);
        tr.dataset.action = entry.action;
        return tr;
      })
    );
    $("audit-next").disabled = !page.next_cursor;
    $("audit-next").dataset.cursor = page.next_cursor || "";
    $("audit-page").textContent = "page " + state.auditCursors.length + ", " + page.items.length + " row(s)";
  }

  async function verifyAudit() {
    const badge = $("audit-verify-result");
    badge.textContent = "verifying…";
    try {
      const result = await api("/api/v1/audit/verify");
      badge.textContent = result.ok
        ? "chain intact: " + result.rows + " row(s)"
        : "BROKEN at " + result.first_bad + ": " + result.detail;
      badge.className = "badge " + (result.ok ? "ok" : "bad");
    } catch (error) {
      badge.textContent = "";
      showMessage(error.message);
    }
  }

  async function exportAudit(format) {
    try {
      const f = auditFilters();
      const response = await api("/api/v1/audit/export" + query({ format, since: f.since, until: f.until }), { raw: true });
      const blob = await response.blob();
      const link = document.createElement("a");
      link.href = URL.createObjectURL(blob);
      link.download = "audit." + format;
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(link.href), 10000);
    } catch (error) {
      showMessage(error.message);
    }
  }

  // ---- jobs ----
  function countsText(counts) {
    const parts = Object.entries(counts || {}).map(([status, n]) => n + " " + status.replace("_", " "));
    return parts.length ? parts.join(", ") : "-";
  }

  async function loadJobs() {
    const result = await api("/api/v1/jobs" + query({ limit: 50 }));
    replaceRows(
      "jobs-table",
      result.jobs.map((job) => {
        let id = job.id;
        if (mayOperate()) {
          id = el("button", job.id, "action");
          id.type = "button";
          id.addEventListener("click", () => openJob(job.id).catch((e) => showMessage(e.message)));
        }
        const status = el("span", job.status, "state state-" + job.status);
        return row([id, job.kind, status, job.agents, countsText(job.counts), job.created_at, job.created_by, job.description]);
      })
    );
  }

  // One agent's output, as text: the error, else stdout and stderr (exec), else the
  // resources that changed or failed (state).
  function resultText(result) {
    if (result.error) return result.error;
    if (result.outcomes) {
      return result.outcomes
        .filter((o) => o.changed || o.error)
        .map((o) => o.resource + ": " + (o.error || o.detail))
        .join("\n");
    }
    return [result.stdout, result.stderr].filter(Boolean).join("\n");
  }

  async function openJob(id, more) {
    if (!more) state.job = { id, after: "" };
    const page = await api("/api/v1/jobs/" + encodeURIComponent(id) + query({ after: state.job.after, limit: 100 }));
    const rows = page.results.map((r) => row([r.agent_id, r.status, r.exit_code === undefined ? "" : r.exit_code, el("pre", resultText(r))]));
    const body = $("job-results").tBodies[0];
    if (more) body.append(...rows);
    else body.replaceChildren(...rows);
    state.job.after = page.next_after || "";
    $("job-more").hidden = !page.next_after;
    $("job-id").textContent = page.job.id + " (" + page.job.kind + ", " + page.job.status + ")";
    $("job-count").textContent = countsText(page.job.counts) + " of " + page.job.agents + " agent(s)";
    $("job-detail").hidden = false;
  }

  // ---- secrets ----
  async function loadSecrets() {
    const result = await api(
      "/api/v1/secrets" + query({ prefix: $("secrets-prefix").value.trim(), include_deleted: $("secrets-deleted").checked })
    );
    replaceRows(
      "secrets-table",
      result.secrets.map((s) => row([s.path, s.version, s.created_at, s.updated_at, s.deleted_at || ""]))
    );
  }

  // ---- health ----
  function parseMetrics(text) {
    const sums = new Map();
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!match) continue;
      const name = match[1] + (match[1] === "svc_agents" || match[1] === "svc_bus_messages_total" ? match[2] || "" : "");
      sums.set(name, (sums.get(name) || 0) + Number(match[3]));
    }
    return sums;
  }

  function drawChart(timeline) {
    const ns = "http://www.w3.org/2000/svg";
    const width = 720;
    const height = 180;
    const pad = 30;
    const counts = timeline.counts;
    const max = Math.max(1, ...counts);
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.setAttribute("role", "img");
    svg.setAttribute("class", "chart-svg");
    const title = document.createElementNS(ns, "title");
    title.textContent = "events per minute since " + timeline.since;
    svg.appendChild(title);
    const step = (width - 2 * pad) / counts.length;
    counts.forEach((count, index) => {
      const bar = document.createElementNS(ns, "rect");
      const h = ((height - 2 * pad) * count) / max;
      bar.setAttribute("x", String(pad + index * step + 1));
      bar.setAttribute("y", String(height - pad - h));
      bar.setAttribute("width", String(Math.max(1, step - 2)));
      bar.setAttribute("height", String(h));
      bar.setAttribute("class", "bar");
      const tip = document.createElementNS(ns, "title");
      tip.textContent = count + " event(s), " + (counts.length - index - 1) + " min ago";
      bar.appendChild(tip);
      svg.appendChild(bar);
    });
    const axis = document.createElementNS(ns, "line");
    axis.setAttribute("x1", String(pad));
    axis.setAttribute("x2", String(width - pad));
    axis.setAttribute("y1", String(height - pad));
    axis.setAttribute("y2", String(height - pad));
    axis.setAttribute("class", "axis");
    svg.appendChild(axis);
    for (const [text, x, y, anchor] of [
      ["max " + max + "/min", pad, pad - 8, "start"],
      ["-60 min", pad, height - 8, "start"],
      ["now", width - pad, height - 8, "end"],
    ]) {
      const label = document.createElementNS(ns, "text");
      label.setAttribute("x", String(x));
      label.setAttribute("y", String(y));
      label.setAttribute("text-anchor", anchor);
      label.setAttribute("class", "chart-label");
      label.textContent = text;
      svg.appendChild(label);
    }
    $("chart").replaceChildren(svg);
  }

  async function loadHealth() {
    const ready = await fetch("/health/ready", { cache: "no-store", credentials: "omit" });
    const readiness = await ready.json();
    $("ready-badge").textContent = readiness.ready ? "ready" : "not ready";
    $("ready-badge").className = "badge " + (readiness.ready ? "ok" : "bad");
    replaceRows(
      "ready-table",
      Object.entries(readiness.components).map(([name, component]) =>
        row([name, el("span", component.status, "status-" + (component.status === "ok" ? "ok" : "bad")), component.detail || ""])
      )
    );
    const metrics = parseMetrics(await (await fetch("/metrics", { cache: "no-store", credentials: "omit" })).text());
    const wanted = [
      ["Uptime (s)", "svc_uptime_seconds"],
      ["Agents connected", 'svc_agents{state="connected"}'],
      ["Agents disconnected", 'svc_agents{state="disconnected"}'],
      ["Agents quarantined", 'svc_agents{state="quarantined"}'],
      ["Events since start", "svc_events_total"],
      ["HTTP requests", "svc_http_requests_total"],
      ["API errors", "svc_api_errors_total"],
      ["Bus connections", "svc_bus_connections"],
      ["Bus messages in", 'svc_bus_messages_total{direction="in"}'],
      ["Bus messages out", 'svc_bus_messages_total{direction="out"}'],
    ];
    replaceRows(
      "metrics-table",
      wanted.filter(([, name]) => metrics.has(name)).map(([label, name]) => row([label, Math.round(metrics.get(name) * 100) / 100]))
    );
    drawChart(await api("/api/v1/events/timeline?minutes=60"));
  }

  // ---- wiring ----
  function submit(id, handler) {
    $(id).addEventListener("submit", (event) => {
      event.preventDefault();
      handler();
    });
  }

  // A blocked inline script, style or handler would mean markup got in somewhere: count
  // them where a test (and a curious operator) can see.
  let violations = 0;
  document.addEventListener("securitypolicyviolation", () => {
    violations += 1;
    document.body.dataset.cspViolations = String(violations);
  });

  document.addEventListener("DOMContentLoaded", () => {
    submit("signin-form", () => signIn($("signin-key").value.trim()));
    $("sign-out").addEventListener("click", () => signOut("Signed out."));
    submit("fleet-form", () => {
      state.fleet = { shown: 0, cursor: "" };
      loadFleet().catch((e) => showMessage(e.message));
    });
    $("fleet-more").addEventListener("click", () => loadMoreFleet().catch((e) => showMessage(e.message)));
    submit("events-form", () => {
      stopTail();
      openEvents().catch((e) => showMessage(e.message));
    });
    $("history-next").addEventListener("click", () => {
      state.historyCursors.push($("history-next").dataset.cursor);
      loadHistory().catch((e) => showMessage(e.message));
    });
    $("history-first").addEventListener("click", () => {
      state.historyCursors = [""];
      loadHistory().catch((e) => showMessage(e.message));
    });
    submit("audit-form", () => {
      state.auditCursors = [""];
      loadAudit().catch((e) => showMessage(e.message));
    });
    $("audit-next").addEventListener("click", () => {
      state.auditCursors.push($("audit-next").dataset.cursor);
      loadAudit().catch((e) => showMessage(e.message));
    });
    $("audit-first").addEventListener("click", () => {
      state.auditCursors = [""];
      loadAudit().catch((e) => showMessage(e.message));
    });
    $("audit-verify").addEventListener("click", verifyAudit);
    $("audit-export-csv").addEventListener("click", () => exportAudit("csv"));
    $("audit-export-json").addEventListener("click", () => exportAudit("json"));
    submit("secrets-form", () => loadSecrets().catch((e) => showMessage(e.message)));
    $("job-more").addEventListener("click", () => openJob(state.job.id, true).catch((e) => showMessage(e.message)));
    window.addEventListener("hashchange", route);
    const saved = key();
    if (saved) signIn(saved);
    else signOut("");
  });
})();
