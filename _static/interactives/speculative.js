/* One round of speculative decoding on a vocabulary of eight words. The verification
 * rule is attnbook.serving.speculative_accept's: tests/book/test_interactives.py gives
 * both the same p, q, draft tokens and uniform draws. Pure functions first, then the
 * widget. */
(function (root) {
  "use strict";

  var VOCAB = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran"];

  function softmaxOf(logits) {
    var m = Math.max.apply(null, logits);
    var e = logits.map(function (z) { return Math.exp(z - m); });
    var s = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return x / s; });
  }

  /* The first index whose cumulative probability exceeds u * total (inverse CDF). */
  function sample(probs, u) {
    var total = probs.reduce(function (a, b) { return a + b; }, 0), c = 0;
    for (var x = 0; x < probs.length; x++) {
      c += probs[x];
      if (u * total < c) return x;
    }
    for (x = probs.length - 1; x > 0 && probs[x] === 0; x--);
    return x;
  }

  /* The rule, given the target's p (k + 1 rows), the draft's q (k rows), the draft
   * tokens, k uniforms r and one uniform u for the last token. Draft token i is accepted
   * while r_i q_i(x_i) < p_i(x_i); at the first rejection n the next token is drawn
   * from max(0, p_n - q_n) normalized (p_n itself if that is all zero); if all k are
   * accepted, from p_k (the bonus). */
  function verify(p, q, draft, r, u) {
    var k = q.length, n = 0;
    while (n < k && r[n] * q[n][draft[n]] < p[n][draft[n]]) n += 1;
    var residual = p[n].map(function (pn, x) {
      return n < k ? Math.max(0, pn - q[n][x]) : pn;
    });
    var mass = residual.reduce(function (a, b) { return a + b; }, 0);
    if (!(mass > 0)) {
      residual = p[n].slice();
      mass = residual.reduce(function (a, b) { return a + b; }, 0);
    }
    var normalized = residual.map(function (x) { return x / mass; });
    return { accepted: n, residual: normalized, token: sample(normalized, u) };
  }

  /* A round drawn from a seeded generator: logits of the target at k + 1 positions,
   * the draft's the target's plus noise of size `noise`; draft tokens drawn from q. */
  function makeRound(seed, k, noise, uniform) {
    var rand = uniform(seed), V = VOCAB.length, p = [], q = [], draft = [], r = [];
    function gauss() {
      return Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand());
    }
    for (var i = 0; i <= k; i++) {
      var logits = [];
      for (var x = 0; x < V; x++) logits.push(1.5 * gauss());
      p.push(softmaxOf(logits));
      if (i < k) {
        q.push(softmaxOf(logits.map(function (z) { return z + noise * gauss(); })));
        draft.push(sample(q[i], rand()));
        r.push(rand());
      }
    }
    return { p: p, q: q, draft: draft, r: r, u: rand() };
  }

  var api = { VOCAB: VOCAB, sample: sample, verify: verify, makeRound: makeRound,
    softmaxOf: softmaxOf };

  function build(container, H) {
    var ui = H.frame(container, "A round of speculative decoding");
    var k = Number(container.getAttribute("data-k")) || 4;
    var noise = 1.0, seed = Number(container.getAttribute("data-seed")) || 1;
    var round, result, step = 0, round_no = 1;

    var kSlider = H.slider("Draft tokens k", 1, 6, k, function (v) { k = v; restart(); });
    var nSlider = H.slider("Draft's error (noise)", 0, 3, noise, function (v) {
      noise = v;
      restart();
    }, 0.5);
    [kSlider, nSlider].forEach(function (c) { ui.controls.appendChild(c.node); });
    var prev = H.button("Previous check", function () { go(step - 1); }, "prev");
    var next = H.button("Next check", function () { go(step + 1); }, "next");
    ui.buttons.appendChild(prev);
    ui.buttons.appendChild(next);
    ui.buttons.appendChild(H.button("Run to the end", function () { go(99); }, "end"));
    ui.buttons.appendChild(H.button("New round", function () {
      seed += 1;
      round_no += 1;
      restart();
    }, "new"));

    function restart() {
      round = makeRound(seed * 7919 + k * 31 + Math.round(noise * 2), k, noise, H.rng);
      result = verify(round.p, round.q, round.draft, round.r, round.u);
      go(0);
    }

    /* steps: 0 the proposals; 1..n+1 the checks up to the first rejection (or all k);
     * last: the target's token (residual or bonus). */
    function lastStep() { return Math.min(result.accepted + 1, k) + 1; }

    function go(s) {
      step = Math.max(0, Math.min(lastStep(), s));
      render();
    }

    function bars(title, series, highlight) {
      var V = VOCAB.length, bw = 80, h = 100, top = 24;
      var c = H.canvas(V * bw + 10, top + h + 50, title);
      c.appendChild(H.svg("text", { x: 4, y: 14, class: "attn-label", text: title }));
      var most = Math.max.apply(null, series.map(function (s) {
        return Math.max.apply(null, s.values);
      }));
      VOCAB.forEach(function (word, x) {
        series.forEach(function (s, k2) {
          var val = s.values[x], bh = (val / Math.max(most, 0.05)) * h;
          c.appendChild(H.svg("rect", { x: x * bw + 14 + k2 * 28, y: top + h - bh, width: 26,
            height: Math.max(bh, 0.5), class: s.cls }));
        });
        c.appendChild(H.svg("text", { x: x * bw + 42, y: top + h + 16, "text-anchor": "middle",
          class: "attn-label" + (x === highlight ? " attn-strong" : ""), text: word }));
        series.forEach(function (s, k2) {
          c.appendChild(H.svg("text", { x: x * bw + 42, y: top + h + 31 + 14 * k2,
            "text-anchor": "middle", class: "attn-num attn-small",
            text: (series.length > 1 ? (k2 ? "q " : "p ") : "") + s.values[x].toFixed(2) }));
        });
      });
      return c;
    }

    function render() {
      var checks = Math.min(step, Math.min(result.accepted + 1, k));
      var done = step === lastStep();
      var strip = H.el("ol", { class: "attn-tokens", "aria-label": "Draft tokens and verdicts" });
      round.draft.forEach(function (x, i) {
        var verdict = i < checks ? (i < result.accepted ? "accepted" : "rejected") :
          done && i > result.accepted ? "discarded" : "proposed";
        strip.appendChild(H.el("li", { class: "attn-token attn-" + verdict },
          [VOCAB[x], H.el("small", { text: verdict })]));
      });
      if (done) {
        strip.appendChild(H.el("li", { class: "attn-token attn-target" }, [VOCAB[result.token],
          H.el("small", { text: result.accepted === k ? "bonus from p" : "from residual" })]));
      }
      ui.view.textContent = "";
      ui.view.appendChild(strip);
      var text, at;
      if (step === 0) {
        text = "Round " + round_no + ": the draft proposed " + k + " tokens: " +
          round.draft.map(function (x) { return VOCAB[x]; }).join(", ") +
          ". The target scores all of them in one pass. Press Next check.";
        ui.view.appendChild(bars("position 1: target p (dark) and draft q (light)", [
          { values: round.p[0], cls: "attn-p" }, { values: round.q[0], cls: "attn-q" }],
        round.draft[0]));
      } else if (!done) {
        at = step - 1;
        var x = round.draft[at], px = round.p[at][x], qx = round.q[at][x];
        var ok = at < result.accepted;
        text = "Check " + (at + 1) + ": draft token “" + VOCAB[x] + "” has p = " + px.toFixed(3) +
          ", q = " + qx.toFixed(3) + ", so it is accepted with probability min(1, p/q) = " +
          Math.min(1, px / qx).toFixed(3) + ". The uniform draw is " + round.r[at].toFixed(3) +
          ": " + (ok ? "accepted." : "rejected.");
        ui.view.appendChild(bars("position " + (at + 1) + ": target p (dark) and draft q (light)",
          [{ values: round.p[at], cls: "attn-p" }, { values: round.q[at], cls: "attn-q" }], x));
      }
      if (done) {
        var n = result.accepted;
        var title = n === k ? "bonus: the target's p at position " + (k + 1) :
          "residual max(0, p − q), normalized, at position " + (n + 1);
        ui.view.appendChild(bars(title, [{ values: result.residual, cls: "attn-p" }], result.token));
        text = (n === k ? "All " + k + " accepted: the target's pass gives a bonus token “" :
          n + " accepted, then rejected: the target draws “") + VOCAB[result.token] +
          (n === k ? "” from p." : "” from the residual max(0, p − q), normalized.") +
          " This round emits " + (n + 1) + " tokens for one target pass.";
      }
      prev.disabled = step === 0;
      next.disabled = done;
      ui.status.textContent = text;
      container.setAttribute("data-step", String(step));
      container.setAttribute("data-done", done ? "1" : "0");
      container.setAttribute("data-accepted", String(result.accepted));
    }

    restart();
  }

  if (typeof module !== "undefined" && module.exports) {
    module.exports = api;
  } else {
    (root.attnInteractiveQueue = root.attnInteractiveQueue || []).push(["speculative", build]);
    if (root.AttnInteractives && document.readyState !== "loading") root.AttnInteractives.mountAll();
  }
})(typeof window !== "undefined" ? window : this);
