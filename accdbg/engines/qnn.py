"""The real QNN runtime, through the ``onnxruntime-qnn`` plugin execution provider.

``-r htp`` (and ``dsp``, ``dspv68`` ... ``dspv79``) selects the HTP backend, ``libQnnHtp.so``,
which runs the NPU's kernels in emulation on an x86_64 Linux host and on the NPU itself on a
Snapdragon host. ``dspvNN`` also sets ``htp_arch`` and a matching ``soc_model``.
"""

from __future__ import annotations

import os
import platform

import onnxruntime as ort

from accdbg.engines.base import Engine, EngineOptions, base_session_options, register
from accdbg.errors import AccdbgError

RUNTIMES = (
    "cpu",
    "gpu",
    "dsp",
    "dspv65",
    "dspv66",
    "dspv68",
    "dspv69",
    "dspv73",
    "dspv75",
    "dspv79",
    "htp",
)
ARCHITECTURES = (
    "x86_64-linux-clang",
    "aarch64-android",
    "aarch64-android-clang6.0",
    "aarch64-windows-msvc",
    "wos",
)
# HTP architecture -> a SoC of that generation (QNN soc_model ids), needed e.g. for fp16.
SOC_FOR_ARCH = {"68": "30", "69": "36", "73": "43", "75": "57", "79": "69"}
DEFAULT_HTP_ARCH = "75"

_registered = False


def qnn_package():
    try:
        import onnxruntime_qnn
    except ImportError:
        raise AccdbgError(
            "the QNN engine needs the package 'onnxruntime-qnn' (pip install onnxruntime-qnn, Linux x86_64 "
            "or Windows on Snapdragon); without it use --engine simulation (onnxruntime CPU fake-quant)"
        ) from None
    return onnxruntime_qnn


def ensure_registered() -> None:
    """Register the plugin EP library once per process (a second registration fails)."""
    global _registered
    if _registered:
        return
    q = qnn_package()
    try:
        ort.register_execution_provider_library(q.get_ep_name(), q.get_library_path())
    except Exception as exc:
        if "already" not in str(exc).lower():
            raise AccdbgError(
                f"onnxruntime could not load the QNN execution provider: {exc}"
            ) from None
    _registered = True


def qnn_version() -> str:
    q = qnn_package()
    info = q.build_and_package_info
    return f"onnxruntime-qnn {info.__version__} (QNN {getattr(info, 'qnn_version', '?')})"


@register
class QnnEngine(Engine):
    name = "qnn"
    label = "QNN"
    isolated = True

    def backend(self, options: EngineOptions) -> tuple[str, dict[str, str]]:
        """Backend library and provider options for ``-r``."""
        q = qnn_package()
        rt = options.runtime.lower()
        if rt not in RUNTIMES:
            raise AccdbgError(
                f"-r/--runtime {options.runtime!r} is not known; expected one of: {', '.join(RUNTIMES)}"
            )
        if rt in ("dspv65", "dspv66"):
            raise AccdbgError(
                f"-r {rt} is the pre-HTP Hexagon DSP, whose QNN backend (libQnnDsp.so) is not shipped in "
                f"{qnn_version()}; use -r htp or -r dspv68 and newer"
            )
        if rt == "cpu":
            path, opts = q.get_qnn_cpu_path(), {}
        elif rt == "gpu":
            path, opts = q.get_qnn_gpu_path(), {}
        else:
            arch = rt[len("dspv") :] if rt.startswith("dspv") else None
            path, opts = q.get_qnn_htp_path(), {}
            if arch:
                opts["htp_arch"] = arch
            soc = options.soc_model or SOC_FOR_ARCH.get(arch or DEFAULT_HTP_ARCH)
            if options.soc_model or options.precision == "fp16":
                opts["soc_model"] = soc
            if options.precision == "fp16":
                opts["enable_htp_fp16_precision"] = "1"
            if options.perf_profile:
                opts["htp_performance_mode"] = options.perf_profile
        if not os.path.exists(path):
            lib = os.path.basename(path)
            raise AccdbgError(
                f"-r {rt}: the QNN backend library {lib} is not shipped in {qnn_version()} for this host; "
                "use -r htp (HTP emulation on x86_64) or --engine simulation"
            )
        return path, opts

    def check_host(self, options: EngineOptions) -> None:
        arch = options.architecture
        if arch not in ARCHITECTURES:
            raise AccdbgError(
                f"-a/--architecture {arch!r} is not known; expected one of: {', '.join(ARCHITECTURES)}"
            )
        host = platform.machine().lower()
        if arch != "x86_64-linux-clang" or host not in ("x86_64", "amd64"):
            if not (host in ("aarch64", "arm64") and arch.startswith("aarch64")):
                raise AccdbgError(
                    f"-a {arch}: that device is not reachable from this {host} host - accdbg runs QNN in this "
                    "process through onnxruntime-qnn (no adb/remote devices); use -a x86_64-linux-clang here "
                    "(HTP emulation), or run accdbg on the device itself"
                )
        self.backend(options)

    def session_options(self, options: EngineOptions, verbose_log: bool) -> ort.SessionOptions:
        ensure_registered()
        path, provider = self.backend(options)
        provider = {"backend_path": path, **provider, **options.extra_provider_options}
        if options.json_graph_dir:
            os.makedirs(options.json_graph_dir, exist_ok=True)
            provider.update(
                {"dump_json_qnn_graph": "1", "json_qnn_graph_dir": options.json_graph_dir}
            )
        if options.profiling_level:
            provider["profiling_level"] = options.profiling_level
            if options.profiling_path:
                provider["profiling_file_path"] = options.profiling_path
        so = base_session_options(verbose_log)
        if options.disable_cpu_fallback:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
        if not devices:
            raise AccdbgError("onnxruntime lists no QNN device after registering onnxruntime-qnn")
        so.add_provider_for_devices(devices, provider)
        return so
