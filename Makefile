# Two commands for a fresh machine: `make book` and `make test` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The pinned torch goes in first so that nothing pulls a multi-GB CUDA build by accident. On a
# machine where PyPI's torch is a CUDA build and you want the CPU one, run e.g.
#   make book TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?=
# Chapters and tests run PyTorch on one thread per process: the book's models are tiny, and on a
# shared 2-core machine two threads made them 10-30x slower (chapter 9: 248 s vs 22 s). Set
# OMP_NUM_THREADS yourself to override. Tests run on $(JOBS) such processes.
export OMP_NUM_THREADS ?= 1
JOBS   ?= 2

.PHONY: help install book book-instructor slides test test-fast test-grading student student-branch clean release links pdf gpu-check

help:
	@echo "make book   build the website into _build/html (creates $(VENV), executes every chapter)"
	@echo "            the student edition: every exercise, no solution (what is published)"
	@echo "make book-instructor   the instructor edition, with every solution: $(INSTRUCTOR_HTML)"
	@echo "make slides   rebuild only the lecture slides (one reveal.js deck per chapter) into $(SLIDES)"
	@echo "make test   build the book, then run all tests: package, Triton interpreter, course kit, chapters, browser"
	@echo "make test-fast   package tests only (no notebooks, no browser)"
	@echo "make test-grading   every chapter under nbgrader autograde in a venv from the grading extra"
	@echo "make student     write the student bundle (solutions stripped) into student/"
	@echo "make student-branch   the tree of the student branch the Colab buttons open: $(STUDENT_BRANCH)"
	@echo "make release VERSION=X.Y.Z   set the version and pin every install cell (maintainers)"
	@echo "make links       point every link at _config.yml's repository.url (a fork runs this once)"
	@echo "make pdf         the whole book as one PDF: _build/pdf/attention-book.pdf"
	@echo "make gpu-check   on a CUDA machine: every chapter, the GPU tests and benchmarks -> benchmarks/results/gpu/"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[book,course,grading,test,gpu]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attnbook)" >/dev/null
	touch $(STAMP)

install: $(STAMP)

# CI executes the chapters in a kernel from the grading extra alone: BOOK_KERNELS names a folder
# holding kernels/python3 (tools/grading_kernel.py build), put first on JUPYTER_PATH for this
# build only. Left empty, as on your machine, the chapters run in $(VENV)'s kernel.
BOOK_KERNELS ?=
BOOK_ENV = $(if $(BOOK_KERNELS),JUPYTER_PATH="$(abspath $(BOOK_KERNELS))$${JUPYTER_PATH:+:$$JUPYTER_PATH}")

book: $(STAMP)
	$(BOOK_ENV) $(BIN)/jupyter-book build . --builder html -W -n --keep-going
	$(SLIDES_BUILD)
	@echo
	@echo "The book is built: open file://$(CURDIR)/_build/html/index.html"

# The lecture slides (tools/slides.py): one reveal.js deck per chapter, made from the
# executed notebooks the book build leaves in _build/jupyter_execute (no kernel starts,
# a few seconds), into the site `make book` builds, so the published site has them at
# slides/index.html. `make slides` rebuilds them alone after a `make book`.
SLIDES ?= _build/html/slides
SLIDES_BUILD = $(BIN)/python -m tools.slides --out $(SLIDES)
slides: $(STAMP)
	$(SLIDES_BUILD)

# The instructor edition: the same book with every solution (_ext/editions.py), for
# instructors only; no workflow publishes it (README.md, "How the book is published"). It
# shares the student build's Sphinx environment (_build/.doctrees) and execution cache, so
# after `make book` it reads and executes nothing: only Sphinx's write phase runs again,
# and no kernel starts.
INSTRUCTOR_HTML ?= _build/instructor/html
book-instructor: book
	$(BIN)/python _ext/editions.py build instructor $(INSTRUCTOR_HTML)
	rm -rf $(INSTRUCTOR_HTML)/slides && cp -R $(SLIDES) $(INSTRUCTOR_HTML)/slides
	@echo "The instructor edition is built: open file://$(abspath $(INSTRUCTOR_HTML))/index.html (do not publish it)"

# The whole book as one PDF, printed by headless Chromium from the website (tools/pdf.py says how):
# figures, formulas, code, exercises and bibliography, with bookmarks and page numbers.
pdf: book
	$(BIN)/python tools/pdf.py

test: book book-instructor
	$(BIN)/python -m pytest -n $(JOBS) --dist loadfile -m "not every_chapter" tests

# Every chapter once more, under nbgrader's autograde, in a fresh environment holding only the
# `grading` extra: the proof that a grading kernel lacks nothing (about 10 CPU-minutes, so it
# runs before every release and on demand, not on every push); and every question page in otter.
test-grading: $(STAMP)
	$(BIN)/python -m pytest -m every_chapter -s tests/course/test_nbgrader.py tests/course/test_questions.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) tests -m "not every_chapter and not site" --ignore=tests/book/test_site.py --ignore=tests/book/test_editions.py \
	  --ignore=tests/course/test_course.py --ignore=tests/book/test_outputs.py --ignore=tests/book/test_pdf.py \
	  --ignore=tests/book/test_colab_path.py --ignore=tests/course/test_nbgrader.py --ignore=tests/course/test_otter.py

student: $(STAMP)
	$(BIN)/python -m attnbook.course student student

# The student branch (pages.yml pushes it): every chapter at book/<chapter>.ipynb with its
# solutions stripped, the path the student edition's Colab buttons open, and the README.
STUDENT_BRANCH ?= _build/student-branch
student-branch: $(STAMP)
	$(BIN)/python _ext/editions.py student-branch $(STUDENT_BRANCH)

clean:
	rm -rf _build student

# Maintainers: set the version in attnbook, pin every notebook's install cell to its tag (the
# CHANGELOG needs a "## [VERSION]" section first), then commit, tag and push as it prints.
release: $(STAMP)
	@test -n "$(VERSION)" || (echo "usage: make release VERSION=X.Y.Z" && exit 2)
	$(BIN)/python tools/release.py $(VERSION)

# A fork: set repository.url in _config.yml, then point the install cells, the project URL and
# the clone commands at it.
links: $(STAMP)
	$(BIN)/python tools/release.py --links

# On a machine with a CUDA GPU, in the Python that already has torch and triton (Colab's, or a GPU
# image's; not $(VENV), whose torch is the CPU build): every chapter, the GPU tests and the GPU
# benchmarks, written to benchmarks/results/gpu/<device>.json and .md (tools/gpu_check.py says how
# to bring Jupyter's packages to a machine without a network).
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py run
