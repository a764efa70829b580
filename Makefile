# Two commands set everything up on a fresh machine:
#   make quickstart   venv + install + train the quickstart on CPU
#   make test         venv + install + lint + the docs + the test suite
# and one more runs OpenMMLab's own code:
#   make test-ecosystem   a second venv with the real mmpretrain and mmdet, and
#                         tests/ecosystem (its first run builds mmcv's operators, below)
# PyTorch: the default pins a release (on a CPU-only machine use a CPU wheel, e.g.
# TORCH="torch --index-url https://download.pytorch.org/whl/cpu"); a torch already in
# the venv that satisfies torch>=2.4 is kept.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
# mmpretrain imports torchvision, whose wheels on the package index are built
# against torch's CUDA builds: their C ops do not load beside the CPU build above.
# So the ecosystem venv takes another torch release with its torchvision, both
# CUDA builds (they run on a CPU too): flexgraph is tested on a second torch
# release on the way.
ECO_VENV ?= .venv-ecosystem
ECO_TORCH ?= torch==2.14.1 torchvision==0.29.1
ECO_BIN := $(ECO_VENV)/bin
# Their own requirements pin mmcv and pull in what these tests do not use; what
# they import is listed here.
MMPRETRAIN := mmpretrain==1.2.0
MMPRETRAIN_IMPORTS := einops mat4py modelindex importlib-metadata
# MMDetection needs mmcv's compiled operators (NMS, RoIAlign, ...), which no mmcv
# wheel on the package index has, and refuses mmcv 2.2 (mmdet 3.3.0 asserts
# mmcv < 2.2.0): .ci/install-mmcv builds mmcv 2.1.0's CPU operators from its source
# release against the venv's torch, once per torch release, and keeps the wheel in
# MMCV_CACHE/torch-<release>/ (pip's cache cannot tell torch releases apart). The
# build took 58 min of CPU time (user + sys; on an idle 2-core machine about half
# that) against torch 2.14.1; later installs take seconds. mmpretrain runs on it too.
MMCV := 2.1.0
MMCV_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/flexgraph/mmcv
MMDET := mmdet==3.3.0
MMDET_IMPORTS := pycocotools terminaltables shapely scipy matplotlib six tqdm

# mmengine's config imports yapf, which writes its grammar tables to a user cache on
# first import (again whenever its package files are newer, as after an install), not
# atomically: two test workers importing it at once from a fresh venv read a
# half-written file (EOFError at collection). One import right after the install writes it.

.PHONY: install quickstart test lint docs bench test-ecosystem test-ecosystem-long test-matrix

$(BIN)/flexgraph: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install $(TORCH)
	$(BIN)/python -m pip install -e ".[test]"
	$(BIN)/python -c "import mmengine.config"  # yapf's grammar cache (see above)
	touch $@

install: $(BIN)/flexgraph

quickstart: install
	$(BIN)/flexgraph run examples/quickstart.py

lint: install
	$(BIN)/ruff check .

# The documentation (docs/): HTML with warnings as errors, then the pages' doctests.
# A fresh environment (-E) each time, so every page's warnings surface again. The
# plan pages are drawn by flexgraph itself (flexgraph plan --format html).
docs: install
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html
	$(BIN)/sphinx-build -E -W --keep-going -q -b doctest docs docs/_build/doctest

test: lint docs
	$(BIN)/pytest -n 2

# The longer tier: every strategy resuming every strategy's checkpoint (6 x 6, ~6 min)
# and DDP killed at seeded points during sync and background saves (~3 min).
test-matrix: install
	$(BIN)/pytest -n 2 -m matrix tests/cli/test_portable_matrix_cli.py tests/cli/test_portable_kill_cli.py

$(ECO_BIN)/flexgraph: pyproject.toml
	$(PYTHON) -m venv $(ECO_VENV)
	$(ECO_BIN)/python -m pip install -q --upgrade pip
	$(ECO_BIN)/python -m pip install $(ECO_TORCH)
	$(ECO_BIN)/python -m pip install -e ".[test]"
	.ci/install-mmcv $(ECO_BIN)/python $(MMCV) $(MMCV_CACHE)
	$(ECO_BIN)/python -m pip install --no-deps $(MMPRETRAIN) $(MMDET)
	$(ECO_BIN)/python -m pip install $(MMPRETRAIN_IMPORTS) $(MMDET_IMPORTS)
	$(ECO_BIN)/python -c "import mmengine.config"  # yapf's grammar cache (see above)
	touch $@

# Besides tests/ecosystem, the two files whose cases for mmpretrain's and mmdet's own
# hooks skip in `make test`, where those packages are not installed.
ECO_TESTS := tests/ecosystem tests/training/loop/test_runner_view.py \
	tests/training/loop/test_sync_norm.py

test-ecosystem: $(ECO_BIN)/flexgraph
	$(ECO_BIN)/pytest -n 2 $(ECO_TESTS)

# The longer tier of tests/ecosystem: MMDetection's configs trained until their mAP
# is measurable under every strategy, and bf16 (about an hour on two cores).
test-ecosystem-long: $(ECO_BIN)/flexgraph
	$(ECO_BIN)/pytest -n 2 -m long tests/ecosystem

bench: install
	$(BIN)/python benchmarks/plan_speed.py
	$(BIN)/python benchmarks/loop_overhead.py
	$(BIN)/python benchmarks/startup.py
