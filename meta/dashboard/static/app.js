// The rdmafs dashboard: polls api/status and renders it. No dependencies.
"use strict";

const $ = (id) => document.getElementById(id);
const num = (v) => Number(v || 0); // protojson writes 64-bit integers as strings

function bytes(n) {
  n = num(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function count(n) { return num(n).toLocaleString("en-US"); }

function ago(ns, nowMs) {
  ns = num(ns);
  if (!ns) return "never";
  const s = Math.max(0, (nowMs - ns / 1e6) / 1000);
  if (s < 120) return s.toFixed(s < 10 ? 1 : 0) + " s ago";
  if (s < 7200) return (s / 60).toFixed(0) + " min ago";
  return (s / 3600).toFixed(1) + " h ago";
}

function setText(id, text) { $(id).textContent = text; }

function renderServers(servers, nowMs) {
  const body = $("servers").tBodies[0];
  body.replaceChildren();
  for (const cs of servers) {
    const tr = document.createElement("tr");
    tr.dataset.id = cs.id;
    const state = !cs.up ? "down" : cs.retiring ? "retiring" : "up";
    const cells = [cs.id, cs.address, state, cs.zone || "–", bytes(cs.used), bytes(cs.capacity), bytes(cs.free),
      num(cs.load).toFixed(2), count(cs.shards), ago(cs.last_heartbeat_ns, nowMs)];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i === 2) td.className = state;
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

// graph draws series (arrays of [t, value]) as polylines over the last hour.
function graph(id, series, fmt, nowMs, spanMs) {
  const svg = $(id);
  svg.replaceChildren();
  let max = 0;
  for (const s of series) for (const p of s) max = Math.max(max, p[1]);
  const top = max > 0 ? max * 1.1 : 1;
  ["a", "b", "c"].slice(0, series.length).forEach((cls, i) => {
    const pts = series[i].map(([t, v]) => {
      const x = 400 * (1 - (nowMs - t) / spanMs);
      const y = 120 - (120 * v) / top;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    if (pts.length === 1) pts.push((400).toFixed(1) + "," + pts[0].split(",")[1]);
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    line.setAttribute("class", cls);
    line.setAttribute("points", pts.join(" "));
    svg.appendChild(line);
  });
  setText(id + "-max", "max " + fmt(max) + " · 1 h");
}

function render(d) {
  const now = d.now_ms;
  setText("updated", "updated " + new Date(now).toLocaleTimeString());
  const health = $("health");
  $("error").hidden = !d.error;
  setText("error", d.error || "");
  if (d.role === "standby") {
    health.className = "badge";
    health.textContent = "standby";
    setText("cluster", "this meta server is standing by: open the leader's dashboard");
    return;
  }
  const st = d.status;
  if (!st) return;
  setText("cluster", "cluster " + st.cluster_id);
  const servers = st.chunkservers || [];
  const up = servers.filter((c) => c.up);
  const rp = st.repair || {};
  const degraded = num(rp.degraded_stripes), lost = num(rp.lost_stripes);
  if (lost > 0) { health.className = "badge bad"; health.textContent = "data unavailable: " + count(lost) + " stripes lost"; }
  else if (degraded > 0 || up.length < servers.length) { health.className = "badge warn"; health.textContent = "degraded"; }
  else { health.className = "badge ok"; health.textContent = "healthy"; }

  setText("cs-up", up.length + " / " + servers.length + " up");
  setText("cs-detail", servers.filter((c) => c.retiring).length + " draining");
  let used = 0, cap = 0;
  for (const c of up) { used += num(c.used); cap += num(c.capacity); }
  setText("cap-used", bytes(used));
  $("cap-bar").style.width = (cap > 0 ? Math.min(100, (100 * used) / cap) : 0).toFixed(1) + "%";
  setText("cap-detail", "of " + bytes(cap) + " on up chunkservers");

  setText("st-healthy", count(rp.healthy_stripes));
  setText("st-degraded", count(degraded));
  setText("st-lost", count(lost));
  setText("st-scan", "as of the repair scan " + ago(rp.last_scan_ns, now));
  setText("rp-queued", count(rp.queued));
  setText("rp-inflight", count(rp.in_flight));
  setText("rp-rate", bytes(rp.bytes_per_second) + "/s");
  setText("rp-done", count(rp.done) + " / " + count(rp.failed));

  const sc = st.scrub || {};
  setText("sc-last", ago(sc.last_full_pass_ns, now));
  setText("sc-bytes", bytes(sc.bytes_total));
  setText("sc-errors", count(sc.errors_total));
  setText("sc-repaired", count(sc.repaired_total));

  const rl = st.relayout || {};
  setText("rl-files", count(rl.files_pending));
  setText("rl-inflight", count(rl.in_flight));
  setText("rl-rate", bytes(rl.bytes_per_second) + "/s");
  setText("rl-done", bytes(rl.bytes_done));

  renderServers(servers, now);

  const h = d.history || [];
  const span = 3600 * 1000;
  const pick = (k) => h.map((s) => [s.t, num(s[k])]);
  graph("g-ops", [pick("meta_ops"), pick("commits")], (v) => v.toFixed(0), now, span);
  graph("g-bg", [pick("repair_bps"), pick("relayout_bps"), pick("scrub_bps")], (v) => bytes(v) + "/s", now, span);
  graph("g-space", [pick("used")], bytes, now, span);
  graph("g-health", [pick("degraded"), pick("lost")], (v) => v.toFixed(0), now, span);
}

async function poll() {
  try {
    const r = await fetch("api/status", { cache: "no-store" });
    if (!r.ok) throw new Error("api/status: " + r.status + " " + (await r.text()));
    render(await r.json());
  } catch (e) {
    $("error").hidden = false;
    setText("error", "cannot reach the meta server: " + e.message);
  }
  setTimeout(poll, 2000);
}

poll();
