"""Plausible wrong answers to the milestones of the serving project
(``book/projects/serve_paged.ipynb``): each fails its check (public or hidden) with a message
that points at the mistake."""

import math

import torch
from wrong_answers import Mistake, mistake_test


def _decode(q, k_pool, v_pool, block_tables, seqlens, *, head_map="interleave",
            in_table_order=True, cut=True, scale=True):
    """The model answer with one thing changed."""
    B, h, d = q.shape
    group = h // k_pool.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = seqlens[b]
        table = block_tables[b] if in_table_order else sorted(block_tables[b])
        k = k_pool[table].transpose(0, 1).flatten(1, 2)
        v = v_pool[table].transpose(0, 1).flatten(1, 2)
        if cut:
            k, v = k[:, :n], v[:, :n]
        if head_map == "interleave":
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        else:  # query head j reads key/value head j % h_kv
            k, v = k.repeat(group, 1, 1), v.repeat(group, 1, 1)
        scores = torch.einsum("hd,hnd->hn", q[b], k) / (math.sqrt(d) if scale else 1.0)
        out[b] = torch.einsum("hn,hnd->hd", scores.softmax(-1), v)
    return out


def _schedule(requests, n_blocks, block_size, max_batch, *, overtake=False, free_late=False,
              check_fit=True, finish_late=False):
    """The model answer with one thing changed."""
    need = [math.ceil((p + n) / block_size) for _, p, n in requests]
    if check_fit and max(need) > n_blocks:
        raise ValueError("a request can never fit")
    queue = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    running, spans, step = {}, {}, 0
    while len(spans) < len(requests):
        running = {i: e for i, e in running.items() if e >= step - int(free_late)}
        for i in list(queue):
            free = n_blocks - sum(need[j] for j in running)
            fits = requests[i][0] <= step and len(running) < max_batch and need[i] <= free
            if fits:
                queue.remove(i)
                spans[i] = (step, step + requests[i][2] - int(not finish_late))
                running[i] = spans[i][1]
            elif not overtake:
                break
        step += 1
        if step > 10_000:
            raise RuntimeError("the schedule never ends")
    return [spans[i] for i in range(len(requests))]


DECODE, DECODE_HIDDEN = "project-serve-paged-decode", "project-serve-paged-decode-hidden"
SCHEDULE, SCHEDULE_HIDDEN = "project-serve-schedule", "project-serve-schedule-hidden"
MISTAKES = [
    Mistake(DECODE, "no 1/sqrt(d_k)", lambda *a: _decode(*a, scale=False), ("values differ",)),
    Mistake(DECODE, "the last block's empty slots attended", lambda *a: _decode(*a, cut=False),
            ("values differ", "keep only the first seqlens[b] positions")),
    Mistake(DECODE_HIDDEN, "head j reads key/value head j % h_kv (passes the public check)",
            lambda *a: _decode(*a, head_map="tile"), ("values differ", "key/value heads")),
    Mistake(DECODE_HIDDEN, "blocks read in pool order (passes the public check)",
            lambda *a: _decode(*a, in_table_order=False), ("values differ", "block_tables=")),
    Mistake(SCHEDULE, "finishes a step late", lambda *a: _schedule(*a, finish_late=True),
            ("expected [(0, 1)",)),
    Mistake(SCHEDULE, "frees blocks a step late", lambda *a: _schedule(*a, free_late=True),
            ("expected",)),
    Mistake(SCHEDULE_HIDDEN, "overtakes a blocked head (passes the public check)",
            lambda *a: _schedule(*a, overtake=True), ("expected",)),
    Mistake(SCHEDULE_HIDDEN, "runs a request the pool can never hold (passes the public check)",
            lambda *a: _schedule(*a, check_fit=False), ("raise ValueError",)),
]

test_mistake = mistake_test(MISTAKES)


def test_the_hidden_mistakes_pass_the_public_checks():
    """The point of the hidden tests: each hidden mistake above passes its public check."""
    from wrong_answers import verdict

    for mistake in MISTAKES:
        if mistake.label.endswith("-hidden"):
            public = mistake.label.removesuffix("-hidden")
            assert verdict(public, mistake.answer).passed, mistake.what
