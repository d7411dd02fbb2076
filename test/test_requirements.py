"""setup.py's dependency ranges hold the versions tested: requirements.txt's pins (`make test`, on each Python)
and .ci/requirements-lowest.txt (CI's run on Humble's Python); llama-cpp-python is the one the bridge is written
against."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moss_tts_node.llama.bridge import LLAMA_CPP_PYTHON_VERSION

requirements = pytest.importorskip("packaging.requirements")
utils = pytest.importorskip("packaging.utils")

ROOT = Path(__file__).resolve().parent.parent
# The Pythons of the distros the package is tested for: Humble's, Debian 12's, Jazzy's.
PYTHONS = ("3.10", "3.11", "3.12")
LOWEST_PYTHON = "3.10"  # .ci/run installs .ci/requirements-lowest.txt there


def install_requires() -> dict[str, object]:
    """setup.py's install_requires, by normalized name, read from its source."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            parsed = [requirements.Requirement(text) for text in ast.literal_eval(node.value)]
            return {utils.canonicalize_name(r.name): r.specifier for r in parsed}
    raise AssertionError("setup.py has no install_requires")


def pins(path: Path, python: str) -> dict[str, str]:
    """name -> version of each ``name==version`` line of a requirements file that applies to ``python``."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        text = line.partition("#")[0].strip()
        if not text:
            continue
        requirement = requirements.Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"python_version": python}):
            name = utils.canonicalize_name(requirement.name)
            assert name not in found, f"{path.name} pins {name} twice for Python {python}"
            found[name] = str(requirement.specifier).removeprefix("==")
    return found


@pytest.mark.parametrize(
    ("pinned", "python"),
    [*(("requirements.txt", python) for python in PYTHONS), (".ci/requirements-lowest.txt", LOWEST_PYTHON)],
)
def test_the_tested_versions_are_inside_the_ranges(pinned: str, python: str) -> None:
    versions = pins(ROOT / pinned, python)
    ranges = install_requires()
    assert set(ranges) <= set(versions), f"{pinned} lacks {sorted(set(ranges) - set(versions))}"
    outside = {name: versions[name] for name, spec in ranges.items() if versions[name] not in spec}
    assert not outside, f"{pinned} pins versions setup.py does not allow: {outside}"


def test_the_lowest_versions_pin_only_runtime_dependencies() -> None:
    assert set(pins(ROOT / ".ci" / "requirements-lowest.txt", LOWEST_PYTHON)) == set(install_requires())


def test_the_ranges_take_what_apt_ros_ships() -> None:
    ranges = install_requires()
    for name, shipped in (("numpy", "1.26.4"), ("pyyaml", "5.4.1"), ("pyyaml", "6.0.1")):
        assert shipped in ranges[name], f"{name} {shipped} (apt ROS Humble/Jazzy) is outside {ranges[name]}"
    assert "2.4.6" in ranges["numpy"]
    # Humble's numpy 1.21.5 is one patch below onnxruntime's floor: pip installs 1.21.6 beside it.
    assert "1.21.5" not in ranges["numpy"] and "1.21.6" in ranges["numpy"]


def test_each_distro_python_is_tested_with_that_distro_numpy() -> None:
    requirements_txt = ROOT / "requirements.txt"
    assert pins(requirements_txt, "3.12")["numpy"] == "1.26.4"  # Jazzy's
    assert pins(requirements_txt, "3.10")["numpy"] == pins(ROOT / ".ci" / "requirements-lowest.txt", "3.10")["numpy"]
    assert pins(requirements_txt, "3.10")["numpy"] == "1.21.6"  # the floor nearest Humble's 1.21.5


def test_llama_cpp_python_is_the_version_the_bridge_is_written_against() -> None:
    assert str(install_requires()["llama-cpp-python"]) == f"=={LLAMA_CPP_PYTHON_VERSION}"


@pytest.mark.parametrize("python", PYTHONS)
def test_the_http_pins_are_inside_the_http_extras_ranges(python: str) -> None:
    """requirements-http.txt (`make test`'s HTTP server) pins what setup.py's [http] extra allows, on each Python."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            extras = ast.literal_eval(node.value)
    ranges = {utils.canonicalize_name(r.name): r.specifier for r in map(requirements.Requirement, extras["http"])}
    versions = pins(ROOT / "requirements-http.txt", python)
    assert set(ranges) <= set(versions), f"requirements-http.txt lacks {sorted(set(ranges) - set(versions))}"
    assert all(versions[name] in spec for name, spec in ranges.items()), (ranges, versions)
