"""``--quant_checker``: flags in, :func:`~accdbg.algorithms.quant_checker.run_quant_checker` out.

Spellings of Qualcomm's ``qnn-quantization-checker`` (``--activation_width``,
``--weight_width``, ``--bias_width``, ``--generate_histogram``, ``--per_channel_histogram``)
are accepted beside accdbg's own.
"""

from __future__ import annotations

import argparse
import logging

from accdbg.cli import args as A
from accdbg.core.inputs import parse_input_tensor

NAME = "quant_checker"
HELP = (
    "check every weight, bias and activation under each quantizer variant, before running anything"
)
log = logging.getLogger("accdbg")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from accdbg.algorithms.quant_checker.run import MAX_PLOT_POINTS, PLOT_CHOICES, PLOT_LIMIT, SEED
    from accdbg.algorithms.quant_checker.tables import SQNR_THRESHOLD
    from accdbg.algorithms.quant_checker.variants import PER_CHANNEL_CHOICES
    from accdbg.engines.quantize import QUANTIZERS

    g = parser.add_argument_group("model and calibration data")
    g.add_argument("-m", "--model_path", required=True, help="the float model (ONNX, or see -f)")
    g.add_argument(
        "-f",
        "--framework",
        nargs="+",
        default=["onnx"],
        help="framework and optional version (default onnx); tflite, tensorflow and pytorch "
        "models are converted to ONNX first (needs -i)",
    )
    g.add_argument(
        "-l",
        "--input_list",
        help="calibration inputs, one inference per line (qnn-net-run style); without -l and -i "
        "only the weights are checked",
    )
    g.add_argument(
        "-i",
        "--input_tensor",
        nargs="+",
        action="append",
        default=[],
        metavar="INPUT_TENSOR",
        help='"name" dims path [dtype]: input dims (and the one calibration input when no -l)',
    )
    A.add_allow_nonfinite(g)
    q = parser.add_argument_group("variants")
    q.add_argument(
        "--quantizers",
        default=",".join(QUANTIZERS),
        help=f"comma-separated --act_quantizer/--param_quantizer values to compare "
        f"(default {','.join(QUANTIZERS)})",
    )
    q.add_argument(
        "--per_channel_variants",
        choices=PER_CHANNEL_CHOICES,
        default="both",
        help="each quantizer with per-tensor and per-channel weights (both, default), or only one",
    )
    q.add_argument(
        "-abw",
        "--act_bitwidth",
        "--activation_width",
        dest="act_bitwidth",
        type=int,
        choices=(8, 16),
        default=8,
    )
    q.add_argument(
        "-wbw",
        "--weights_bitwidth",
        "--weight_width",
        dest="weights_bitwidth",
        type=int,
        choices=(8, 16),
        default=8,
    )
    q.add_argument(
        "-bbw",
        "--bias_bitwidth",
        "--bias_width",
        dest="bias_bitwidth",
        type=int,
        choices=(8, 32),
        default=32,
        help="32 (QNN's QDQ path takes int32 biases only)",
    )
    q.add_argument(
        "-qo",
        "--quantization_overrides",
        help="AIMET encodings JSON (legacy or 1.0.0) applied to every variant, as the engine applies -qo",
    )
    c = parser.add_argument_group("checks and output")
    c.add_argument(
        "--sqnr_threshold",
        type=float,
        default=SQNR_THRESHOLD,
        help=f"a tensor fails a variant below this SQNR in dB (default {SQNR_THRESHOLD:g}, as Qualcomm's checker)",
    )
    c.add_argument(
        "--plots",
        choices=PLOT_CHOICES,
        default="failing",
        help="which tensors get histogram, CDF, difference and min/max plots (default: failing)",
    )
    c.add_argument(
        "--generate_histogram",
        dest="plots",
        action="store_const",
        const="all",
        help="same as --plots all",
    )
    c.add_argument(
        "--per_channel_plots",
        "--per_channel_histogram",
        dest="per_channel_plots",
        action="store_true",
        help="also plot each channel's range and SQNR (Per_channel.png) for the plotted tensors",
    )
    c.add_argument(
        "--plot_limit",
        type=int,
        default=PLOT_LIMIT,
        help=f"with --plots failing, plot at most this many, best-ranked first (default {PLOT_LIMIT})",
    )
    c.add_argument(
        "--max_plot_points",
        type=int,
        default=MAX_PLOT_POINTS,
        help=f"largest random sample of a tensor kept for its plots (default {MAX_PLOT_POINTS:,})",
    )
    c.add_argument("--seed", type=int, default=SEED, help=f"seed of the samples (default {SEED})")
    c.add_argument(
        "--memory_budget_mb",
        type=float,
        default=4096,
        help="most megabytes of activations computed at once (default 4096)",
    )
    A.ModelExplorerArgs().add(parser)
    A.CommonArgs(NAME).add(parser)


def run(args: argparse.Namespace) -> int:
    from accdbg.algorithms.quant_checker import run_quant_checker
    from accdbg.frameworks.versions import check_framework

    framework = check_framework(args.framework)
    result = run_quant_checker(
        args.model_path,
        framework=framework,
        input_list=args.input_list,
        input_tensors=[parse_input_tensor(v) for v in args.input_tensor],
        quantizers=args.quantizers,
        per_channel_variants=args.per_channel_variants,
        act_bitwidth=args.act_bitwidth,
        weights_bitwidth=args.weights_bitwidth,
        bias_bitwidth=args.bias_bitwidth,
        sqnr_threshold=args.sqnr_threshold,
        plots_mode=args.plots,
        per_channel_plots=args.per_channel_plots,
        plot_limit=args.plot_limit,
        max_plot_points=args.max_plot_points,
        seed=args.seed,
        memory_budget_mb=args.memory_budget_mb,
        quantization_overrides=args.quantization_overrides,
        working_dir=args.working_dir,
        output_dirname=args.output_dirname,
        allow_nonfinite_inputs=args.allow_nonfinite_inputs,
        options_record=A.options_dict(args),
        model_explorer=args.model_explorer,
    )
    del result  # the findings and the report path are logged by the run
    return 0
