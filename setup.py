"""Installable with pip (``pip install .``) and as an ament_python package (``colcon build``)."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "moss_tts_node"

setup(
    name=PACKAGE,
    version="0.1.0",
    description="MOSS-TTS-Delay text-to-speech for ROS 2 robots, torch-free",
    license="Apache-2.0",
    python_requires=">=3.10",
    # The C bridge ships inside the package so an installed copy can compile it on first use.
    packages=[*find_packages(include=[PACKAGE, f"{PACKAGE}.*"]), f"{PACKAGE}.bridge_src"],
    package_dir={f"{PACKAGE}.bridge_src": "bridge"},
    package_data={f"{PACKAGE}.bridge_src": ["*.c", "*.h"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
    ],
    install_requires=[
        "numpy>=1.24",
        "pyyaml",
        "tokenizers>=0.15",
        "soundfile",
        "onnxruntime>=1.17",
        "gguf>=0.10",
        "llama-cpp-python>=0.3.16",
        "threadpoolctl>=3",
    ],
    extras_require={
        "demo": ["onnx"],
        "play": ["sounddevice"],
        "tensorrt": ["tensorrt", "pycuda"],
        "test": ["pytest", "onnx", "ruff", "safetensors"],
    },
    entry_points={
        "console_scripts": [
            f"moss_tts = {PACKAGE}.tools.cli:main",
            f"moss_tts_node = {PACKAGE}.ros.node:main",
            f"moss_tts_player = {PACKAGE}.ros.player:main",
        ],
    },
)
