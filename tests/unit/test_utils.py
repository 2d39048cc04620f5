"""Seeds, the default device and show_source."""

import random

import numpy as np
import pytest
import torch

from attnbook import utils


def test_seed_everything_makes_every_generator_reproducible():
    g1 = utils.seed_everything(123)
    first = (torch.rand(4), np.random.rand(2), random.random(), torch.rand(3, generator=g1))
    g2 = utils.seed_everything(123)
    second = (torch.rand(4), np.random.rand(2), random.random(), torch.rand(3, generator=g2))
    torch.testing.assert_close(first[0], second[0], rtol=0, atol=0)
    np.testing.assert_array_equal(first[1], second[1])
    assert first[2] == second[2]
    torch.testing.assert_close(first[3], second[3], rtol=0, atol=0)
    utils.seed_everything(124)
    assert not torch.equal(torch.rand(4), first[0])


def test_seed_everything_returns_a_generator_seeded_like_manual_seed():
    g = utils.seed_everything(7)
    assert isinstance(g, torch.Generator) and g.initial_seed() == 7
    torch.testing.assert_close(torch.rand(5, generator=g), torch.rand(5, generator=torch.Generator().manual_seed(7)))


def test_default_device_honours_attnbook_device(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_DEVICE", "meta")
    assert utils.default_device() == torch.device("meta")
    monkeypatch.delenv("ATTNBOOK_DEVICE")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert utils.default_device() == torch.device(expected)


def _example(x):
    """An example function."""
    return x + 1


def test_show_source_returns_and_prints_the_source(capsys):
    text = utils.show_source(_example)
    assert text.startswith("def _example(x):") and "return x + 1" in text
    assert "return x + 1" in capsys.readouterr().out  # outside IPython it prints


def _long_example(
    x,
    y=2,
):
    """A docstring
    over two lines."""
    a = x + 1
    b = a * y
    c = b - 3
    return c


def test_show_source_can_leave_out_the_docstring():
    text = utils.show_source(_long_example, docstring=False)
    assert text.splitlines() == ["def _long_example(", "    x,", "    y=2,", "):",
                                 "    a = x + 1", "    b = a * y", "    c = b - 3", "    return c"]


def test_show_source_keeps_the_lines_between_start_and_end_and_marks_the_cuts():
    text = utils.show_source(_long_example, "b = a", "c = b", docstring=False)
    assert text.splitlines() == ["def _long_example(", "    x,", "    y=2,", "):",
                                 "    ...", "    b = a * y", "    c = b - 3", "    ..."]
    # end is searched after start: "c = b" cannot end a listing that starts on "a = x"'s line
    assert utils.show_source(_long_example, "a = x", "return").splitlines()[-1] == "    return c"
    # the docstring stays unless asked otherwise, and a cut after it is marked
    assert utils.show_source(_long_example, "return").splitlines()[4:] == ["    ...", "    return c"]


def test_show_source_names_a_start_or_end_that_is_not_in_the_code():
    with pytest.raises(ValueError, match="_long_example.*'nope'"):
        utils.show_source(_long_example, "nope")
    with pytest.raises(ValueError, match="'a = x'"):
        utils.show_source(_long_example, "return", "a = x")  # end before start


def test_show_source_rejects_builtins():
    with pytest.raises(TypeError, match="show_source: obj must be a function or a class"):
        utils.show_source(len)


@pytest.mark.parametrize("seed", [2.5, -1, True, 2**32])
def test_seed_everything_refuses_what_numpy_cannot_seed(seed):
    with pytest.raises((TypeError, ValueError), match="seed_everything: seed"):
        utils.seed_everything(seed)


def test_largest_new_tensor_counts_what_operations_create_not_the_inputs():
    big = torch.zeros(10_000)
    assert utils.largest_new_tensor(lambda x: x[:5] * 2, big) == 5  # the 10,000-element input is not counted
    assert utils.largest_new_tensor(lambda: (torch.ones(7, 9) @ torch.ones(9, 2)).sum()) == 63
    assert utils.largest_new_tensor(torch.split, torch.arange(12.0).view(4, 3), 1) == 3  # a tuple of outputs
    assert utils.largest_new_tensor(lambda: None) == 0


def test_single_thread_restores_the_thread_count():
    threads = torch.get_num_threads()
    with utils.single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads
    with pytest.raises(RuntimeError), utils.single_thread():
        raise RuntimeError("an error inside the block")
    assert torch.get_num_threads() == threads  # restored on errors too


def test_check_positive_names_the_argument_and_refuses_bools_floats_and_zero():
    utils.check_positive(seq_len=3, block=1)
    for bad in (0, -2, 1.0, True, "3"):
        with pytest.raises(ValueError, match=rf"^check_positive: block must be a positive integer, got {bad!r}$"):
            utils.check_positive(seq_len=3, block=bad)
        with pytest.raises(ValueError, match=rf"^Cache: block must be a positive integer, got {bad!r}$"):
            utils.check_positive("Cache", seq_len=3, block=bad)


def test_glue_records_the_value_for_the_prose_in_a_kernel_without_myst_nb():
    """What myst-nb reads of a glued value: display data under the record prefix, named in its
    metadata. The kernel cannot import myst-nb, as the grading kernel CI builds the book in."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import sys\nsys.modules['myst_nb'] = None  # import myst_nb now fails\n"
        "from attnbook.utils import glue\nassert glue('decode_ops', 138) == 138\n"
        "glue('ratio', 1.5, display=True);")])  # fmt: skip
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    recorded, shown = nb.cells[0].outputs
    assert recorded.data == {"application/papermill.record/text/plain": "138"}
    assert recorded.metadata["scrapbook"] == {"name": "decode_ops",
                                              "mime_prefix": "application/papermill.record/"}
    assert shown.data == {"text/plain": "1.5"} and shown.metadata["scrapbook"]["name"] == "ratio"


def test_glue_outside_ipython_records_nothing_and_returns_the_value(capsys):
    assert utils.glue("decode_ops", 138) == 138
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("name", ["two words", "", 3, "1st"])
def test_glue_refuses_a_name_the_prose_could_not_refer_to(name):
    with pytest.raises(ValueError, match="glue: name"):
        utils.glue(name, 1.0)
