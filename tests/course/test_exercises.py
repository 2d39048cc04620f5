"""The exercise checks: the check API, and every registered check against its chapter's solution.

For every label, the solution cell of the chapter that checks it must PASS and the student stub
made by ``attnbook.course.strip_solutions`` must FAIL. Solution cells are run on their own, after the
imports of the cells before them, so they must not depend on other variables of the chapter.
"""

import ast
import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager

from attnbook import course
from attnbook.course import checks as exercises  # the registry behind attnbook.exercises
from attnbook.exercises import CheckResult, check, labels, register
from attnbook.course.checks.library import allowed

ANY = allowed("A test check: its answer may use anything.")

BOOK = Path(__file__).resolve().parents[2] / "book"


# ---------------------------------------------------------------------------------------------
# The check API (on a private registry, so test labels never leak into the real one)
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(exercises, "CHECKS", {})

    @register("t-square", hint="multiply x by itself", library=ANY)
    def _check_square(f):
        for x in (0, 3, -2):
            if f(x) != x * x:  # an explicit raise: pytest rewrites `assert` messages in test modules
                raise AssertionError(f"square({x}) should be {x * x}, got {f(x)!r}.")

    return exercises.CHECKS


def test_a_right_answer_passes(registry, capsys):
    result = check("t-square", lambda x: x**2)
    assert result == CheckResult("t-square", True, "passed") and bool(result)
    assert capsys.readouterr().out == "[PASSED] t-square: passed\n"


def test_a_wrong_answer_fails_with_the_message_and_the_hint(registry, capsys):
    result = check("t-square", lambda x: 2 * x)
    assert not result
    assert result.message == "square(3) should be 9, got 6. Hint: multiply x by itself"
    assert capsys.readouterr().out == f"[FAILED] t-square: {result.message}\n"


def test_a_stub_is_reported_as_not_attempted(registry, capsys):
    def square(x):
        raise NotImplementedError("Exercise: write your solution here")

    result = check("t-square", square)
    assert not result.passed and "not attempted" in result.message
    assert capsys.readouterr().out.startswith("[FAILED] t-square: not attempted")


def test_a_crash_in_student_code_is_a_failure_never_an_exception(registry, capsys):
    result = check("t-square", lambda x: 1 / x)
    assert not result.passed
    assert result.message == "your code raised ZeroDivisionError: division by zero. Hint: multiply x by itself"
    assert capsys.readouterr().out.startswith("[FAILED] t-square: your code raised ZeroDivisionError")


def test_unknown_label_raises_listing_the_known_labels(registry):
    register("t-other", hint="", library=ANY)(lambda f: None)
    with pytest.raises(ValueError, match=r"unknown exercise label 'nope'; known labels: t-other, t-square"):
        check("nope", None)
    assert labels() == ["t-other", "t-square"]


def test_registering_a_label_twice_raises(registry):
    with pytest.raises(ValueError, match="'t-square' is registered twice"):
        register("t-square", hint="again", library=ANY)(lambda f: None)


def test_assert_close_names_the_shape_or_the_error():
    exercises.common.assert_close(torch.ones(2), torch.ones(2) + 1e-7, "weights")
    with pytest.raises(AssertionError, match=r"weights: expected shape \(3,\), got \(2,\)"):
        exercises.common.assert_close(torch.ones(2), torch.ones(3), "weights")
    with pytest.raises(AssertionError, match="weights: values differ .max abs error 0.5"):
        exercises.common.assert_close(torch.ones(2), torch.tensor([1.0, 1.5]), "weights")


# ---------------------------------------------------------------------------------------------
# Every registered check against the book's solutions
# ---------------------------------------------------------------------------------------------
def _check_calls(source: str):
    """``(label, object expression)`` for each ``check("label", obj)`` call in a code cell."""
    tree = ast.parse(TransformerManager().transform_cell(source))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "check"):
            yield node.args[0].value, ast.unparse(node.args[1])


