# The project's commands in one place (each is also in the README).
#   make test       lint and run the tests (the README's test command; on a GPU machine tests/gpu too)
#   make lint       ruff
#   make bench      check and time every kernel on a suite (SUITE=quick by default; needs a GPU)
#   make notebooks  execute the day notebooks in place, recording run time and peak GPU memory (needs a GPU)
#   make site       build the website into build/site and serve it on http://localhost:8000
#   make readme     regenerate README.md's tables, RESULTS.md and the overview picture
SUITE ?= quick
PYTHON ?= python

.PHONY: test lint bench notebooks site readme

test: lint
	$(PYTHON) -m pytest -q tests

lint:
	$(PYTHON) -m ruff check .

bench:
	$(PYTHON) -m benchmarks --suite $(SUITE)

notebooks:
	$(PYTHON) -m benchmarks.notebooks

site:
	$(PYTHON) -m website && $(PYTHON) -m http.server -d build/site 8000

readme:
	$(PYTHON) -m benchmarks.readme_table
