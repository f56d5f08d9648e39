// The dashboard: one live page per view, fed by a server-sent event stream.
"use strict";

const page = document.body.dataset.page;
const main = document.getElementById("main");
for (const link of document.querySelectorAll("[data-nav]")) {
  if (link.dataset.nav === page || (page === "job" && link.dataset.nav === "jobs")) link.classList.add("active");
}

// "(1 installing, 2 ssh)": booting machines per stage, furthest first (BootStage's order).
const BOOT_STAGES = ["requested", "running", "ssh", "installing", "starting"];
function bootStages(byNode) {
  const counts = {};
  for (const stage of Object.values(byNode)) counts[stage] = (counts[stage] || 0) + 1;
  const parts = BOOT_STAGES.slice().reverse().filter(s => counts[s]).map(s => `${counts[s]} ${s}`);
  return parts.length ? ` (${parts.join(", ")})` : "";
}

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "onclick") node.addEventListener("click", value);
    else if (key === "oninput") node.addEventListener("input", value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(child) : child);
  }
  return node;
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({credentials: "same-origin"}, options || {}));
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.message || `HTTP ${response.status}`);
  return body;
}

function post(path, body) {
  return api(path, {method: "POST", headers: {"Content-Type": "application/json", "X-Burla-CSRF": "1"}, body: JSON.stringify(body || {})});
}

function live(path, render) {
  const status = document.getElementById("connection");
  const source = new EventSource(path);
  source.onmessage = event => { status.textContent = "live"; render(JSON.parse(event.data)); };
  source.onerror = () => { status.textContent = "reconnecting…"; };
  return source;
}

function statusBadge(status) { return h("span", {class: `status ${status}`}, status); }

function duration(job) {
  if (!job.started_at) return "";
  const end = job.ended_at || Date.now() / 1000;
  const seconds = Math.max(0, end - job.started_at);
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}

function progressBar(job, big) {
  const total = Math.max(1, job.n_inputs);
  const ok = ((job.n_done - job.n_failed) / total) * 100, bad = (job.n_failed / total) * 100;
  return h("div", {class: big ? "big bar" : "bar", role: "progressbar", "aria-valuenow": job.n_done,
                   "aria-valuemax": job.n_inputs, title: `${job.n_done}/${job.n_inputs}`},
           h("div", {class: "done", style: `width:${ok}%`}),
           h("div", {class: "failed", style: `left:${ok}%;width:${bad}%`}));
}

function when(epoch) { return epoch ? new Date(epoch * 1000).toLocaleTimeString() : ""; }

function jobRow(job, depth) {
  return h("tr", {"data-job": job.job_id},
    h("td", {class: depth ? "child" : null}, h("a", {href: `/jobs/${encodeURIComponent(job.job_id)}`}, job.job_id)),
    h("td", {}, job.function_name),
    h("td", {}, statusBadge(job.status)),
    h("td", {}, progressBar(job), h("div", {class: "muted"}, `${job.n_done}/${job.n_inputs}`,
      job.n_failed ? ` · ${job.n_failed} failed` : "", job.running ? ` · ${job.running} running` : "")),
    h("td", {}, when(job.started_at)),
    h("td", {}, duration(job)));
}

function jobsTable(jobs) {
  const byParent = new Map();
  const ids = new Set(jobs.map(j => j.job_id));
  for (const job of jobs) {
    const parent = job.parent_job_id && ids.has(job.parent_job_id) ? job.parent_job_id : null;
    if (!byParent.has(parent)) byParent.set(parent, []);
    byParent.get(parent).push(job);
  }
  const rows = [];
  const add = (parent, depth) => {
    for (const job of byParent.get(parent) || []) { rows.push(jobRow(job, depth)); add(job.job_id, depth + 1); }
  };
  add(null, 0);
  return h("table", {id: "jobs-table"},
    h("thead", {}, h("tr", {}, ["Job", "Function", "Status", "Progress", "Started", "Duration"].map(t => h("th", {}, t)))),
    h("tbody", {}, rows));
}

// --- pages ---------------------------------------------------------------------------------

