"""``--model_explorer_view RUN_DIR``: Model Explorer on a run's model with its overlays."""

from __future__ import annotations

import argparse

NAME = "model_explorer_view"
HELP = "open Model Explorer (local server, offline) on a run's model with its overlays"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="a run folder holding model_explorer/ (verification, oneshot, snooping, "
        "dissection, fix search, quant checker)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (local only)")
    parser.add_argument(
        "--port",
        type=int,
        default=8080,
        help="port; 8080 (default) takes the first free one from 8080 to 8099",
    )
    parser.add_argument(
        "--no_browser", action="store_true", help="only print the address, open no browser"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="verbose logging, and tracebacks on errors"
    )


def run(args: argparse.Namespace) -> int:
    from accdbg.reports.model_explorer import serve

    serve(args.run_dir, args.host, args.port, open_browser=not args.no_browser)
    return 0
