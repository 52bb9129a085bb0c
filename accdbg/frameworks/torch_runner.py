"""PyTorch modules, one golden tensor per module call, collected with forward hooks.

The model is given as one of:

* ``-m model.py:factory`` - a Python file and the name of a callable in it that returns the
  ``torch.nn.Module`` (weights loaded, as the user's code does it). The file is executed: it
  is the user's own code, like ``python model.py``.
* ``-m model.pt2`` - an ``ExportedProgram`` saved with ``torch.export.save``; it is unflattened
  back into its module hierarchy so the same hooks see the same module names.

``-i name dims raw [dtype]`` names the ``forward`` arguments (``-i x 1,3,224,224 x.raw``).

Tensor names are module paths (``features.0``); the n-th further call of a module that runs
several times is ``features.0@n`` (``torch.export``'s spelling), the i-th tensor of a module
returning several is ``name:i``, and the model's own outputs are ``output`` (``output:i``).
A module whose output is the very tensor another module already returned (a ``Sequential``
and its last child, an ``Identity``) adds nothing and is skipped. ``op_type`` is the module's
class name. TorchScript files are refused: their submodules run inside TorchScript, where
forward hooks are never called.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import re
import sys
import warnings
import weakref
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from accdbg.errors import AccdbgError
from accdbg.frameworks.base import FrameworkRunner, register
from accdbg.frameworks.layouts import LaidOutTensorInfo
from accdbg.frameworks.names import first_line, near
from accdbg.frameworks.versions import require

_FACTORY = re.compile(r"^(?P<file>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_.]*)$")


@dataclass(frozen=True)
class ModuleOutput:
    """Where a golden tensor comes from: module path, call number, position in its output."""

    module: str
    call: int
    output_index: int
    outputs: int


@dataclass
class LoadedModel:
    """The module to hook, and what export and naming need to know about it."""

    module: Any  # torch.nn.Module
    exported: Any | None  # torch.export.ExportedProgram when loaded from .pt2
    input_names: list[str] | None  # forward's parameters; None when it takes *args
    required: int  # how many of them have no default
    class_names: dict[str, str]  # module path -> class name


def load_model(spec: str | Path) -> LoadedModel:
    """Load ``file.py:factory`` or an ExportedProgram ``.pt2``; one-line errors otherwise."""
    torch = require("pytorch")
    text = str(spec)
    m = _FACTORY.match(text)
    if m:
        return _load_factory(torch, Path(m["file"]), m["name"])
    path = Path(text)
    if not path.exists():
        hint = (
            "" if text.endswith(".pt2") else " (give model.py:factory or an ExportedProgram .pt2)"
        )
        raise AccdbgError(f"--model_path {text!r} does not exist{hint}")
    if path.suffix == ".py":
        raise AccdbgError(
            f"--model_path {text!r}: name the function that builds the module, e.g. {text}:build_model"
        )
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
        if any(n.split("/", 1)[-1].startswith("code/") for n in names) and not any(
            "serialized_exported_program" in n or n.split("/", 1)[-1].startswith("models/")
            for n in names
        ):
            raise AccdbgError(
                f"--model_path {text!r} is a TorchScript file; per-module outputs need forward hooks, which "
                f"TorchScript does not run. Save torch.export.save(torch.export.export(model, args), 'model.pt2') "
                f"or pass -m model.py:factory"
            )
    try:
        with warnings.catch_warnings():  # deprecation chatter from torch's own pytree code
            warnings.simplefilter("ignore")
            exported = torch.export.load(str(path))
    except Exception as exc:
        raise AccdbgError(
            f"--model_path {text!r} is not an ExportedProgram saved with torch.export.save "
            f"({first_line(exc)}); a state_dict holds weights, not the network: pass -m model.py:factory"
        ) from None
    classes: dict[str, str] = {}
    for node in exported.graph.nodes:
        for fqn, cls in (node.meta.get("nn_module_stack") or {}).values():
            classes.setdefault(fqn, _class_name(cls))
    names = list(exported.graph_signature.user_inputs)
    try:
        module = torch.export.unflatten(exported)
    except Exception as exc:
        raise AccdbgError(
            f"--model_path {text!r}: torch.export.unflatten failed: {first_line(exc)}"
        ) from None
    return LoadedModel(module, exported, names, len(names), classes)


def _load_factory(torch, file: Path, name: str) -> LoadedModel:
    file = file.expanduser().absolute()
    if not file.is_file():
        raise AccdbgError(f"--model_path {str(file)!r} does not exist")
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
    spec = importlib.util.spec_from_file_location(f"accdbg_user_model_{digest}", file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent))  # the file may import its neighbours
    try:
        spec.loader.exec_module(module)
        obj: Any = module
        for part in name.split("."):
            if not hasattr(obj, part):
                raise AccdbgError(
                    f"--model_path {str(file)!r} has no {name!r}{near(part, dir(obj))}"
                )
            obj = getattr(obj, part)
        model = obj() if callable(obj) and not isinstance(obj, torch.nn.Module) else obj
    except AccdbgError:
        raise
    except Exception as exc:
        raise AccdbgError(
            f"--model_path {str(file)}:{name} failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    finally:
        if sys.path and sys.path[0] == str(file.parent):
            sys.path.pop(0)
    if not isinstance(model, torch.nn.Module):
        raise AccdbgError(
            f"--model_path {str(file)}:{name} returned {type(model).__name__}, not a torch.nn.Module"
        )
    model.eval()
    names, required = _forward_params(model)
    classes = {fqn: type(mod).__name__ for fqn, mod in model.named_modules()}
    return LoadedModel(model, None, names, required, classes)


def _forward_params(model) -> tuple[list[str] | None, int]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return None, 0
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None, 0
    names = [p.name for p in params]
    required = sum(1 for p in params if p.default is p.empty)
    return names, required


def _class_name(cls: Any) -> str:
    text = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return text.rsplit(".", 1)[-1]


@register
class TorchRunner(FrameworkRunner):
    """Every module call's output, recorded by forward hooks; one forward per request."""

    name = "pytorch"
    layout = None  # as the model defines it: the ONNX export keeps the same axes

    def activate(self) -> None:
        self.torch = require("pytorch")
        self.loaded = load_model(self.model_path)
        self.input_order = self._order_inputs()
        self._tensors: list[LaidOutTensorInfo] = []
        self.origins: dict[str, ModuleOutput] = {}
        self._records: dict[str, np.ndarray] = {}

    def model_input_order(self) -> list[str]:
        return list(self.input_order)

    def _order_inputs(self) -> list[str]:
        """-i names in the order ``forward`` takes them."""
        given = [t.name for t in self.inputs]
        names, required = self.loaded.input_names, self.loaded.required
        if names is None:
            return given
        expected = ", ".join(names) or "(none)"
        for g in given:
            if g not in names:
                raise AccdbgError(
                    f"--input_tensor {g!r} is not an argument of the model's forward; its arguments are: {expected}"
                )
        positions = sorted(names.index(g) for g in given)
        if positions != list(range(len(given))) or len(given) < required:
            missing = next(n for n in names[: max(required, len(given))] if n not in given)
            raise AccdbgError(
                f"model input {missing!r} has no --input_tensor; the model's forward takes: {expected}"
            )
        return [names[i] for i in positions]

    def tensors(self) -> list[LaidOutTensorInfo]:
        if not self._tensors:
            self._tensors = self._forward({t.name: t.load() for t in self.inputs}, want=None)[1]
        return self._tensors

    def check_outputs(self, names: Sequence[str]) -> None:
        known = [i.name for i in self.tensors()]
        for name in names:
            if name not in known:
                raise AccdbgError(
                    f"-o/--output_tensor {name!r} is not a module output of the model{near(name, known)}"
                )

    def infer(self, feeds, outputs):
        values, _ = self._forward(feeds, want=set(outputs))
        missing = [n for n in outputs if n not in values]
        if missing:
            raise AccdbgError(
                f"the model did not produce {missing[0]!r} on this run (control flow?)"
            )
        return values

    def _forward(
        self, feeds, want: set[str] | None
    ) -> tuple[dict[str, np.ndarray], list[LaidOutTensorInfo]]:
        """One forward with hooks on every module. ``want`` None: list tensors, keep no data."""
        torch = self.torch
        model = self.loaded.module
        calls: Counter[str] = Counter()
        seen: dict[int, tuple[weakref.ref, int]] = {}  # id -> (tensor, version) already recorded
        values: dict[str, np.ndarray] = {}
        infos: list[LaidOutTensorInfo] = []
        module_names = set(self.loaded.class_names)
        out_name = "output" if "output" not in module_names else "model_output"

        def record(fqn: str, output: Any) -> None:
            call = calls[fqn]
            calls[fqn] += 1
            leaves = [
                t for t in torch.utils._pytree.tree_leaves(output) if isinstance(t, torch.Tensor)
            ]
            for i, t in enumerate(leaves):
                key = out_name if fqn == "" else (fqn if call == 0 else f"{fqn}@{call}")
                name = key if len(leaves) == 1 else f"{key}:{i}"
                prior = seen.get(id(t))
                if prior is not None and prior[0]() is t and prior[1] == t._version:
                    continue  # the same tensor another module returned: nothing new
                seen[id(t)] = (weakref.ref(t), t._version)
                if want is None:
                    infos.append(self._info(name, key, fqn, t, len(infos)))
                    self.origins[name] = ModuleOutput(fqn, call, i, len(leaves))
                elif name in want:
                    values[name] = _to_numpy(torch, t)

        handles = [
            mod.register_forward_hook(lambda _m, _a, out, fqn=fqn: record(fqn, out))
            for fqn, mod in model.named_modules()
        ]
        try:
            args = [torch.from_numpy(np.array(feeds[n])) for n in self.input_order]
            with torch.no_grad():
                model(*args)
        except AccdbgError:
            raise
        except Exception as exc:
            raise AccdbgError(
                f"the model's forward failed on the given inputs: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        finally:
            for h in handles:
                h.remove()
        return values, infos

    def _info(self, name: str, key: str, fqn: str, t, index: int) -> LaidOutTensorInfo:
        cls = self.loaded.class_names.get(fqn, type(t).__name__)
        return LaidOutTensorInfo(
            name=name,
            node=key,
            op_type=cls,
            index=index,
            dtype=_to_numpy(self.torch, t.new_zeros(())).dtype,
            shape=tuple(int(s) for s in t.shape),
            layout=None,
        )

    def deactivate(self) -> None:
        self.loaded = None


def _to_numpy(torch, t) -> np.ndarray:
    """A detached copy; bfloat16 (which numpy lacks) widened to float32."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy().copy()