function clusterPage() {
  live("/v1/stream/cluster", state => {
    const nodes = state.nodes.map(node => h("tr", {"data-node": node.node_id},
      h("td", {}, node.node_id), h("td", {}, statusBadge(node.status)), h("td", {}, node.cpus),
      h("td", {}, node.workers_alive), h("td", {}, `${node.cpu_percent.toFixed(0)}%`),
      h("td", {}, `${node.mem_percent.toFixed(0)}%`), h("td", {}, node.jobs.join(", ") || "—")));
    const message = h("span", {class: "muted", id: "cluster-message"});
    const act = (path, label) => h("button", {onclick: async event => {
      event.target.disabled = true;
      try { const result = await post(path); message.textContent = `${label}: ${JSON.stringify(result)}`; }
      catch (error) { message.textContent = `${label} failed: ${error.message}`; }
      event.target.disabled = false;
    }}, label);
    main.replaceChildren(
      h("h1", {}, "Cluster"),
      h("div", {class: "card"},
        h("div", {}, `head version ${state.version} · ${state.nodes.length} node(s)`,
          state.booting ? ` · ${state.booting} booting` + bootStages(state.booting_stages || {}) : ""),
        h("div", {style: "margin-top:8px;display:flex;gap:8px;align-items:center"},
          act("/v1/cluster/start", "Start"), act("/v1/cluster/stop", "Stop"), message)),
      h("table", {id: "nodes-table"},
        h("thead", {}, h("tr", {}, ["Node", "Status", "CPUs", "Workers", "CPU", "Memory", "Jobs"].map(t => h("th", {}, t)))),
        h("tbody", {}, nodes.length ? nodes : [h("tr", {}, h("td", {colspan: 7, class: "muted"}, "No nodes."))])),
      h("h2", {}, "Recent jobs"), jobsTable(state.jobs));
  });
}

function jobsPage() {
  live("/v1/stream/jobs", state => {
    main.replaceChildren(h("h1", {}, "Jobs"),
      state.jobs.length ? jobsTable(state.jobs) : h("p", {class: "muted"}, "No jobs yet."));
  });
}

function throughputPoints(progress) {
  const points = [];
  for (let i = 1; i < progress.length; i++) {
    const dt = progress[i].at - progress[i - 1].at;
    if (dt > 0) points.push([progress[i].at, (progress[i].n_done - progress[i - 1].n_done) / dt]);
  }
  return points;
}

