/* The paged KV cache: a pool of blocks, one block table per sequence. The allocator
 * follows attnbook.kvcache.PagedKVCache (blocks taken from the front of the free list,
 * returned to its end); tests/book/test_interactives.py replays the same operations on
 * both. Pure functions first, then the widget. */
(function (root) {
  "use strict";

  function pagedNew(nBlocks, blockSize) {
    var free = [];
    for (var b = 0; b < nBlocks; b++) free.push(b);
    return { nBlocks: nBlocks, blockSize: blockSize, free: free, tables: {}, lengths: {},
      order: [] };
  }

  function pagedClone(state) {
    var tables = {};
    Object.keys(state.tables).forEach(function (k) { tables[k] = state.tables[k].slice(); });
    return { nBlocks: state.nBlocks, blockSize: state.blockSize, free: state.free.slice(),
      tables: tables, lengths: Object.assign({}, state.lengths), order: state.order.slice() };
  }

  function pagedAllocate(state, id) {
    if (state.tables[id]) throw new Error("sequence " + id + " is already allocated");
    state.tables[id] = [];
    state.lengths[id] = 0;
    state.order.push(id);
  }

  /* Append T positions to sequence id: true, or false (nothing changed) when the pool
   * has too few free blocks. */
  function pagedAppend(state, id, T) {
    var table = state.tables[id], n = state.lengths[id];
    var needed = Math.ceil((n + T) / state.blockSize) - table.length;
    if (needed > state.free.length) return false;
    for (var k = 0; k < needed; k++) table.push(state.free.shift());
    state.lengths[id] = n + T;
    return true;
  }

  function pagedFree(state, id) {
    Array.prototype.push.apply(state.free, state.tables[id]);
    delete state.tables[id];
    delete state.lengths[id];
    state.order.splice(state.order.indexOf(id), 1);
  }

  /* Allocated but unused slots: blocks * blockSize - length, summed over sequences. */
  function pagedWaste(state) {
    return state.order.reduce(function (sum, id) {
      return sum + state.tables[id].length * state.blockSize - state.lengths[id];
    }, 0);
  }

  /* A server's trace: request r arrives at step arrive and wants length tokens. */
  function makeRequests(seed, count, maxLen, uniform) {
    var r = uniform(seed), out = [], t = 0;
    for (var k = 0; k < count; k++) {
      out.push({ id: String.fromCharCode(65 + k), arrive: t,
        length: 2 + Math.floor(r() * (maxLen - 1)) });
      t += Math.floor(r() * 3);
    }
    return out;
  }

  /* One step of the server at time t: finished sequences return their blocks, arrivals
   * are allocated, every running sequence appends one token (one that finds no free
   * block waits). Returns the events, in words. */
  function serverStep(state, requests, t, done) {
    var events = [], progress = false;
    state.order.slice().forEach(function (id) {
      if (done[id] === "finished") {
        events.push(id + " finished and returned " + state.tables[id].length + " block(s)");
        pagedFree(state, id);
        done[id] = "gone";
        progress = true;
      }
    });
    requests.forEach(function (req) {
      if (req.arrive === t) {
        pagedAllocate(state, req.id);
        done[req.id] = "running";
        progress = true;
        events.push(req.id + " arrived (wants " + req.length + " tokens)");
      }
    });
    requests.forEach(function (req) {
      if (done[req.id] !== "running") return;
      if (!pagedAppend(state, req.id, 1)) {
        events.push(req.id + " waits: no free block");
        return;
      }
      progress = true;
      if (state.lengths[req.id] === req.length) {
        done[req.id] = "finished";
      }
    });
    events.progress = progress;
    return events;
  }

  var api = { pagedNew: pagedNew, pagedClone: pagedClone, pagedAllocate: pagedAllocate,
    pagedAppend: pagedAppend, pagedFree: pagedFree, pagedWaste: pagedWaste,
    makeRequests: makeRequests, serverStep: serverStep };

  function build(container, H) {
    var ui = H.frame(container, "A paged KV cache serving requests");
    var blockSize = Number(container.getAttribute("data-block-size")) || 4;
    var nBlocks = Number(container.getAttribute("data-blocks")) || 16;
    var nRequests = 6, maxLen = 14, seed = 3;
    var history, requests;

    var bs = H.slider("Block size", 1, 8, blockSize, function (v) { blockSize = v; restart(); });
    var nb = H.slider("Blocks in the pool", 4, 32, nBlocks, function (v) { nBlocks = v; restart(); });
    var nr = H.slider("Requests", 1, 8, nRequests, function (v) { nRequests = v; restart(); });
    [bs, nb, nr].forEach(function (c) { ui.controls.appendChild(c.node); });
    var prev = H.button("Previous step", function () { go(history.length - 1); }, "prev");
    var next = H.button("Next step", function () { go(history.length + 1); }, "next");
    ui.buttons.appendChild(prev);
    ui.buttons.appendChild(next);
    ui.buttons.appendChild(H.button("Run to the end", function () { go(1e9); }, "end"));
    ui.buttons.appendChild(H.button("Reset", function () { go(1); }, "reset"));
    ui.buttons.appendChild(H.button("New requests", function () { seed += 1; restart(); }, "new"));

    function finished(entry) {
      var future = requests.some(function (req) { return req.arrive > entry.t; });
      return requests.every(function (req) { return entry.done[req.id] === "gone"; }) ||
        (entry.t >= 0 && !entry.events.progress && !future);
    }

    function restart() {
      requests = makeRequests(seed, nRequests, maxLen, H.rng);
      history = [{ state: pagedNew(nBlocks, blockSize), done: {}, events: ["empty pool"], t: -1 }];
      go(1);
    }

    /* history[k] is the state after k steps; go(k) computes up to k (or the end). */
    function go(k) {
      k = Math.max(1, k);
      if (history.length > k) history = history.slice(0, k);
      while (history.length < k) {
        var last = history[history.length - 1];
        if (history.length > 1 && finished(last)) break;
        if (history.length > 1000) break;
        var state = pagedClone(last.state), done = Object.assign({}, last.done);
        var events = serverStep(state, requests, last.t + 1, done);
        history.push({ state: state, done: done, events: events, t: last.t + 1 });
      }
      render();
    }

    function colour(id) { return H.PALETTE[(id.charCodeAt(0) - 65) % H.PALETTE.length]; }

    function render() {
      var entry = history[history.length - 1], st = entry.state;
      var owner = {}, fill = {};
      st.order.forEach(function (id) {
        st.tables[id].forEach(function (b, k) {
          owner[b] = id;
          fill[b] = Math.min(st.blockSize, st.lengths[id] - k * st.blockSize);
        });
      });
      var perRow = 8, slot = Math.max(8, Math.floor(88 / st.blockSize)), gap = 10;
      var bw = slot * st.blockSize, rows = Math.ceil(st.nBlocks / perRow);
      var c = H.canvas(perRow * (bw + gap), rows * 52 + 4,
        "The pool of " + st.nBlocks + " blocks of " + st.blockSize + " slots");
      for (var b = 0; b < st.nBlocks; b++) {
        var x0 = (b % perRow) * (bw + gap), y0 = Math.floor(b / perRow) * 52;
        c.appendChild(H.svg("text", { x: x0, y: y0 + 13, class: "attn-label",
          text: "block " + b + (owner[b] ? ": " + owner[b] : "") }));
        for (var s = 0; s < st.blockSize; s++) {
          var used = owner[b] !== undefined && s < fill[b];
          var waste = owner[b] !== undefined && !used;
          c.appendChild(H.svg("rect", { x: x0 + s * slot + 0.5, y: y0 + 18, width: slot - 1,
            height: 26, class: "attn-slot" + (waste ? " attn-waste" : "") + (used ? " attn-used" : ""),
            style: used ? "fill: " + colour(owner[b]) : waste ? "stroke: " + colour(owner[b]) : null }));
        }
      }
      var tables = H.el("ul", { class: "attn-list" }, st.order.map(function (id) {
        var req = requests.filter(function (r) { return r.id === id; })[0];
        return H.el("li", {}, [H.el("span", { class: "attn-swatch", style: "background:" + colour(id) }),
          id + ": " + st.lengths[id] + " of " + req.length + " tokens, block table [" +
          st.tables[id].join(", ") + "]"]);
      }));
      var waiting = requests.filter(function (r) { return r.arrive > entry.t; }).map(function (r) {
        return r.id + " (at step " + r.arrive + ")";
      });
      var used = st.order.reduce(function (a, id) { return a + st.lengths[id]; }, 0);
      var summary = H.el("p", { class: "attn-note", text: "Free blocks: " + st.free.length +
        " of " + st.nBlocks + " [" + st.free.join(", ") + "]. Tokens stored: " + used +
        "; empty slots in allocated blocks (internal waste): " + pagedWaste(st) +
        (waiting.length ? ". Still to arrive: " + waiting.join(", ") : "") + "." });
      ui.view.textContent = "";
      ui.view.appendChild(c);
      if (st.order.length) ui.view.appendChild(tables);
      ui.view.appendChild(summary);
      var end = finished(entry) && history.length > 1;
      var stuck = end && st.order.length > 0;
      prev.disabled = history.length <= 1;
      next.disabled = end;
      ui.status.textContent = (entry.t < 0 ? "Before the first step: " + requests.length +
        " requests will arrive; the pool is empty" : "Step " + entry.t + ": " +
        (entry.events.length ? entry.events.join("; ") :
          "every running sequence appended one token")) +
        ". " + st.free.length + " free blocks, " + pagedWaste(st) + " wasted slots" +
        (stuck ? ". Stuck: every running sequence waits for a block the pool does not " +
          "have (a server would preempt one and recompute it later)." :
          end ? ". Every request has finished and the pool is free again." : ".");
      container.setAttribute("data-step", String(entry.t));
      container.setAttribute("data-done", end ? "1" : "0");
    }

    restart();
  }

  if (typeof module !== "undefined" && module.exports) {
    module.exports = api;
  } else {
    (root.attnInteractiveQueue = root.attnInteractiveQueue || []).push(["paged-allocator", build]);
    if (root.AttnInteractives && document.readyState !== "loading") root.AttnInteractives.mountAll();
  }
})(typeof window !== "undefined" ? window : this);
