"""Model Explorer on a run: its source model with its overlays, on a local port, offline.

Model Explorer's server serves its own bundled web app (no CDN); its check for a newer release
on PyPI and GitHub is replaced, so nothing leaves the machine.
"""

from __future__ import annotations

from pathlib import Path

from accdbg.core.imports import without
from accdbg.core.jsonio import read_json
from accdbg.errors import AccdbgError
from accdbg.reports.model_explorer.overlays import (
    ADAPTER,
    ADAPTER_ID,
    DIRNAME,
    MANIFEST,
    Overlays,
    log,
)


def read_overlays(run_dir: str | Path) -> Overlays:
    """The overlays of a run folder (or of its ``model_explorer/`` folder)."""
    run_dir = Path(run_dir)
    for folder in (run_dir / DIRNAME, run_dir):
        path = folder / MANIFEST
        if path.is_file():
            break
    else:
        raise AccdbgError(
            f"--model_explorer_view {str(run_dir)!r}: no {DIRNAME}/{MANIFEST} there; expected a "
            "verification, oneshot, snooping, dissection, fix search or quant checker run folder "
            "written with --model_explorer"
        )
    data = read_json(path, "Model Explorer overlays")
    model = Path(data["model"])
    if not model.is_file():
        raise AccdbgError(f"{path}: its model {str(model)!r} is gone")
    files = [f for f in data["files"] if (folder / f["file"]).is_file()]
    return Overlays(
        folder, model, data["graph"], files, data.get("unmatched", []), notes=data.get("notes", [])
    )


def serve(
    run_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, open_browser: bool = True
) -> None:
    """Model Explorer on the run's source model with its overlays, until Ctrl-C.

    The server serves its own bundled web app (no CDN); its check for a newer release on
    PyPI and GitHub is turned off, so nothing leaves the machine.
    """
    overlays = read_overlays(run_dir)
    if port != 8080 and _in_use(host, port):  # 8080: Model Explorer finds a free port itself
        raise AccdbgError(
            f"--port {port} is already in use on {host}; choose another, or leave the default "
            "(8080 takes the first free port from 8080 to 8099)"
        )
    with without(("torch", "IPython")):
        import model_explorer
        from model_explorer import server

    server._check_new_version = _offline_version  # type: ignore[attr-defined]
    config = model_explorer.config()
    config.add_model_from_path(str(overlays.model), adapterId=ADAPTER_ID)
    for path in overlays.paths:
        config.add_node_data_from_path(str(path))
    log.info(
        "Model Explorer: %s with %d overlay(s): %s",
        overlays.model,
        len(overlays.files),
        ", ".join(f["name"] for f in overlays.files),
    )
    model_explorer.visualize_from_config(
        config, host=host, port=port, extensions=[ADAPTER], no_open_in_browser=not open_browser
    )


def _in_use(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, port)) == 0


def _offline_version(print_msg: bool = True) -> dict[str, str]:
    return {"version": "", "runningVersion": "", "releaseUrl": "", "desktopAppUrl": ""}
