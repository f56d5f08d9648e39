// Line charts drawn as SVG: time on x, one or more series on y, with axes, grid and a legend.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(name, attrs, parent) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (parent) parent.appendChild(node);
  return node;
}

function niceMax(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

// series: [{name, color, points: [[t_seconds, y], ...]}]; options: {yMax, yUnit, title}
function lineChart(container, series, options) {
  options = options || {};
  container.innerHTML = "";
  const title = document.createElement("div");
  title.className = "muted";
  title.textContent = options.title || "";
  container.appendChild(title);
  const width = 520, height = 180, left = 44, right = 10, top = 10, bottom = 24;
  const svg = svgEl("svg", {class: "chart", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none",
                            role: "img", "aria-label": options.title || "chart"}, container);
  const all = series.flatMap(s => s.points);
  if (all.length < 2) {
    svgEl("text", {x: width / 2, y: height / 2, "text-anchor": "middle"}, svg).textContent = "waiting for data";
    return;
  }
  const t0 = Math.min(...all.map(p => p[0])), t1 = Math.max(...all.map(p => p[0]));
  const yMax = options.yMax || niceMax(Math.max(...all.map(p => p[1])));
  const x = t => left + (t1 === t0 ? 0 : (t - t0) / (t1 - t0)) * (width - left - right);
  const y = v => top + (1 - Math.min(v, yMax) / yMax) * (height - top - bottom);
  for (let i = 0; i <= 4; i++) {
    const value = (yMax * i) / 4;
    svgEl("line", {x1: left, x2: width - right, y1: y(value), y2: y(value), stroke: "#e4e7ec"}, svg);
    svgEl("text", {x: left - 4, y: y(value) + 3, "text-anchor": "end"}, svg).textContent =
      (Number.isInteger(value) ? value : value.toFixed(1)) + (options.yUnit || "");
  }
  for (let i = 0; i <= 4; i++) {
    const t = t0 + ((t1 - t0) * i) / 4;
    const digits = t1 - t0 < 10 ? 1 : 0;
    svgEl("text", {x: x(t), y: height - 6, "text-anchor": "middle"}, svg).textContent = `${(t - t0).toFixed(digits)}s`;
  }
  for (const s of series) {
    if (s.points.length < 1) continue;
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    svgEl("path", {d, fill: "none", stroke: s.color, "stroke-width": 2}, svg);
  }
  const legend = document.createElement("div");
  legend.className = "legend";
  for (const s of series) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = s.color;
    item.appendChild(swatch);
    item.appendChild(document.createTextNode(s.name));
    legend.appendChild(item);
  }
  container.appendChild(legend);
}

const PALETTE = ["#2e90fa", "#12b76a", "#f79009", "#7a5af8", "#f04438", "#06aed4", "#ee46bc", "#667085"];
