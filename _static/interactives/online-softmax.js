/* The online softmax over key tiles (FlashAttention's forward pass, one row).
 * Pure functions first (tests/book/test_interactives.py runs them in node against
 * attnbook.primitives.online_softmax_step), then the widget. */
(function (root) {
  "use strict";

  /* The states of the online softmax of scores x with values v (one number per key),
   * tile by tile (Bc keys a tile): the start {m: -inf, l: 0, acc: 0}, then after each
   * tile {j0, j1, mOld, m, alpha, tileSum, l, acc, out}. As in online_softmax_step:
   * m' = max(m, max tile), alpha = exp(m - m'), l' = l alpha + sum exp(x - m'),
   * acc' = acc alpha + sum exp(x - m') v, out = acc / l. */
  function onlineSoftmaxStates(x, v, Bc) {
    var state = { m: -Infinity, l: 0, acc: 0, out: 0 };
    var states = [state];
    for (var j0 = 0; j0 < x.length; j0 += Bc) {
      var j1 = Math.min(j0 + Bc, x.length);
      var m = state.m;
      for (var j = j0; j < j1; j++) m = Math.max(m, x[j]);
      var shift = isFinite(m) ? m : 0; // a row of -inf so far: 0 stands in, no NaN
      var alpha = Math.exp(state.m - shift);
      var tileSum = 0, tileAcc = 0;
      for (j = j0; j < j1; j++) {
        var p = Math.exp(x[j] - shift);
        tileSum += p;
        tileAcc += p * v[j];
      }
      var l = state.l * alpha + tileSum;
      var acc = state.acc * alpha + tileAcc;
      state = { j0: j0, j1: j1, mOld: state.m, m: m, alpha: alpha, tileSum: tileSum,
        l: l, acc: acc, out: l > 0 ? acc / l : 0 };
      states.push(state);
    }
    return states;
  }

  /* The second pass: exp(x_j - m) / l from the final state. */
  function onlineSoftmax(x, Bc) {
    var last = onlineSoftmaxStates(x, x.map(function () { return 0; }), Bc).pop();
    var shift = isFinite(last.m) ? last.m : 0;
    return x.map(function (xj) { return last.l > 0 ? Math.exp(xj - shift) / last.l : 0; });
  }

  /* The softmax of the whole row at once, the reference. */
  function softmax(x) {
    var m = Math.max.apply(null, x);
    var e = x.map(function (xj) { return Math.exp(xj - m); });
    var s = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (ej) { return ej / s; });
  }

  var api = { onlineSoftmaxStates: onlineSoftmaxStates, onlineSoftmax: onlineSoftmax,
    softmax: softmax };

  function build(container, H) {
    var ui = H.frame(container, "The online softmax, tile by tile");
    var n = Number(container.getAttribute("data-n")) || 12;
    var Bc = Number(container.getAttribute("data-block")) || 4;
    var seed = Number(container.getAttribute("data-seed")) || 1;
    var x, v, states, step = 0;

    function draw() {
      var r = H.rng(seed);
      x = [];
      v = [];
      for (var j = 0; j < n; j++) {
        x.push(Math.round((r() * 6 - 1) * 10) / 10);
        v.push(Math.round((r() * 4 - 2) * 10) / 10);
      }
    }

    var nSlider = H.slider("Scores in the row", 4, 16, n, function (value) {
      n = value;
      bcSlider.set(Math.min(Bc, n), 1, n);
      Bc = bcSlider.value();
      draw();
      restart();
    });
    var bcSlider = H.slider("Tile size B_c", 1, n, Bc, function (value) {
      Bc = value;
      restart();
    });
    ui.controls.appendChild(nSlider.node);
    ui.controls.appendChild(bcSlider.node);
    var prev = H.button("Previous tile", function () { go(step - 1); }, "prev");
    var next = H.button("Next tile", function () { go(step + 1); }, "next");
    ui.buttons.appendChild(prev);
    ui.buttons.appendChild(next);
    ui.buttons.appendChild(H.button("Run to the end", function () { go(states.length - 1); }, "end"));
    ui.buttons.appendChild(H.button("Reset", function () { go(0); }, "reset"));
    ui.buttons.appendChild(H.button("New scores", function () {
      seed += 1;
      draw();
      restart();
    }, "new"));

    function restart() {
      states = onlineSoftmaxStates(x, v, Bc);
      go(0);
    }

    function go(target) {
      step = Math.max(0, Math.min(states.length - 1, target));
      render();
    }

    function render() {
      var tiles = states.length - 1;
      var s = states[step];
      var cell = 52, left = 64, width = left + n * cell + 8;
      var done = step === tiles;
      var rows = done ? 5 : 3;
      var c = H.canvas(width, 30 + rows * 34, "The row of scores in tiles of " + Bc);
      var labels = ["score x", "value v", "tile"];
      if (done) labels.push("online", "softmax");
      labels.forEach(function (text, k) {
        c.appendChild(H.svg("text", { x: left - 6, y: 30 + k * 34 + 21, class: "attn-label",
          "text-anchor": "end", text: text }));
      });
      for (var j = 0; j < n; j++) {
        var t = Math.floor(j / Bc);
        var seen = j < s.j1 || (step > 0 && j < states[step].j1);
        var current = step > 0 && j >= s.j0 && j < s.j1;
        var cls = "attn-cell" + (seen ? " attn-seen" : "") + (current ? " attn-current" : "");
        var gx = left + j * cell;
        c.appendChild(H.svg("text", { x: gx + cell / 2, y: 18, class: "attn-label",
          "text-anchor": "middle", text: "j=" + j }));
        var isMax = seen && x[j] === s.m;
        c.appendChild(H.svg("rect", { x: gx + 1, y: 30, width: cell - 2, height: 30,
          class: cls + (isMax ? " attn-max" : "") }));
        c.appendChild(H.svg("text", { x: gx + cell / 2, y: 51, "text-anchor": "middle",
          class: "attn-num", text: H.fmt(x[j], 1) }));
        c.appendChild(H.svg("rect", { x: gx + 1, y: 64, width: cell - 2, height: 30, class: cls }));
        c.appendChild(H.svg("text", { x: gx + cell / 2, y: 85, "text-anchor": "middle",
          class: "attn-num", text: H.fmt(v[j], 1) }));
        if (j % Bc === 0) {
          var tw = Math.min(Bc, n - j) * cell;
          c.appendChild(H.svg("rect", { x: gx + 1, y: 98, width: tw - 2, height: 30,
            class: "attn-tile" + (t < step ? " attn-seen" : "") + (t === step - 1 ? " attn-current" : "") }));
          c.appendChild(H.svg("text", { x: gx + tw / 2, y: 119, "text-anchor": "middle",
            class: "attn-num", text: "tile " + (t + 1) }));
        }
      }
      if (done) {
        var online = onlineSoftmax(x, Bc), full = softmax(x);
        for (j = 0; j < n; j++) {
          gx = left + j * cell;
          [online[j], full[j]].forEach(function (p, k) {
            c.appendChild(H.svg("rect", { x: gx + 1, y: 132 + k * 34, width: cell - 2, height: 30,
              class: "attn-prob", "fill-opacity": Math.min(1, 0.12 + p * 2.5) }));
            c.appendChild(H.svg("text", { x: gx + cell / 2, y: 153 + k * 34, "text-anchor": "middle",
              class: "attn-num " + (k ? "attn-full" : "attn-online"), text: H.fmt(p, 3) }));
          });
        }
      }
      var table = H.el("table", { class: "attn-table" }, [
        H.el("caption", { text: "The running state after each tile" }),
        H.el("thead", {}, [H.el("tr", {}, ["after", "m", "rescale exp(m_old − m)", "l", "running output acc / l"]
          .map(function (h) { return H.el("th", { scope: "col", text: h }); }))]),
        H.el("tbody", {}, states.slice(0, step + 1).map(function (st, k) {
          return H.el("tr", { class: k === step ? "attn-current-row" : null }, [
            H.el("th", { scope: "row", text: k === 0 ? "start" : "tile " + k }),
            H.el("td", { text: H.fmt(st.m, 2) }),
            H.el("td", { text: k === 0 ? "" : H.fmt(st.alpha, 3) }),
            H.el("td", { text: H.fmt(st.l, 3) }),
            H.el("td", { text: k === 0 ? "" : H.fmt(st.out, 4) }),
          ]);
        })),
      ]);
      ui.view.textContent = "";
      ui.view.appendChild(c);
      ui.view.appendChild(table);
      prev.disabled = step === 0;
      next.disabled = done;
      var text;
      if (step === 0) {
        text = "Start: m = −∞, l = 0. The row of " + n + " scores is read in " + tiles +
          " tiles of " + Bc + ". Press Next tile.";
      } else {
        text = "Tile " + step + " of " + tiles + " (keys " + s.j0 + " to " + (s.j1 - 1) + "): " +
          (step === 1 ? "the maximum starts at " + H.fmt(s.m, 2) :
            s.m > s.mOld ? "the maximum rises from " + H.fmt(s.mOld, 2) + " to " +
              H.fmt(s.m, 2) + ", so the old sum and output are rescaled by " + H.fmt(s.alpha, 3) :
              "the maximum stays " + H.fmt(s.m, 2) + ", so the rescale factor is 1") +
          "; l = " + H.fmt(s.l, 3) + ", running output " + H.fmt(s.out, 4) + ".";
        if (done) {
          var online2 = onlineSoftmax(x, Bc), full2 = softmax(x), worst = 0, exact = 0;
          for (j = 0; j < n; j++) {
            worst = Math.max(worst, Math.abs(online2[j] - full2[j]));
            exact += full2[j] * v[j];
          }
          text += " Done: exp(x − m) / l equals the full softmax (largest difference " +
            worst.toExponential(1) + "), and the output equals softmax · v = " + H.fmt(exact, 4) + ".";
        }
      }
      ui.status.textContent = text;
      container.setAttribute("data-step", String(step));
      container.setAttribute("data-done", done ? "1" : "0");
    }

    draw();
    restart();
  }

  if (typeof module !== "undefined" && module.exports) {
    module.exports = api;
  } else {
    (root.attnInteractiveQueue = root.attnInteractiveQueue || []).push(["online-softmax", build]);
    if (root.AttnInteractives && document.readyState !== "loading") root.AttnInteractives.mountAll();
  }
})(typeof window !== "undefined" ? window : this);
