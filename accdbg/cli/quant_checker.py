"""``--quant_checker``: flags in, :func:`~accdbg.algorithms.quant_checker.run_quant_checker` out.

Spellings of Qualcomm's ``qnn-quantization-checker`` (``--activation_width``,
``--weight_width``, ``--bias_width``, ``--generate_histogram``, ``--per_channel_histogram``)
are accepted beside accdbg's own.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, dataclass
from typing import Any

from accdbg.algorithms.quant_checker.run import MAX_PLOT_POINTS, PLOT_CHOICES, PLOT_LIMIT, SEED
from accdbg.algorithms.quant_checker.tables import SQNR_THRESHOLD
from accdbg.algorithms.quant_checker.variants import PER_CHANNEL_CHOICES
from accdbg.cli import args as A
from accdbg.engines.options import QuantOptions
from accdbg.engines.quantize import QUANTIZERS

NAME = "quant_checker"
HELP = (
    "check every weight, bias and activation under each quantizer variant, before running anything"
)
log = logging.getLogger("accdbg")


@dataclass(frozen=True)
class VariantOptions:
    """Which quantizer variants are compared, at which bitwidths, with which ``-qo``."""

    quantizers: str = ",".join(QUANTIZERS)
    per_channel_variants: str = "both"
    act_bitwidth: int = QuantOptions.act_bitwidth
    weights_bitwidth: int = QuantOptions.weights_bitwidth
    bias_bitwidth: int = QuantOptions.bias_bitwidth
    quantization_overrides: str | None = None

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


class VariantArgs(A.ArgGroup):
    def add(self, parser: argparse.ArgumentParser) -> None:
        V = VariantOptions
        q = parser.add_argument_group("variants")
        q.add_argument(
            "--quantizers",
            default=V.quantizers,
            help=f"comma-separated --act_quantizer/--param_quantizer values to compare "
            f"(default {V.quantizers})",
        )
        q.add_argument(
            "--per_channel_variants",
            choices=PER_CHANNEL_CHOICES,
            default=V.per_channel_variants,
            help="each quantizer with per-tensor and per-channel weights (both, default), or only one",
        )
        q.add_argument(
            "-abw",
            "--act_bitwidth",
            "--activation_width",
            dest="act_bitwidth",
            type=int,
            choices=(8, 16),
            default=V.act_bitwidth,
        )
        q.add_argument(
            "-wbw",
            "--weights_bitwidth",
            "--weight_width",
            dest="weights_bitwidth",
            type=int,
            choices=(8, 16),
            default=V.weights_bitwidth,
        )
        q.add_argument(
            "-bbw",
            "--bias_bitwidth",
            "--bias_width",
            dest="bias_bitwidth",
            type=int,
            choices=(8, 32),
            default=V.bias_bitwidth,
            help="32 (QNN's QDQ path takes int32 biases only)",
        )
        q.add_argument(
            "-qo",
            "--quantization_overrides",
            default=V.quantization_overrides,
            help="AIMET encodings JSON (legacy or 1.0.0) applied to every variant, as the engine applies -qo",
        )

    def parse(self, args: argparse.Namespace) -> VariantOptions:
        return VariantOptions(
            args.quantizers,
            args.per_channel_variants,
            args.act_bitwidth,
            args.weights_bitwidth,
            args.bias_bitwidth,
            args.quantization_overrides,
        )


@dataclass(frozen=True)
class CheckOptions:
    """What fails, what is plotted, and how much is held at once."""

    sqnr_threshold: float = SQNR_THRESHOLD
    plots_mode: str = "failing"
    per_channel_plots: bool = False
    plot_limit: int = PLOT_LIMIT
    max_plot_points: int = MAX_PLOT_POINTS
    seed: int = SEED
    memory_budget_mb: float = 4096
    encoding_rules: str | None = None  # a JSON/YAML file: rules turned off, their parameters

    def keywords(self) -> dict[str, Any]:
        return asdict(self)


class CheckArgs(A.ArgGroup):
    def add(self, parser: argparse.ArgumentParser) -> None:
        C = CheckOptions
        c = parser.add_argument_group("checks and output")
        c.add_argument(
            "--sqnr_threshold",
            type=float,
            default=C.sqnr_threshold,
            help=f"a tensor fails a variant below this SQNR in dB (default {C.sqnr_threshold:g}, "
            "as Qualcomm's checker)",
        )
        c.add_argument(
            "--plots",
            choices=PLOT_CHOICES,
            default=C.plots_mode,
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
            default=C.plot_limit,
            help=f"with --plots failing, plot at most this many, best-ranked first (default {C.plot_limit})",
        )
        c.add_argument(
            "--max_plot_points",
            type=int,
            default=C.max_plot_points,
            help=f"largest random sample of a tensor kept for its plots (default {C.max_plot_points:,})",
        )
        c.add_argument(
            "--seed", type=int, default=C.seed, help=f"seed of the samples (default {C.seed})"
        )
        c.add_argument(
            "--encoding_rules",
            default=None,
            metavar="FILE",
            help='a JSON/YAML file of encoding rules: {"disable": [ids], "params": {id: '
            "{...}}} (rules: concat-one-range, add-one-range, norm-16bit, int4-supported)",
        )
        c.add_argument(
            "--memory_budget_mb",
            type=float,
            default=C.memory_budget_mb,
            help=f"most megabytes of activations computed at once (default {C.memory_budget_mb:g})",
        )

    def parse(self, args: argparse.Namespace) -> CheckOptions:
        return CheckOptions(
            args.sqnr_threshold,
            args.plots,
            bool(args.per_channel_plots),
            args.plot_limit,
            args.max_plot_points,
            args.seed,
            args.memory_budget_mb,
            args.encoding_rules,
        )


MODEL = A.CalibrationArgs(
    model_help="the float model (ONNX, or see -f)",
    framework_help="framework and optional version (default onnx); tflite, tensorflow and "
    "pytorch models are converted to ONNX first (needs -i)",
    input_list_help="calibration inputs, one inference per line (qnn-net-run style); without -l "
    "and -i only the weights are checked",
    input_tensor_help='"name" dims path [dtype]: input dims (and the one calibration input when no -l)',
    title="model and calibration data",
)
VARIANTS = VariantArgs()
CHECKS = CheckArgs()
EXPLORER = A.ModelExplorerArgs()
COMMON = A.CommonArgs(NAME)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    MODEL.add(parser)
    VARIANTS.add(parser)
    CHECKS.add(parser)
    EXPLORER.add(parser)
    COMMON.add(parser)


def run(args: argparse.Namespace) -> int:
    from accdbg.algorithms.quant_checker import run_quant_checker

    model = MODEL.parse(args)
    model.check_output_tensors(
        "the quantization checker checks every weight, bias and activation of the model"
    )
    result = run_quant_checker(
        model.model_path,
        framework=model.framework,
        input_list=model.input_list,
        input_tensors=model.input_tensors,
        **VARIANTS.parse(args).keywords(),
        **CHECKS.parse(args).keywords(),
        **COMMON.parse(args).keywords(),
        allow_nonfinite_inputs=model.allow_nonfinite_inputs,
        options_record=A.options_dict(args),
        model_explorer=EXPLORER.parse(args),
    )
    del result  # the findings and the report path are logged by the run
    return 0
