"""Installable with pip (``pip install .``) and as an ament_python package (``colcon build``)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "moss_tts_node"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="MOSS-TTS-Delay text-to-speech for ROS 2 robots, torch-free",
    license="Apache-2.0",
    python_requires=">=3.10",  # Humble's; CI checks the code needs nothing newer (vermin)
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        # SROS2 access control of the node, the player and its clients (docs/security.md, "SROS2").
        (f"share/{PACKAGE}/policies", glob("policies/*.policy.xml")),
        # The C bridge, compiled on first use; moss_tts_node.llama.bridge.INSTALLED_SOURCES finds it here.
        (f"share/{PACKAGE}/bridge", glob("bridge/*.[ch]")),
    ],
    # Ranges that take what apt ROS ships (Humble: Python 3.10, numpy 1.21.5 (beside which pip puts 1.21.6),
    # PyYAML 5.4.1; Jazzy: 3.12, 1.26.4, 6.0.1); requirements.txt pins what `make test` uses on each Python,
    # .ci/requirements-lowest.txt the lowest, which CI tests on Humble's Python. llama-cpp-python is exact: the
    # bridge is compiled against its headers (bridge.py).
    install_requires=[
        "numpy>=1.21.6",  # Humble has 1.21.5: onnxruntime takes 1.21.6 and newer
        "PyYAML>=5.4",
        "tokenizers>=0.15",
        "soundfile>=0.12",
        "onnxruntime>=1.22",  # the onnx heads backend needs 8-bit MatMulNBits (1.21 and older: 4-bit only)
        "gguf>=0.17",  # older gguf imports sentencepiece at import time without declaring it
        "llama-cpp-python==0.3.36",
        "threadpoolctl>=3",
        "soxr>=0.5",  # audio.output_sample_rate (audio_output.py); 0.5.0.post1 runs on numpy 1.21.6
    ],
    extras_require={
        "demo": ["onnx"],
        # the speech server (docs/http.md); the remote backend needs none
        "http": ["starlette>=0.40", "uvicorn>=0.30", "av>=17", "python-multipart>=0.0.18"],
        "play": ["sounddevice"],
        "tensorrt": ["tensorrt", "pycuda"],
        "test": ["pytest", "onnx", "ruff", "safetensors"],
    },
    entry_points={
        "console_scripts": [
            f"moss_tts = {PACKAGE}.tools.cli.main:main",
            f"moss_tts_node = {PACKAGE}.ros.main:main",
            f"moss_tts_server = {PACKAGE}.tools.cli.serve:main",
            f"moss_tts_player = {PACKAGE}.ros.player:main",
        ],
    },
)
