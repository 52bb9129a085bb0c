"""Which frameworks are installed, at which version: ``-f FRAMEWORK [VERSION]``.

Versions are read from the installed distributions' metadata, never by importing the
framework (importing TensorFlow alone takes seconds). A framework whose package is missing is
reported with the pip extra that installs it, in one line.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from accdbg.errors import AccdbgError
from accdbg.frameworks.base import get_runner_class


@dataclass(frozen=True)
class FrameworkPackage:
    """How a framework is installed: any of ``distributions`` provides ``module``."""

    distributions: tuple[str, ...]
    module: str
    extra: str | None  # pip install accdbg[extra]; None: a base dependency


FRAMEWORK_PACKAGES: dict[str, FrameworkPackage] = {
    "onnx": FrameworkPackage(("onnx", "onnxruntime"), "onnxruntime", None),
    "tflite": FrameworkPackage(
        ("ai-edge-litert", "ai-edge-litert-nightly"), "ai_edge_litert.interpreter", "tflite"
    ),
    "tensorflow": FrameworkPackage(
        ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tensorflow-macos", "tf-nightly"),
        "tensorflow",
        "tensorflow",
    ),
    "pytorch": FrameworkPackage(("torch",), "torch", "torch"),
}

_VERSION = re.compile(r"^\d+(\.\d+)*$")


def install_hint(framework: str) -> str:
    pkg = FRAMEWORK_PACKAGES.get(framework)
    if pkg is None or pkg.extra is None:
        return "pip install accdbg"
    return f"pip install accdbg[{pkg.extra}]"


def installed_versions(framework: str) -> dict[str, str]:
    """``{distribution: version}`` for each installed distribution providing the framework."""
    found: dict[str, str] = {}
    for dist in FRAMEWORK_PACKAGES[framework].distributions:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def unavailable(framework: str) -> AccdbgError:
    return AccdbgError(f"framework {framework!r} is not available: {install_hint(framework)}")


def check_available(framework: str) -> None:
    """Fail with the package to install when the framework's module cannot be found; finds
    it without importing it (the import happens where the model runs, maybe a child)."""
    name = FRAMEWORK_PACKAGES[framework].module
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module set to None
        found = False
    if not found:
        raise unavailable(framework)


def require(framework: str, module: str | None = None) -> ModuleType:
    """Import the framework's module (or ``module``) or fail with the package to install."""
    name = module or FRAMEWORK_PACKAGES[framework].module
    try:
        return importlib.import_module(name)
    except ImportError:
        raise unavailable(framework) from None
    except Exception as exc:  # a broken install: say which, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise AccdbgError(
            f"framework {framework!r} is installed but {name} failed to import "
            f"({type(exc).__name__}: {first}); reinstall with: {install_hint(framework)}"
        ) from None


def _release(version: str) -> list[int]:
    """``'2.13.0+cpu'`` -> ``[2, 13, 0]`` (local and pre-release tags dropped)."""
    head = re.match(r"^\d+(\.\d+)*", version.split("+")[0])
    return [int(p) for p in head.group(0).split(".")] if head else []


def version_matches(wanted: str, installed: str) -> bool:
    """``'2.21'`` matches 2.21.x; ``'2.21.0'`` matches 2.21.0 only (2.21 == 2.21.0 too)."""
    want, have = _release(wanted), _release(installed)
    if not want or not have:
        return False
    pad = have + [0] * max(0, len(want) - len(have))
    return pad[: len(want)] == want


def check_framework(values: Sequence[str]) -> str:
    """``['TFLite', '2.3']`` -> ``'tflite'``, after checking the version against the installed one."""
    if not values or len(values) > 2:
        raise AccdbgError(
            f"-f/--framework takes a framework and an optional version, e.g. 'tensorflow 2.21'; got {list(values)!r}"
        )
    name = values[0].strip().lower()
    get_runner_class(name)  # unknown framework: one line listing the supported ones
    if len(values) == 1:
        return name
    wanted = values[1].strip()
    if not _VERSION.match(wanted):
        raise AccdbgError(
            f"-f/--framework {name}: version {wanted!r} must be numbers separated by dots, e.g. 2.21 or 2.21.0"
        )
    found = installed_versions(name)
    if not found:
        raise unavailable(name)
    if any(version_matches(wanted, v) for v in found.values()):
        return name
    have = ", ".join(f"{d} {v}" for d, v in found.items())
    raise AccdbgError(
        f"-f/--framework {name} {wanted}: the installed version is {have}, not {wanted}; "
        f"install {name} {wanted} or drop the version from -f"
    )