function jobPage() {
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const shell = {
    header: h("div", {}), counts: h("div", {class: "counts"}), bar: h("div", {}),
    throughput: h("div", {class: "card"}), cpu: h("div", {class: "card"}), memory: h("div", {class: "card"}),
    network: h("div", {class: "card"}), gpu: h("div", {class: "card", id: "gpu-chart", hidden: true}),
    tree: h("div", {}), failures: h("div", {}), output: h("div", {class: "card"}),
    calls: h("div", {class: "card", id: "calls"}),
  };
  const calls = callsSection(jobId, shell.calls);
  const search = h("input", {id: "output-search", placeholder: "search every call's output", size: 32});
  const callIndex = h("input", {id: "output-index", type: "number", min: 0, placeholder: "input #", style: "width:90px"});
  const results = h("div", {id: "output-results"});
  const show = async () => {
    try {
      let rows;
      if (callIndex.value !== "") {
        rows = (await api(`/v1/jobs/${encodeURIComponent(jobId)}/calls/${callIndex.value}/output`)).output
          .map(r => Object.assign({input_index: Number(callIndex.value)}, r));
        if (search.value) rows = rows.filter(r => r.text.includes(search.value));
      } else {
        rows = (await api(`/v1/jobs/${encodeURIComponent(jobId)}/output?search=${encodeURIComponent(search.value)}`)).matches;
      }
      results.replaceChildren(...(rows.length ? rows.map(r => h("div", {class: "output-line", "data-index": r.input_index},
        h("span", {class: "muted"}, `[${r.input_index}${r.stream === 2 ? " stderr" : ""}] `), r.text)) :
        [h("span", {class: "muted"}, "No output matches.")]));
    } catch (error) { results.textContent = error.message; }
  };
  search.addEventListener("input", show);
  callIndex.addEventListener("input", show);
  shell.output.append(h("h2", {style: "margin-top:0"}, "Output"),
    h("div", {style: "display:flex;gap:8px;margin-bottom:8px"}, search, callIndex), results);
  main.replaceChildren(shell.header, shell.counts, shell.bar,
    h("div", {class: "charts"}, shell.throughput, shell.cpu, shell.memory, shell.network, shell.gpu), shell.calls,
    shell.tree, shell.failures, shell.output);
  show();
  let lastFailures = "";
  live(`/v1/stream/jobs/${encodeURIComponent(jobId)}`, state => {
    const job = state.job;
    const cancel = state.read_only ? h("span", {class: "muted", id: "read-only"}, "read-only: this job's link") :
      h("button", {class: "danger", id: "cancel-job", disabled: job.status !== "RUNNING" ? "" : null,
      onclick: async event => {
        event.target.disabled = true;
        try { await post(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`, {reason: "canceled from the dashboard"}); }
        catch (error) { event.target.textContent = error.message; }
      }}, "Cancel job");
    shell.header.replaceChildren(
      h("div", {style: "display:flex;gap:12px;align-items:center"}, h("h1", {style: "margin:0"}, job.job_id),
        h("span", {id: "job-status"}, statusBadge(job.status)), cancel),
      h("div", {class: "muted"}, `${job.function_name} · started ${when(job.started_at)} · ${duration(job)}`,
        job.reason ? ` · ${job.reason}` : ""),
      ...(state.parent ? [h("div", {}, "parent job ", h("a", {href: `/jobs/${encodeURIComponent(state.parent.job_id)}`},
        state.parent.job_id))] : []));
    const stat = (label, value, id) => h("div", {}, h("b", {id}, value), h("span", {class: "muted"}, label));
    shell.counts.replaceChildren(stat("done", `${job.n_done}/${job.n_inputs}`, "count-done"),
      stat("failed", job.n_failed, "count-failed"), stat("running", job.running || 0, "count-running"),
      stat("uploaded", job.n_uploaded !== undefined ? job.n_uploaded : job.n_inputs, "count-uploaded"));
    shell.bar.replaceChildren(progressBar(job, true));
    const progress = state.metrics.progress;
    lineChart(shell.throughput, [{name: "calls/s", color: PALETTE[0], points: throughputPoints(progress)}],
      {title: "Throughput (calls per second)"});
    const nodes = Object.entries(state.metrics.nodes);
    lineChart(shell.cpu, nodes.map(([id, s], i) => ({name: id, color: PALETTE[i % PALETTE.length],
      points: s.map(p => [p.at, p.cpu_percent])})), {title: "CPU per node", yMax: 100, yUnit: "%"});
    lineChart(shell.memory, nodes.map(([id, s], i) => ({name: id, color: PALETTE[i % PALETTE.length],
      points: s.map(p => [p.at, p.mem_percent])})), {title: "Memory per node", yMax: 100, yUnit: "%"});
    lineChart(shell.network, nodes.map(([id, s], i) => ({name: id, color: PALETTE[i % PALETTE.length],
      points: s.map(p => [p.at, (p.net_sent_bps + p.net_recv_bps) / 1024])})),
      {title: "Network per node (KB/s, sent + received)"});
    // Nodes with GPUs report their utilisation and memory; the chart shows once any did.
    const gpuNodes = nodes.filter(([, s]) => s.some(p => p.gpu_percent > 0 || p.gpu_mem_percent > 0));
    shell.gpu.hidden = !gpuNodes.length;
    if (gpuNodes.length) {
      lineChart(shell.gpu, gpuNodes.flatMap(([id, s], i) => [
        {name: `${id} use`, color: PALETTE[(2 * i) % PALETTE.length], points: s.map(p => [p.at, p.gpu_percent])},
        {name: `${id} memory`, color: PALETTE[(2 * i + 1) % PALETTE.length], points: s.map(p => [p.at, p.gpu_mem_percent])},
      ]), {title: "GPU per node (use and memory)", yMax: 100, yUnit: "%"});
    }
    calls.update(state.metrics.calls || {recorded: 0}, state.metrics.held_back || [], job.n_done);
    shell.tree.replaceChildren(...(state.children.length ? [h("h2", {}, "Nested jobs"), jobsTable(state.children)] : []));
    const failuresKey = JSON.stringify(state.failures.map(f => f.input_index));
    if (failuresKey !== lastFailures) {
      lastFailures = failuresKey;
      shell.failures.replaceChildren(...(state.failures.length ? [h("h2", {}, `Failed calls (${job.n_failed})`),
        ...state.failures.map(f => h("details", {class: "card failure", "data-index": f.input_index},
          h("summary", {}, `input ${f.input_index}: ${f.exception_type.split(".").pop()}: ${f.message}`),
          f.node_id ? h("p", {class: "where"}, `on node ${f.node_id}` + (f.host ? ` (host ${f.host}` +
            (f.worker_pid ? `, worker pid ${f.worker_pid})` : ")") : "")) : null,
          h("pre", {}, f.traceback)))] : []));
    }
  });
}

// A job's calls: latency and queue-wait percentiles, success rate, when nodes held calls back,
// and each call's record (when, where, how long, in how many tries), a page at a time.
function callsSection(jobId, card) {
  const PAGE = 50;
  let offset = 0, lastDone = -1;
  const summary = h("div", {id: "calls-summary"}), held = h("div", {id: "calls-held-back"});
  const rows = h("tbody", {id: "calls-rows"}), pageLabel = h("span", {class: "muted"});
  const seconds = value => value === null || value === undefined ? "—" : `${(value * 1000).toFixed(1)} ms`;
  const load = async () => {
    try {
      const page = await api(`/v1/jobs/${encodeURIComponent(jobId)}/calls?offset=${offset}&limit=${PAGE}`);
      pageLabel.textContent = ` inputs ${offset}–${Math.min(offset + PAGE, page.total) - 1} of ${page.total}`;
      rows.replaceChildren(...page.calls.map(c => h("tr", {"data-index": c.input_index},
        h("td", {}, c.input_index), h("td", {}, c.outcome || c.state), h("td", {}, c.node_id || "—"),
        h("td", {}, c.worker_pid || "—"), h("td", {}, when(c.started_at)), h("td", {}, seconds(c.duration_s)),
        h("td", {}, c.attempts || "—"))));
    } catch (error) { rows.replaceChildren(h("tr", {}, h("td", {colspan: 7, class: "muted"}, error.message))); }
  };
  const step = delta => h("button", {onclick: () => { offset = Math.max(0, offset + delta * PAGE); load(); }},
    delta < 0 ? "Previous" : "Next");
  card.append(h("h2", {style: "margin-top:0"}, "Calls"), summary, held,
    h("table", {}, h("thead", {}, h("tr", {}, ["Input", "Outcome", "Node", "Worker", "Started", "Took", "Tries"]
      .map(t => h("th", {}, t)))), rows),
    h("div", {style: "margin-top:8px;display:flex;gap:8px;align-items:center"}, step(-1), step(1), pageLabel));
  return {
    update(stats, heldBack, done) {
      summary.replaceChildren(stats.recorded ? h("span", {},
        `${stats.recorded} calls recorded · ${(100 * stats.success_rate).toFixed(1)}% succeeded · took p50 ` +
        `${seconds(stats.latency_s.p50)}, p95 ${seconds(stats.latency_s.p95)}, p99 ${seconds(stats.latency_s.p99)}` +
        ` · waited p50 ${seconds(stats.queue_wait_s.p50)}, p95 ${seconds(stats.queue_wait_s.p95)}, ` +
        `p99 ${seconds(stats.queue_wait_s.p99)}`) : h("span", {class: "muted"}, "No call recorded yet."));
      held.replaceChildren(...heldBack.filter(e => e.held_back).map(e => h("div", {class: "muted"},
        `${when(e.at)} node ${e.node_id} held calls back: ${e.why}`)));
      if (done !== lastDone) { lastDone = done; load(); }
    },
  };
}

async function settingsPage() {
  const render = settings => {
    const fields = ["quantity", "workers_per_node", "machine_type", "region", "disk_gb", "image",
                    "inactivity_timeout_s", "max_vcpus"];
    const inputs = {};
    const message = h("div", {class: "muted", id: "settings-message"});
    const rows = fields.map(name => {
      inputs[name] = h("input", {name, value: settings[name] === null ? "" : settings[name]});
      return h("tr", {}, h("th", {}, name.replace(/_/g, " ")), h("td", {}, inputs[name]));
    });
    const spot = h("input", {type: "checkbox", name: "spot", checked: settings.spot ? "" : null});
    rows.push(h("tr", {}, h("th", {}, "spot"), h("td", {}, spot)));
    const save = h("button", {id: "save-settings", onclick: async () => {
      const changes = {spot: spot.checked};
      for (const name of fields) {
        const raw = inputs[name].value.trim();
        const numeric = ["quantity", "workers_per_node", "disk_gb", "max_vcpus"].includes(name);
        changes[name] = raw === "" ? null : numeric ? Number(raw) : name === "inactivity_timeout_s" ? Number(raw) : raw;
      }
      if (changes.quantity === null) delete changes.quantity;
      if (changes.max_vcpus === null) delete changes.max_vcpus;
      try { render(await post("/v1/settings", changes)); document.getElementById("settings-message").textContent = "Saved."; }
      catch (error) { message.textContent = error.message; }
    }}, "Save");
    main.replaceChildren(h("h1", {}, "Settings"), h("div", {class: "card"}, h("table", {}, h("tbody", {}, rows)),
      h("div", {style: "margin-top:12px;display:flex;gap:12px;align-items:center"}, save, message)));
  };
  try { render(await api("/v1/settings")); } catch (error) { main.textContent = error.message; }
}

({cluster: clusterPage, jobs: jobsPage, job: jobPage, settings: settingsPage})[page]();