def book_exercises():
    """For every check call in book/*.ipynb, book/questions/*.ipynb and book/projects/*.ipynb: label -> (notebook
    name, imports, solution source, object expr).

    ``imports`` is the source of every import statement in the cells before the solution cell; the
    solution cell is the nearest code cell before the check that has a ``### BEGIN SOLUTION`` marker.
    """
    found = {}
    # the chapters, their question pages (tools/questions.py), the projects
    pages = sorted(BOOK.glob("questions/*.ipynb")) + sorted(BOOK.glob("projects/*.ipynb"))
    for path in sorted(BOOK.glob("*.ipynb")) + pages:
        nb = nbformat.read(path, as_version=4)
        imports, solution = [], None
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            for label, expr in _check_calls(cell.source):
                assert label not in found, f"{label} is checked in {found[label][0]} and again in {path.name}"
                found[label] = (str(path.relative_to(BOOK)), "\n".join(imports), solution, expr)
            if course.BEGIN in cell.source:
                solution = cell.source
            else:
                tree = ast.parse(TransformerManager().transform_cell(cell.source))
                imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def _run(label, imports, solution_source, expr):
    """Exec the imports and a solution cell in a fresh namespace, then check the object; returns the result."""
    namespace = {}
    exec("import math\nimport torch\nimport attnbook\nimport attnbook.exercises\n" + imports, namespace)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(solution_source, namespace)
        return check(label, eval(expr, namespace))


def test_every_registered_label_is_checked_in_exactly_one_chapter():
    in_book = book_exercises()
    assert sorted(in_book) == labels(), (
        f"registered but never checked in book/: {sorted(set(labels()) - set(in_book))}; "
        f"checked in book/ but not registered: {sorted(set(in_book) - set(labels()))}"
    )
    if list(BOOK.glob("*.ipynb")):
        assert labels(), "the book has chapters but no exercise checks"


def test_every_check_label_is_an_exercise_label_in_its_chapter():
    for label, (name, *_) in book_exercises().items():
        markdown = "\n".join(c.source for c in nbformat.read(BOOK / name, as_version=4).cells
                             if c.cell_type == "markdown")
        exercise = label.removesuffix("-hidden")  # a project's hidden tests: its milestone's
        assert f":label: {exercise}\n" in markdown + "\n", f"{name} checks {label!r} but has no exercise with that label"


def test_every_solution_passes_and_every_stub_fails():
    problems = []
    for label, (name, imports, solution, expr) in book_exercises().items():
        if solution is None:
            problems.append(f"{name}: no solution cell before the check of {label!r}")
            continue
        try:
            if not _run(label, imports, solution, expr):
                problems.append(f"{name}: the solution for {label!r} FAILS its check")
        except Exception as err:
            problems.append(f"{name}: the solution cell for {label!r} raised {type(err).__name__}: {err}")
        stub = course.strip_solutions(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(solution)]))
        try:
            if _run(label, imports, stub.cells[0].source, expr):
                problems.append(f"{name}: the student stub for {label!r} PASSES its check")
        except NotImplementedError:
            pass  # the stub raises as soon as the cell runs: the student cannot miss it
    assert not problems, "\n".join(problems)


def test_every_solution_passes_on_the_graders_fresh_inputs():
    """The grader draws secret new inputs (``fresh_inputs``): a right answer must pass
    whatever they are, so no check may lean on its default seed."""
    problems = []
    for salt in (1, 2**40 + 7, 123456789):
        with exercises.common.fresh_inputs(salt):
            for label, (name, imports, solution, expr) in book_exercises().items():
                if not _run(label, imports, solution, expr):
                    problems.append(f"{name}: the solution for {label!r} fails with salt {salt}")
    assert not problems, "\n".join(problems)


def test_fresh_inputs_change_the_inputs_and_restore_the_notebook_seed():
    before = exercises.common.generator(5).initial_seed()
    with exercises.common.fresh_inputs() as salt:
        assert salt != 0
        assert exercises.common.generator(5).initial_seed() != before
    assert exercises.common.generator(5).initial_seed() == before == 5


def test_every_label_has_at_least_two_plausible_wrong_answers_that_fail():
    """tests/course/test_wrong_answers_<topic>.py list the mistakes (see tests/course/wrong_answers.py)."""
    import importlib

    found = {}
    for path in sorted(Path(__file__).parent.glob("test_wrong_answers_*.py")):
        for mistake in importlib.import_module(path.stem).MISTAKES:
            found.setdefault(mistake.label, []).append(mistake.what)
    unknown = sorted(set(found) - set(labels()))
    assert not unknown, f"wrong answers for labels that are not registered: {unknown}"
    from attnbook.course.checks.questions import LABELS as QUESTIONS  # test_questions.py tries
    # every wrong option of each question
    few = {label: found.get(label, []) for label in labels()
           if label not in QUESTIONS and len(found.get(label, [])) < 2}
    assert not few, f"labels with fewer than two wrong-answer tests: {few}"


