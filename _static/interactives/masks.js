/* Attention masks with L queries and S keys, aligned bottom-right as attnbook.masks
 * aligns them (query i sits at key position i + S - L). Pure functions first
 * (tests/book/test_interactives.py compares them with attnbook.masks), then the widget. */
(function (root) {
  "use strict";

  var PATTERNS = [
    ["causal", "causal (bottom-right)"],
    ["sliding", "sliding window, both sides"],
    ["causal-sliding", "causal sliding window"],
    ["full", "full (no mask)"],
    ["top-left", "causal, top-left (PyTorch's is_causal)"],
    ["longformer", "sliding window + global tokens (L = S)"],
  ];

  /* May query i attend to key j? w is the window, g the number of global tokens (the
   * first g positions; "longformer" only, which needs L = S). */
  function allowed(pattern, i, j, L, S, w, g) {
    var t = i + S - L - j; // the query's aligned key position minus the key's
    switch (pattern) {
      case "full": return true;
      case "causal": return t >= 0;
      case "sliding": return Math.abs(t) <= w;
      case "causal-sliding": return t >= 0 && t <= w;
      case "top-left": return j <= i;
      case "longformer": return Math.abs(t) <= w || i < g || j < g;
      default: throw new Error("unknown mask pattern " + pattern);
    }
  }

  /* The L x S matrix of booleans. */
  function maskMatrix(pattern, L, S, w, g) {
    var rows = [];
    for (var i = 0; i < L; i++) {
      var row = [];
      for (var j = 0; j < S; j++) row.push(allowed(pattern, i, j, L, S, w, g || 0));
      rows.push(row);
    }
    return rows;
  }

  /* The keys each query sees, as text: "keys 2 to 5", "no key", "keys 0, 1 and 4 to 6". */
  function describeRow(row) {
    var runs = [], start = -1;
    for (var j = 0; j <= row.length; j++) {
      if (j < row.length && row[j]) {
        if (start < 0) start = j;
      } else if (start >= 0) {
        runs.push(start === j - 1 ? String(start) : start + " to " + (j - 1));
        start = -1;
      }
    }
    if (!runs.length) return "no key";
    var count = row.filter(Boolean).length;
    var list = runs.length === 1 ? runs[0] :
      runs.slice(0, -1).join(", ") + " and " + runs[runs.length - 1];
    return (count === 1 ? "key " : "keys ") + list;
  }

  var api = { allowed: allowed, maskMatrix: maskMatrix, describeRow: describeRow,
    PATTERNS: PATTERNS };

  function build(container, H) {
    var ui = H.frame(container, "Masks with L queries and S keys");
    var L = Number(container.getAttribute("data-l")) || 4;
    var S = Number(container.getAttribute("data-s")) || 7;
    var w = 2, g = 1, query = L - 1;
    var pattern = container.getAttribute("data-pattern") || "causal";

    var pat = H.choice("Pattern", PATTERNS, pattern, function (value) {
      pattern = value;
      if (pattern === "longformer") S = L;
      sync();
    });
    var lSlider = H.slider("Queries L", 1, 16, L, function (value) {
      L = value;
      if (pattern === "longformer") S = L;
      sync();
    });
    var sSlider = H.slider("Keys S", 1, 16, S, function (value) {
      S = value;
      if (pattern === "longformer") L = S;
      sync();
    });
    var wSlider = H.slider("Window w", 0, 8, w, function (value) { w = value; sync(); });
    var gSlider = H.slider("Global tokens", 0, 4, g, function (value) { g = value; sync(); });
    var qSlider = H.slider("Describe query i", 0, L - 1, query, function (value) {
      query = value;
      render();
    });
    [pat, lSlider, sSlider, wSlider, gSlider, qSlider].forEach(function (c) {
      ui.controls.appendChild(c.node);
    });

    function sync() {
      lSlider.set(L);
      sSlider.set(S);
      query = Math.min(query, L - 1);
      qSlider.set(query, 0, L - 1);
      wSlider.input.disabled = ["full", "causal", "top-left"].indexOf(pattern) >= 0;
      gSlider.input.disabled = pattern !== "longformer";
      render();
    }

    function render() {
      var m = maskMatrix(pattern, L, S, w, g);
      var cell = 30, left = 92, top = 44;
      var c = H.canvas(left + S * cell + 12, top + L * cell + 10,
        "Mask grid: " + L + " query rows by " + S + " key columns", 1.3);
      c.appendChild(H.svg("text", { x: left + (S * cell) / 2, y: 14, "text-anchor": "middle",
        class: "attn-label", text: "keys j = 0 … " + (S - 1) }));
      for (var j = 0; j < S; j++) {
        c.appendChild(H.svg("text", { x: left + j * cell + cell / 2, y: top - 8,
          "text-anchor": "middle", class: "attn-label", text: String(j) }));
      }
      var count = 0;
      for (var i = 0; i < L; i++) {
        c.appendChild(H.svg("text", { x: left - 8, y: top + i * cell + cell / 2 + 5,
          "text-anchor": "end", class: "attn-label" + (i === query ? " attn-strong" : ""),
          text: "query " + i }));
        var aligned = i + S - L;
        for (j = 0; j < S; j++) {
          if (m[i][j]) count += 1;
          c.appendChild(H.svg("rect", { x: left + j * cell + 1, y: top + i * cell + 1,
            width: cell - 2, height: cell - 2,
            class: "attn-cell" + (m[i][j] ? " attn-on" : "") + (i === query ? " attn-row" : "") +
              (j === aligned ? " attn-aligned" : "") }));
        }
      }
      var note = H.el("p", { class: "attn-note", text: "Filled: may attend. Outlined: key " +
        "i + S − L, where query i sits when the last query is level with the last key." });
      ui.view.textContent = "";
      ui.view.appendChild(c);
      ui.view.appendChild(note);
      var name = PATTERNS.filter(function (p) { return p[0] === pattern; })[0][1];
      ui.status.textContent = name + ", L = " + L + ", S = " + S +
        (wSlider.input.disabled ? "" : ", w = " + w) +
        (pattern === "longformer" ? ", " + g + " global" : "") + ": query " + query +
        " sits at key position " + (query + S - L) + " and sees " + describeRow(m[query]) +
        "; " + count + " of " + L * S + " pairs allowed.";
      container.setAttribute("data-allowed", String(count));
    }

    sync();
  }

  if (typeof module !== "undefined" && module.exports) {
    module.exports = api;
  } else {
    (root.attnInteractiveQueue = root.attnInteractiveQueue || []).push(["masks", build]);
    if (root.AttnInteractives && document.readyState !== "loading") root.AttnInteractives.mountAll();
  }
})(typeof window !== "undefined" ? window : this);
