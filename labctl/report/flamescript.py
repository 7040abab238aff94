"""The one script of labctl's flame graphs: search and click-to-zoom, and its CSP hash.

Every SVG graph (:mod:`labctl.report.flamegraph`) embeds :data:`SCRIPT`
verbatim, or a page embeds it once for all its inline graphs; a page whose
Content-Security-Policy forbids inline scripts allows it with
``script-src`` :func:`script_csp_source`.
"""

from __future__ import annotations

import base64
import hashlib

SCRIPT = """(function () {
  "use strict";
  var HIGHLIGHT = "#fff200", INK = "#1f2933";
  function num(el, name) { return Number(el.getAttribute(name)); }
  function has(el, cls) {
    return el.getAttribute ? (" " + (el.getAttribute("class") || "") + " ").indexOf(" " + cls + " ") !== -1 : false;
  }
  function frames(svg) { return Array.prototype.slice.call(svg.querySelectorAll("g.lfg-f")); }
  function button(svg, cls, on) {
    var b = svg.querySelector("." + cls);
    if (b) { b.setAttribute("visibility", on ? "visible" : "hidden"); }
  }
  function place(svg, f, x, w) {
    var rect = f.querySelector("rect"), text = f.querySelector("text");
    if (w === null) { f.setAttribute("display", "none"); return; }
    var px = num(svg, "data-left") + x * num(svg, "data-plot"), pw = w * num(svg, "data-plot");
    var name = f.getAttribute("data-f"), fit = Math.floor((pw - 6) / num(svg, "data-cw"));
    f.removeAttribute("display");
    rect.setAttribute("x", px.toFixed(2));
    rect.setAttribute("width", pw.toFixed(2));
    text.setAttribute("x", (px + 3).toFixed(2));
    text.textContent = fit < 3 ? "" : (name.length > fit ? name.slice(0, fit - 2) + ".." : name);
  }
  function unzoom(svg) {
    var total = num(svg, "data-total");
    frames(svg).forEach(function (f) { place(svg, f, num(f, "data-s") / total, num(f, "data-n") / total); });
    button(svg, "lfg-reset", false);
  }
  function zoom(svg, target) {
    var s0 = num(target, "data-s"), n0 = num(target, "data-n"), d0 = num(target, "data-d");
    if (d0 === 0) { unzoom(svg); return; }
    frames(svg).forEach(function (f) {
      var s = num(f, "data-s"), n = num(f, "data-n"), d = num(f, "data-d");
      if (d <= d0) {
        place(svg, f, 0, s <= s0 && s + n >= s0 + n0 ? 1 : null);
      } else if (s >= s0 && s + n <= s0 + n0) {
        place(svg, f, (s - s0) / n0, n / n0);
      } else {
        place(svg, f, 0, null);
      }
    });
    button(svg, "lfg-reset", true);
  }
  function matcher(term) {
    var end = term.lastIndexOf("/");
    if (term.length > 2 && term.charAt(0) === "/" && end > 0) {
      var re = new RegExp(term.slice(1, end), term.slice(end + 1).replace(/[gy]/g, ""));
      return function (s) { return re.test(s); };
    }
    var low = term.toLowerCase();
    return function (s) { return s.toLowerCase().indexOf(low) !== -1; };
  }
  function paint(f, hit) {
    var rect = f.querySelector("rect"), text = f.querySelector("text");
    rect.setAttribute("fill", hit ? HIGHLIGHT : rect.getAttribute("data-fill"));
    rect.setAttribute("stroke", hit ? INK : "none");
    text.setAttribute("fill", hit ? INK : text.getAttribute("data-ink"));
  }
  function clear(svg) {
    frames(svg).forEach(function (f) { paint(f, false); });
    svg.querySelector(".lfg-matched").textContent = "";
    button(svg, "lfg-clear", false);
  }
  function search(svg, term) {
    var out = svg.querySelector(".lfg-matched"), total = num(svg, "data-total"), hits = [], test;
    try { test = matcher(term); } catch (e) { out.textContent = "not a regular expression: " + term; return; }
    frames(svg).forEach(function (f) {
      if (has(f, "lfg-root")) { return; }
      var hit = test(f.getAttribute("data-f"));
      paint(f, hit);
      if (hit) { hits.push([num(f, "data-s"), num(f, "data-s") + num(f, "data-n")]); }
    });
    hits.sort(function (a, b) { return a[0] - b[0] || b[1] - a[1]; });
    var matched = 0, end = 0;
    hits.forEach(function (h) {
      if (h[1] > end) { matched += h[1] - Math.max(h[0], end); end = h[1]; }
    });
    out.textContent = "matched " + matched + " of " + total + " samples (" +
      (total ? (100 * matched / total).toFixed(2) : "0.00") + "%)";
    button(svg, "lfg-clear", true);
  }
  function init(svg) {
    if (svg.getAttribute("data-ready") === "1") { return; }
    svg.setAttribute("data-ready", "1");
    frames(svg).forEach(function (f) {
      var rect = f.querySelector("rect"), text = f.querySelector("text");
      rect.setAttribute("data-fill", rect.getAttribute("fill"));
      text.setAttribute("data-ink", text.getAttribute("fill") || "inherit");
    });
    svg.addEventListener("click", function (ev) {
      for (var el = ev.target; el && el !== svg; el = el.parentNode) {
        if (has(el, "lfg-f")) { zoom(svg, el); return; }
        if (has(el, "lfg-reset")) { unzoom(svg); return; }
        if (has(el, "lfg-clear")) { clear(svg); return; }
        if (has(el, "lfg-search")) {
          var term = window.prompt("Search functions (text, or /regex/flags):", svg.getAttribute("data-term") || "");
          if (term !== null) {
            svg.setAttribute("data-term", term);
            if (term) { search(svg, term); } else { clear(svg); }
          }
          return;
        }
      }
    });
  }
  function initAll() { Array.prototype.forEach.call(document.querySelectorAll("svg.lfg"), init); }
  initAll();
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", initAll); }
})();
"""
"""Search (text or ``/regex/``, highlights matches and shows their share of
samples, nested matches counted once) and click-to-zoom, for every graph on
the page. It needs no URL, ``eval`` or inline handler."""


def script_csp_source() -> str:
    """The CSP source (``'sha256-<base64>'``) that allows :data:`SCRIPT`, the exact text the graphs embed."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(SCRIPT.encode("utf-8")).digest()).decode("ascii") + "'"