# ---------------------------------------------------------------------------------------------
# Wrong answers fail: checks for the computable parts of exercises that were written-only
# ---------------------------------------------------------------------------------------------
# (fundamentals to linear attention)
def test_attention_sqrt_dk_rejects_ignoring_the_sigmas_a_missing_root_a_negative_s_and_a_tensor(capsys):
    import math

    assert check("attention-sqrt-dk", lambda d_k, sq, sk: 1 / (sq * sk * math.sqrt(d_k)))
    result = check("attention-sqrt-dk", lambda d_k, sq, sk: 1 / math.sqrt(d_k))  # right only for unit variances
    assert not result and "for d_k=2, sigma_q=2.0, sigma_k=1.0 your s = 0.7071067811865475" in result.message
    assert "gives Var[s q.k] = 4 (exact, over all 16 outcomes); it should be 1, which needs s = 0.353553." in result.message
    result = check("attention-sqrt-dk", lambda d_k, sq, sk: 1 / (sq * sk * d_k))  # 1 / d_k instead of 1 / sqrt(d_k)
    assert not result and "your s = 0.25 gives Var[s q.k] = 0.5 (exact" in result.message
    result = check("attention-sqrt-dk", lambda d_k, sq, sk: -1 / (sq * sk * math.sqrt(d_k)))
    assert not result and "return the positive scale factor, got -1.0" in result.message
    result = check("attention-sqrt-dk", lambda d_k, sq, sk: torch.tensor(1 / (sq * sk * math.sqrt(d_k))))
    assert not result and "return a float, got Tensor" in result.message
    large_dk_wrong = lambda d_k, sq, sk: 1 / (sq * sk * math.sqrt(d_k)) if d_k < 100 else 1 / math.sqrt(d_k)  # noqa: E731
    result = check("attention-sqrt-dk", large_dk_wrong)  # only the Monte Carlo cases see it
    assert not result and "for d_k=128, sigma_q=0.5, sigma_k=3.0" in result.message
    assert "(Monte Carlo, 20,000 draws); it should be 1, which needs s ~ 0.05" in result.message  # 1 / 16.97 = 0.0589


def test_complexity_projection_crossover_rejects_the_recurrent_crossover_a_float_and_an_off_by_one(capsys):
    assert check("complexity-projection-crossover", lambda d: 2 * d)
    result = check("complexity-projection-crossover", lambda d: d)  # crossover_length's comparison, not this one
    assert not result and "for d_model=1 you return n=1" in result.message
    assert "first cost as much as the four projections at n = 2, 16 FLOPs against 16." in result.message
    result = check("complexity-projection-crossover", lambda d: 2.0 * d)
    assert not result and "for d_model=1: return the length as an int, got float 2.0" in result.message
    result = check("complexity-projection-crossover", lambda d: 2 * d + 1)
    assert not result and "you return n=3" in result.message and "at n = 2" in result.message


def _decoding_flops(leading_order=False, cache_steps_from_zero=False):
    def decoding_flops(T, d, kv_cache=False):
        if kv_cache:
            return 8 * T * d * d + 2 * T * (T if leading_order else T + 1) * d - (4 * T * d if cache_steps_from_zero else 0)
        if leading_order:
            return 4 * T * T * d * d + 4 * T**3 * d // 3
        return 4 * T * (T + 1) * d * d + 2 * T * (T + 1) * (2 * T + 1) * d // 3

    return decoding_flops


