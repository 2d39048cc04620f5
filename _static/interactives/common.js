/* The book's interactives: shared helpers and the loader.
 *
 * A chapter holds a placeholder <div class="attn-interactive" data-widget="NAME"> with a
 * plain-text fallback inside. Each widget file (online-softmax.js, masks.js, ...) puts
 * [NAME, build] on window.attnInteractiveQueue; once the page is parsed this file calls
 * build(container, helpers) for every placeholder of that name, which replaces the
 * fallback. The files can load in any order: nothing runs before the page is parsed.
 * No library, no build step, nothing fetched from the network.
 */
(function (root) {
  "use strict";
  if (typeof document === "undefined") return; // node: the widgets' pure functions only

  var SVG = "http://www.w3.org/2000/svg";
  var counter = 0;

  function uid(prefix) {
    counter += 1;
    return "attn-" + prefix + "-" + counter;
  }

  function set(node, attrs) {
    Object.keys(attrs || {}).forEach(function (key) {
      var value = attrs[key];
      if (value === undefined || value === null || value === false) return;
      if (key === "text") node.textContent = value;
      else if (key.slice(0, 2) === "on") node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    });
    return node;
  }

  /* An HTML element: el("p", {class: "x", text: "hello"}, [children]). */
  function el(tag, attrs, children) {
    var node = set(document.createElement(tag), attrs);
    (children || []).forEach(function (child) {
      if (child !== null && child !== undefined) {
        node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
      }
    });
    return node;
  }

  /* An SVG element, same calling convention. */
  function svg(tag, attrs, children) {
    var node = set(document.createElementNS(SVG, tag), attrs);
    (children || []).forEach(function (child) {
      if (child) node.appendChild(child);
    });
    return node;
  }

  /* An SVG canvas that scales to the column: viewBox width x height, never wider than
   * the column and never larger than `scale` (default 1) times its own size. */
  function canvas(width, height, label, scale) {
    return svg("svg", {
      viewBox: "0 0 " + width + " " + height,
      class: "attn-svg",
      role: "img",
      "aria-label": label,
      preserveAspectRatio: "xMinYMin meet",
      style: "max-width: " + Math.round(width * (scale || 1)) + "px",
    });
  }

  /* A labelled range slider with its value shown: {node, input, value(), set(v)}. */
  function slider(label, min, max, value, onInput, step) {
    var id = uid("slider");
    var out = el("output", { for: id, class: "attn-value", text: String(value) });
    var input = el("input", {
      type: "range", id: id, min: min, max: max, step: step || 1, value: value,
    });
    input.addEventListener("input", function () {
      out.textContent = input.value;
      onInput(Number(input.value));
    });
    var node = el("div", { class: "attn-field" }, [
      el("label", { for: id, text: label }), input, out,
    ]);
    return {
      node: node,
      input: input,
      value: function () { return Number(input.value); },
      set: function (v, lo, hi) {
        if (lo !== undefined) input.min = lo;
        if (hi !== undefined) input.max = hi;
        input.value = v;
        out.textContent = input.value;
      },
    };
  }

  /* A labelled <select>: options are [value, text] pairs. */
  function choice(label, options, value, onChange) {
    var id = uid("select");
    var select = el("select", { id: id }, options.map(function (o) {
      return el("option", { value: o[0], text: o[1], selected: o[0] === value });
    }));
    select.addEventListener("change", function () { onChange(select.value); });
    return {
      node: el("div", { class: "attn-field" }, [el("label", { for: id, text: label }), select]),
      input: select,
      value: function () { return select.value; },
    };
  }

  function checkbox(label, checked, onChange) {
    var id = uid("check");
    var input = el("input", { type: "checkbox", id: id, checked: checked });
    input.addEventListener("change", function () { onChange(input.checked); });
    return {
      node: el("div", { class: "attn-field" }, [input, el("label", { for: id, text: label })]),
      input: input,
      value: function () { return input.checked; },
    };
  }

  function button(text, onClick, name) {
    return el("button", { type: "button", class: "attn-button", "data-action": name || text,
      onclick: onClick, text: text });
  }

  /* The frame every widget fills: a titled group of controls, a drawing, a status line
   * read out by screen readers (aria-live) and a details line. */
  function frame(container, title) {
    container.textContent = "";
    container.classList.add("attn-ready");
    var heading = el("p", { class: "attn-title", id: uid("title"), text: title });
    var controls = el("div", { class: "attn-controls", role: "group",
      "aria-labelledby": heading.id });
    var buttons = el("div", { class: "attn-buttons", role: "group",
      "aria-label": title + ": steps" });
    var view = el("div", { class: "attn-view" });
    var status = el("p", { class: "attn-status", role: "status", "aria-live": "polite" });
    [heading, controls, buttons, view, status].forEach(function (n) { container.appendChild(n); });
    return { controls: controls, buttons: buttons, view: view, status: status };
  }

  function fmt(x, digits) {
    if (x === Infinity) return "∞";
    if (x === -Infinity) return "−∞";
    var d = digits === undefined ? 3 : digits;
    var s = x.toFixed(d);
    return s.charAt(0) === "-" ? "−" + s.slice(1) : s;
  }

  /* A seeded generator of uniforms in [0, 1) (mulberry32): the same seed, the same page. */
  function rng(seed) {
    var a = seed >>> 0;
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      var t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  /* Colours that read on the light and the dark theme (8, cycled). */
  var PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2",
    "#edc948", "#9c755f"];

  var helpers = {
    el: el, svg: svg, canvas: canvas, slider: slider, choice: choice, checkbox: checkbox,
    button: button, frame: frame, fmt: fmt, rng: rng, uid: uid, PALETTE: PALETTE,
  };

  function mountAll() {
    var queue = root.attnInteractiveQueue || [];
    queue.forEach(function (entry) {
      var name = entry[0], build = entry[1];
      var nodes = document.querySelectorAll('.attn-interactive[data-widget="' + name + '"]');
      Array.prototype.forEach.call(nodes, function (node) {
        if (node.getAttribute("data-mounted")) return;
        node.setAttribute("data-mounted", "1");
        try {
          build(node, helpers);
        } catch (error) {
          node.removeAttribute("data-mounted");
          if (root.console) root.console.error("interactive " + name + ":", error);
        }
      });
    });
  }

  root.AttnInteractives = { helpers: helpers, mountAll: mountAll };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", mountAll);
  } else {
    mountAll();
  }
})(typeof window !== "undefined" ? window : this);
