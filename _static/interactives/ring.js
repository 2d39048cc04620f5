/* Ring attention's schedule: W ranks, each keeping its queries while the key/value
 * shards travel one hop per step. The schedule follows attnbook.distributed
 * (_block_pairs, pairs_per_rank); tests/book/test_interactives.py compares them.
 * Pure functions first, then the widget. */
(function (root) {
  "use strict";

  /* The chunks a rank holds, as indices into the sequence cut in W chunks
   * ("contiguous": chunk r) or 2W chunks ("zigzag": chunks r and 2W - 1 - r). */
  function rankChunks(rank, W, layout) {
    return layout === "zigzag" ? [rank, 2 * W - 1 - rank] : [rank];
  }

  /* At step t rank r holds the key/value shard of rank (r - t) mod W. Each
   * (query chunk, key chunk) pair of its queries against that shard is "full", "diagonal"
   * (the causal mask applies inside it) or "skipped" (the keys all come after the
   * queries). Returns steps[t][r] = {src, pairs: [{q, k, kind}]}. */
  function ringSchedule(W, layout, causal) {
    var steps = [];
    for (var t = 0; t < W; t++) {
      var row = [];
      for (var r = 0; r < W; r++) {
        var src = (((r - t) % W) + W) % W, pairs = [];
        rankChunks(r, W, layout).forEach(function (q) {
          rankChunks(src, W, layout).forEach(function (k) {
            var kind = !causal || k < q ? "full" : k === q ? "diagonal" : "skipped";
            pairs.push({ q: q, k: k, kind: kind });
          });
        });
        row.push({ src: src, pairs: pairs });
      }
      steps.push(row);
    }
    return steps;
  }

  /* The (query, key) pairs each rank attends over the whole ring, for seqLen positions
   * (a multiple of W, or of 2W for zigzag). */
  function pairsPerRank(seqLen, W, layout, causal) {
    var c = seqLen / (layout === "zigzag" ? 2 * W : W);
    var work = [];
    for (var r = 0; r < W; r++) {
      var sum = 0;
      ringSchedule(W, layout, causal).forEach(function (step) {
        step[r].pairs.forEach(function (p) {
          sum += p.kind === "full" ? c * c : p.kind === "diagonal" ? (c * (c + 1)) / 2 : 0;
        });
      });
      work.push(sum);
    }
    return work;
  }

  var api = { rankChunks: rankChunks, ringSchedule: ringSchedule, pairsPerRank: pairsPerRank };

  function build(container, H) {
    var ui = H.frame(container, "Ring attention, step by step");
    var W = Number(container.getAttribute("data-world")) || 4;
    var layout = "contiguous", causal = false, step = 0, schedule;

    var wSlider = H.slider("Ranks W", 2, 8, W, function (v) { W = v; restart(); });
    var lay = H.choice("Layout", [["contiguous", "contiguous shards"],
      ["zigzag", "zigzag (chunks r and 2W − 1 − r)"]], layout, function (v) {
      layout = v;
      restart();
    });
    var cau = H.checkbox("Causal mask", causal, function (v) { causal = v; restart(); });
    [wSlider, lay, cau].forEach(function (c) { ui.controls.appendChild(c.node); });
    var prev = H.button("Previous step", function () { go(step - 1); }, "prev");
    var next = H.button("Next step", function () { go(step + 1); }, "next");
    ui.buttons.appendChild(prev);
    ui.buttons.appendChild(next);
    ui.buttons.appendChild(H.button("Run to the end", function () { go(W); }, "end"));
    ui.buttons.appendChild(H.button("Reset", function () { go(0); }, "reset"));

    function restart() {
      schedule = ringSchedule(W, layout, causal);
      go(0);
    }

    function go(k) {
      step = Math.max(0, Math.min(W, k));
      render();
    }

    /* step k shows the blocks of steps 0 .. k - 1: step 0 is before the first. */
    function render() {
      var nChunks = layout === "zigzag" ? 2 * W : W;
      var owner = [];
      for (var r = 0; r < W; r++) {
        rankChunks(r, W, layout).forEach(function (ch) { owner[ch] = r; });
      }
      var size = 320, cell = size / nChunks, left = 70, top = 40;
      var ringW = 240, total = left + size + 20 + ringW;
      var c = H.canvas(total, top + size + 16,
        "Score matrix in chunks: query chunks down, key chunks across");
      c.appendChild(H.svg("text", { x: left + size / 2, y: 14, "text-anchor": "middle",
        class: "attn-label", text: "key chunks →" }));
      c.appendChild(H.svg("text", { x: 4, y: top - 8, class: "attn-label",
        text: "queries ↓" }));
      for (var ch = 0; ch < nChunks; ch++) {
        c.appendChild(H.svg("text", { x: left + ch * cell + cell / 2, y: top - 8,
          "text-anchor": "middle", class: "attn-label", text: String(ch) }));
        c.appendChild(H.svg("text", { x: left - 6, y: top + ch * cell + cell / 2 + 5,
          "text-anchor": "end", class: "attn-label", text: ch + " (r" + owner[ch] + ")" }));
      }
      var computed = 0, skipped = 0;
      for (var t = 0; t < step; t++) {
        schedule[t].forEach(function (entry, rank) {
          entry.pairs.forEach(function (p) {
            var x0 = left + p.k * cell, y0 = top + p.q * cell;
            var cls = "attn-block" + (t === step - 1 ? " attn-current" : " attn-seen");
            var colour = H.PALETTE[rank % H.PALETTE.length];
            if (p.kind === "skipped") {
              skipped += 1;
              c.appendChild(H.svg("rect", { x: x0 + 1, y: y0 + 1, width: cell - 2,
                height: cell - 2, class: "attn-skipped" }));
              return;
            }
            computed += 1;
            var shape = p.kind === "diagonal" ?
              H.svg("path", { d: "M" + (x0 + 1) + " " + (y0 + 1) + " L" + (x0 + 1) + " " +
                (y0 + cell - 1) + " L" + (x0 + cell - 1) + " " + (y0 + cell - 1) + " Z",
                class: cls, fill: colour }) :
              H.svg("rect", { x: x0 + 1, y: y0 + 1, width: cell - 2, height: cell - 2,
                class: cls, fill: colour });
            c.appendChild(shape);
            var diag = p.kind === "diagonal";
            c.appendChild(H.svg("text", { x: x0 + (diag ? cell / 3 : cell / 2),
              y: y0 + (diag ? (2 * cell) / 3 : cell / 2) + 4, "text-anchor": "middle",
              class: "attn-num" + (t === step - 1 ? " attn-on-colour" : ""), text: String(t) }));
          });
        });
      }
      for (ch = 0; ch <= nChunks; ch++) {
        c.appendChild(H.svg("line", { x1: left, x2: left + size, y1: top + ch * cell,
          y2: top + ch * cell, class: "attn-grid" }));
        c.appendChild(H.svg("line", { y1: top, y2: top + size, x1: left + ch * cell,
          x2: left + ch * cell, class: "attn-grid" }));
      }
      // the ring: rank r's box with the shard it holds at this step
      var cx = left + size + 20 + ringW / 2, cy = top + size / 2, rad = 80;
      var shown = Math.max(0, step - 1);
      for (r = 0; r < W; r++) {
        var a = -Math.PI / 2 + (2 * Math.PI * r) / W;
        var bx = cx + rad * Math.cos(a), by = cy + rad * Math.sin(a);
        c.appendChild(H.svg("circle", { cx: bx, cy: by, r: 30, fill: H.PALETTE[r % 8],
          class: "attn-rank" }));
        c.appendChild(H.svg("text", { x: bx, y: by - 3, "text-anchor": "middle",
          class: "attn-num attn-on-colour", text: "rank " + r }));
        c.appendChild(H.svg("text", { x: bx, y: by + 12, "text-anchor": "middle",
          class: "attn-num attn-on-colour", text: step ? "KV " + schedule[shown][r].src : "" }));
      }
      ui.view.textContent = "";
      ui.view.appendChild(c);
      var work = pairsPerRank(16 * nChunks, W, layout, causal);
      ui.view.appendChild(H.el("p", { class: "attn-note", text: "Rows are query chunks, " +
        "labelled with the rank that holds them. Each block is coloured by " +
        "the rank that computes it and numbered by its step; a triangle is a diagonal block " +
        "(masked inside), a hatched box a block the causal mask skips. Work per rank over " +
        "the ring for " + 16 * nChunks + " positions: " + work.join(", ") + " (query, key) pairs." }));
      prev.disabled = step === 0;
      next.disabled = step === W;
      var text;
      if (step === 0) {
        text = W + " ranks, " + layout + " shards" + (causal ? ", causal" : "") +
          ": each rank holds its own queries and key/value shard. Press Next step.";
      } else {
        var parts = schedule[step - 1].map(function (entry, rank) {
          var kinds = entry.pairs.map(function (p) {
            return "(" + p.q + ", " + p.k + ") " + p.kind;
          });
          return "rank " + rank + " holds KV " + entry.src + ": " + kinds.join(", ");
        });
        text = "Step t = " + (step - 1) + " (the steps run t = 0 to " + (W - 1) + "): " +
          parts.join("; ") + ".";
        if (step === W) {
          text += " Done: all " + nChunks * nChunks + " blocks visited, " + computed +
            " computed and " + skipped + " skipped.";
        }
      }
      ui.status.textContent = text;
      container.setAttribute("data-step", String(step));
      container.setAttribute("data-done", step === W ? "1" : "0");
      container.setAttribute("data-computed", String(computed));
      container.setAttribute("data-skipped", String(skipped));
    }

    restart();
  }

  if (typeof module !== "undefined" && module.exports) {
    module.exports = api;
  } else {
    (root.attnInteractiveQueue = root.attnInteractiveQueue || []).push(["ring", build]);
    if (root.AttnInteractives && document.readyState !== "loading") root.AttnInteractives.mountAll();
  }
})(typeof window !== "undefined" ? window : this);