def _kv_cache_size(factor=2, heads="kv"):
    def kv_cache_size(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem=2, batch=1):
        h = n_kv_heads if heads == "kv" else n_heads
        return factor * n_layers * h * (d_model // n_heads) * seq_len * batch * bytes_per_elem

    return kv_cache_size


def test_complexity_kv_decoding_cost_rejects_leading_order_totals_and_a_cache_without_values_or_gqa(capsys):
    assert check("complexity-kv-decoding-cost", (_decoding_flops(), _kv_cache_size()))
    result = check("complexity-kv-decoding-cost", (_decoding_flops(leading_order=True), _kv_cache_size()))
    assert not result and "decoding_flops(1, 1, kv_cache=False) should be 12" in result.message
    assert "summed over steps t = 1..1), got 5." in result.message
    exact_without = _decoding_flops()
    leading_with = lambda T, d, kv_cache=False: (  # noqa: E731
        _decoding_flops(leading_order=True)(T, d, True) if kv_cache else exact_without(T, d))
    result = check("complexity-kv-decoding-cost", (leading_with, _kv_cache_size()))
    assert not result and "decoding_flops(1, 1, kv_cache=True) should be 12" in result.message and "got 10." in result.message
    result = check("complexity-kv-decoding-cost", (_decoding_flops(cache_steps_from_zero=True), _kv_cache_size()))
    assert not result and "decoding_flops(1, 1, kv_cache=True) should be 12" in result.message and "got 8." in result.message
    result = check("complexity-kv-decoding-cost", (lambda T, d, kv_cache=False: float(exact_without(T, d)), _kv_cache_size()))
    assert not result and "decoding_flops(1, 1, kv_cache=False): return an exact int, got float 12.0." in result.message
    result = check("complexity-kv-decoding-cost", (_decoding_flops(), _kv_cache_size(factor=1)))  # keys only
    assert not result and "kv_cache_size(32, 4096, 32, 32, 4096, bytes_per_elem=2, batch=1) should be 2147483648" in result.message
    result = check("complexity-kv-decoding-cost", (_decoding_flops(), _kv_cache_size(heads="all")))  # ignores GQA
    assert not result and "kv_cache_size(32, 4096, 32, 8, 4096, bytes_per_elem=2, batch=1) should be 536870912" in result.message
    assert "got 2147483648." in result.message
    result = check("complexity-kv-decoding-cost", _decoding_flops())
    assert not result and "pass the pair of functions (decoding_flops, kv_cache_size)" in result.message


def test_sparse_graph_depth_rejects_a_floor_the_base_2w_plus_1_formula_and_float_logarithms(capsys):
    import math

    def layers(n, w, dilated=False, plain=lambda n, w: -(-(n - 1) // w), dilated_fn=None):
        if not dilated:
            return plain(n, w)
        if dilated_fn:
            return dilated_fn(n, w)
        k = 0
        while (w + 1) ** k < n:
            k += 1
        return k

    assert check("sparse-graph-depth", layers)
    result = check("sparse-graph-depth", lambda n, w, dilated=False: layers(n, w, dilated, plain=lambda n, w: n // w))
    assert not result and "layers_to_connect(1, 1, dilated=False) should be 0" in result.message and "got 1." in result.message
    result = check("sparse-graph-depth", lambda n, w, dilated=False: layers(n, w, dilated, plain=lambda n, w: (n - 1) // w))
    assert not result and "layers_to_connect(64, 4, dilated=False) should be 16" in result.message
    base_2w1 = lambda n, w: 0 if n == 1 else math.ceil(math.log(2 * n - 1, 2 * w + 1))  # noqa: E731
    result = check("sparse-graph-depth", lambda n, w, dilated=False: layers(n, w, dilated, dilated_fn=base_2w1))
    assert not result and "layers_to_connect(5, 1, dilated=True) should be 3" in result.message
    assert "(a breadth-first search over the stacked window masks), got 2." in result.message
    float_log = lambda n, w: math.ceil(math.log(n, w + 1))  # noqa: E731
    result = check("sparse-graph-depth", lambda n, w, dilated=False: layers(n, w, dilated, dilated_fn=float_log))
    assert not result and "layers_to_connect(125, 4, dilated=True) should be 3" in result.message and "got 4." in result.message
    result = check("sparse-graph-depth", lambda n, w, dilated=False: float(layers(n, w, dilated)))
    assert not result and "layers_to_connect(1, 1, dilated=False): return a number of layers as an int" in result.message


def test_linear_crossover_rejects_the_leading_order_a_strict_inequality_and_forgotten_features(capsys):
    def crossover(M, d, random_features=False):
        c = 2 if random_features else 1
        return -(-(4 * c * M * d + 2 * M) // (4 * d))

    assert check("linear-crossover", crossover)
    result = check("linear-crossover", lambda M, d, random_features=False: M * (2 if random_features else 1))
    assert not result and "flop_crossover(64, 64, random_features=False) should be 65" in result.message
    assert "at n = 65 linear attention costs 1073280 matmul FLOPs against softmax attention's 1081600" in result.message
    strict = lambda M, d, random_features=False: (  # noqa: E731
        (4 * (2 if random_features else 1) * M * d + 2 * M) // (4 * d) + 1)  # linear < softmax: one too far at equality
    result = check("linear-crossover", strict)
    assert not result and "flop_crossover(128, 64, random_features=False) should be 129" in result.message
    assert "costs 4260096 matmul FLOPs against softmax attention's 4260096" in result.message and "you return 130" in result.message
    result = check("linear-crossover", lambda M, d, random_features=False: crossover(M, d))  # features not counted
    assert not result and "flop_crossover(266, 64, random_features=True) should be 535" in result.message
    result = check("linear-crossover", lambda M, d, random_features=False: M + M / (2 * d))
    assert not result and "flop_crossover(64, 64, random_features=False): return a length as an int, got float 64.5" in result.message


def test_linear_crossover_counts_the_products_that_attnbook_runs():
    """The check's product lists give exactly the FLOPs torch counts in attnbook's linear and softmax attention."""
    from torch.utils.flop_counter import FlopCounterMode

    from attnbook.core import scaled_dot_product_attention
    from attnbook.linear import linear_attention, performer_features

    def counted(fn, *args, **kwargs):
        with FlopCounterMode(display=False) as counter:
            fn(*args, **kwargs)
        return counter.get_total_flops()

    gen = torch.Generator().manual_seed(0)
    for n, M, d, random_features in [(65, 64, 64, False), (7, 3, 5, False), (7, 3, 5, True), (30, 266, 64, True)]:
        q, k, v = (torch.randn(n, d, generator=gen) for _ in range(3))
        W = torch.randn(M, d, generator=gen)
        features = (lambda x: performer_features(x, W)) if random_features else (lambda x: torch.ones(*x.shape[:-1], M))
        linear, softmax = exercises.linear.counted_products(n, M, d, random_features)
        assert counted(linear_attention, q, k, v, feature_map=features) == exercises.linear.flops_of(linear)
        assert counted(scaled_dot_product_attention, q, k, v) == exercises.linear.flops_of(softmax)

# (FlashAttention to the connections chapter)
def _flash_traffic_ratio(streaming_only=False, real_division=False):
    """The ratio of flash HBM traffic at d = 128 and d = 64, right or with one of two slips."""

    def ratio(n, sram_bytes, bytes_per_element=2):
        def traffic(d):
            block = min(n, max(1, sram_bytes // bytes_per_element // (4 * d)))
            tiles = n / block if real_division else -(-n // block)
            return 2 * n * d * tiles + (0 if streaming_only else 2 * n * d)

        return traffic(128) / traffic(64)

    return ratio


def test_flash_io_head_dim_rejects_the_asymptotic_four_and_a_missing_ceiling(capsys):
    assert check("flash-io-head-dim", _flash_traffic_ratio())
    result = check("flash-io-head-dim", lambda n, sram_bytes, bytes_per_element=2: 4.0)  # d^2 alone
    assert not result and "for n=16384, sram_bytes=196608, bytes_per_element=2 you return 4.0" in result.message
    assert "a ratio of 3.95455" in result.message
    result = check("flash-io-head-dim", _flash_traffic_ratio(real_division=True))  # N / B tiles, not ceil(N / B)
    assert not result and "a ratio of 3.95455" in result.message and "you return 3.954" in result.message
    result = check("flash-io-head-dim", _flash_traffic_ratio(streaming_only=True))  # forgets reading Q, writing O
    assert not result and "n=16384" in result.message and "you return 4.0; the flash traffic is 364904448" in result.message
    result = check("flash-io-head-dim", lambda n, s, bytes_per_element=2: torch.tensor(3.95))
    assert not result and "return a number (int or float), got Tensor" in result.message


def _recurrence_over_attention(d, n, m, D=None):
    return (n + m) * 2 * d * d / (2 * (n if D is None else min(2 * D + 1, n)) * m * d)


def test_rnn_attention_cost_rejects_the_self_attention_crossover_and_an_unclamped_window(capsys):
    assert check("rnn-attention-cost", (lambda d: 2 * d, _recurrence_over_attention))
    result = check("rnn-attention-cost", (lambda d: d, _recurrence_over_attention))  # the cost chapter's n = d
    assert not result and "equal_cost_length(1) returns 1" in result.message
    assert "recurrences cost 4 and the attention 2 multiply-adds; they are equal at n = m = 2" in result.message
    result = check("rnn-attention-cost", (lambda d: 2.0 * d, _recurrence_over_attention))
    assert not result and "equal_cost_length(1): return an int, got float 2.0" in result.message
    inverted = lambda d, n, m, D=None: 1 / _recurrence_over_attention(d, n, m, D)  # noqa: E731
    result = check("rnn-attention-cost", (lambda d: 2 * d, inverted))
    assert not result and "recurrence_over_attention(d=512, n=5000, m=200) returns 0.3756" in result.message
    assert "a ratio of 2.6624" in result.message
    unclamped = lambda d, n, m, D=None: (n + m) * d / ((n if D is None else 2 * D + 1) * m)  # noqa: E731
    result = check("rnn-attention-cost", (lambda d: 2 * d, unclamped))
    assert not result and "recurrence_over_attention(d=16, n=5, m=7, D=10)" in result.message
    result = check("rnn-attention-cost", _recurrence_over_attention)
    assert not result and "pass the pair (equal_cost_length, recurrence_over_attention)" in result.message


def test_vision_conv_heads_rejects_the_loose_bound_and_a_missing_factor_two(capsys):
    import math

    def peak(n, tol, max_abs_x=1.0, w_norm=1.0, factor=2.0):
        scale = factor * max_abs_x * w_norm
        return 0.0 if scale * (n - 1) / n <= tol else math.log((n - 1) * (scale / tol - 1))

    assert check("vision-conv-heads", peak)
    loose = lambda n, tol, max_abs_x=1.0, w_norm=1.0: math.log(2 * (n - 1) * max_abs_x * w_norm / tol)  # noqa: E731
    result = check("vision-conv-heads", loose)  # eps <= (n - 1) e^-pi: right to six digits at n = 1024 only
    assert not result and "for n=2, tol=0.5, max_abs_x=1.0, w_norm=1.0 you return pi = 1.386" in result.message
    assert "the smallest pi >= 0 with the bound <= tol is 1.0986123" in result.message
    result = check("vision-conv-heads", lambda n, tol, max_abs_x=1.0, w_norm=1.0: peak(n, tol, max_abs_x, w_norm, 1.0))
    assert not result and "n=1024, tol=1e-06" in result.message and "the bound is 2e-06" in result.message
    no_floor = lambda n, tol, max_abs_x=1.0, w_norm=1.0: math.log(  # noqa: E731
        max(1e-300, (n - 1) * (2 * max_abs_x * w_norm / tol - 1)))
    result = check("vision-conv-heads", no_floor)  # without pi >= 0: -690 for one pixel
    assert not result and "n=1, tol=1e-09" in result.message and "is 0" in result.message


def _retention_mask(n, gamma, exponent=lambda lag: lag, causal=True):
    lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    mask = gamma ** exponent(lag).double()
    return torch.where(lag >= 0, mask, 0.0) if causal else mask


def test_connections_linear_attention_ssm_rejects_a_symmetric_a_transposed_and_a_shifted_mask(capsys):
    assert check("connections-linear-attention-ssm", _retention_mask)
    result = check("connections-linear-attention-ssm", lambda n, g: _retention_mask(n, g, torch.abs, causal=False))
    assert not result and "n=2, gamma=0.5: M[t, s] for (t, s) = (0, 1) should be 0" in result.message
    assert "got 0.5" in result.message
    result = check("connections-linear-attention-ssm", lambda n, g: _retention_mask(n, g).T)
    assert not result and "(t, s) = (0, 1) should be 0" in result.message
    result = check("connections-linear-attention-ssm", lambda n, g: _retention_mask(n, g, lambda lag: lag + 1))  # decays s = t too
    assert not result and "n=1, gamma=0.9: M[t, s] for (t, s) = (0, 0) should be 1" in result.message
    result = check("connections-linear-attention-ssm", lambda n, g: torch.ones(n, n, dtype=torch.bool).tril())
    assert not result and "return a float torch.Tensor, got Tensor of dtype torch.bool" in result.message


def test_the_name_chapters_call_forwards_to_the_course_kits_checks():
    import attnbook.exercises as reader

    for name in reader.__all__:
        assert getattr(reader, name) is getattr(exercises, name), name
    assert reader.check("attention-sqrt-dk", None).passed is False  # the real registry
    assert set(reader.labels()) == set(exercises.CHECKS) and len(reader.labels()) >= 60
