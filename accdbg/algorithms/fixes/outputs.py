"""What a fix search leaves: the table, the report, the best fix's files and its command.

``fixes.csv`` / ``fixes.html`` (every measurement, the accepted path, output SQNR against
cost with the Pareto front), ``best.encodings`` (AIMET encodings exported from the best
candidate's QDQ model: ``--inference_engine -qo`` takes them and quantizes to exactly these
encodings), ``best_overrides.json`` (the candidate's own onnxruntime ``TensorQuantOverrides``),
``best.onnx`` (only when the fix changes weights: equalization) and ``reproduce.txt``.
"""

from __future__ import annotations

import math
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from accdbg.algorithms.diagnosis.sensitivity import scores
from accdbg.core import onnx_model as om
from accdbg.core.run_dir import write_json_atomic
from accdbg.encodings.qdq import export_qdq_encodings
from accdbg.reports.cells import escape, safe_frame, shorten
from accdbg.reports.html_report import findings_html

CSV_COLUMNS = (
    "round",
    "change",
    "scope",
    "layer",
    "status",
    "accepted",
    "SQNR mean",
    "SQNR worst",
    "cosine mean",
    "cosine worst",
    "top-1 agreement",
    "gap closed",
    "16-bit tensors",
    "Convert ops",
    "landed",
    "float change",
    "cpu nodes",
    "reason",
    "why",
    "config",
    "seconds",
    "note",
)


def cost(row: pd.Series | dict) -> float:
    """What a fix costs on the device: 16-bit activation tensors plus Convert ops."""
    a, b = row.get("16-bit tensors"), row.get("Convert ops")
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return math.nan
    return float(a) + float(b)


def pareto(df: pd.DataFrame) -> pd.Series:
    """True for measurements no other one beats on both SQNR (higher) and cost (lower)."""
    ok = df[(df["status"] == "ok") & df["cost"].notna() & df["SQNR mean"].notna()]
    front = pd.Series(False, index=df.index)
    for i, r in ok.iterrows():
        dominated = (
            (ok["cost"] <= r["cost"])
            & (ok["SQNR mean"] >= r["SQNR mean"])
            & ((ok["cost"] < r["cost"]) | (ok["SQNR mean"] > r["SQNR mean"]))
        ).any()
        front[i] = not dominated
    return front


def reproduce_command(
    model: Path,
    input_list: str | Path | None,
    input_tensors: Sequence,
    settings: dict,
    runtime: str,
    encodings: Path,
    weights_bitwidth: int,
    param_quantizer: str,
    judged: Sequence[str] = (),
) -> str:
    """The ``--inference_engine`` command that quantizes to the best fix's encodings on QNN;
    it dumps the graph outputs, or with ``judged`` (the logits a Softmax/Sigmoid output is
    judged at, when they are not outputs) those tensors."""
    cmd = ["qnn-accuracy-debugger", "--inference_engine", "-m", str(model), "-r", runtime]
    if input_list:
        cmd += ["-l", str(Path(input_list).absolute())]
    for t in input_tensors:
        cmd += ["-i", t.name, ",".join(str(d) for d in t.dims), str(Path(t.path).absolute())]
    if settings.get("per_channel"):
        cmd.append("--per_channel_quantization")
    if settings.get("act_quantizer", "tf") != "tf":
        cmd += ["--act_quantizer", settings["act_quantizer"]]
    if settings.get("act_bitwidth", 8) != 8:
        cmd += ["-abw", str(settings["act_bitwidth"])]
    if weights_bitwidth != 8:
        cmd += ["-wbw", str(weights_bitwidth)]
    if param_quantizer != "tf":
        cmd += ["-pq", param_quantizer]
    cmd += ["-qo", str(encodings)]
    cmd += ["--add_layer_outputs", ",".join(judged)] if judged else ["--debug_mode_off"]
    return shlex.join(cmd)


def _judged_if_not_outputs(prepared: onnx.ModelProto, model: Path) -> list[str]:
    """The tensors the search judged the outputs at, when any is not a graph output, named as
    in the user's ``model`` (a reshape the pre-processing put before a Softmax is followed back
    to the tensor of the model it reshapes)."""
    judged = scores(prepared, set(om.all_tensor_names(om.load_model(model))))
    return judged if set(judged) != {o.name for o in prepared.graph.output} else []


def write(
    path: Path,
    final: Path,
    setup,
    table: pd.DataFrame,
    best: dict,
    base: dict,
    accepted,
    culprits,
    notes: list[str],
    input_tensors: Sequence,
    input_list,
) -> dict[str, Any]:
    """Every output file; ``path`` is the run folder being written, ``final`` its name once
    finished (the paths the reproduce command gives)."""
    table = table.copy()
    table["cost"] = [cost(r) for _, r in table.iterrows()]
    table["Pareto"] = pareto(table)
    cols = [c for c in (*CSV_COLUMNS, "cost", "Pareto") if c in table.columns]
    safe_frame(table[cols]).to_csv(path / "fixes.csv", index=False)
    folder = path / "candidates" / best["folder"]
    enc = path / "best.encodings"
    export_qdq_encodings(
        folder / "candidate.qdq.onnx",
        enc,
        overwrite=True,
        shown_as=(
            final / "candidates" / best["folder"] / "candidate.qdq.onnx",
            final / "best.encodings",
        ),
    )
    settings = best.get("settings") or {}
    write_json_atomic(
        path / "best_overrides.json",
        {
            "TensorQuantOverrides": settings.get("overrides", {}),
            "quantizer": {
                k: settings.get(k) for k in ("per_channel", "act_bitwidth", "act_quantizer")
            },
        },
    )
    model = setup.model_path
    if (folder / "float.onnx").exists():
        shutil.copyfile(folder / "float.onnx", path / "best.onnx")
        model = final / "best.onnx"
    cmd = reproduce_command(
        model,
        input_list,
        input_tensors,
        settings,
        setup.options.runtime,
        final / "best.encodings",
        setup.quant.weights_bitwidth,
        setup.quant.param_quantizer,
        _judged_if_not_outputs(setup.prepared, setup.model_path),
    )
    (path / "reproduce.txt").write_text(cmd + "\n", encoding="utf-8")
    write_json_atomic(
        path / "best.json",
        {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in best.items()
            if k != "settings"
        }
        | {"settings": settings, "reproduce": cmd},
    )
    lines = findings(culprits, best, base, accepted, notes)
    _html(path / "fixes.html", table, cols, lines, notes, cmd)
    return {"reproduce": cmd}


def changed_by_fix(model, accepted) -> tuple[dict, list[str]]:
    """What the accepted changes changed, per node of the float model: {candidate names:
    detail} (a weight lands on the node using it, an activation on its producer, an
    equalized pair on both Convs), and the global knobs, which change every node alike."""
    from accdbg.algorithms.fixes import candidates as C

    marks: dict[str | tuple[str, ...], str] = {}
    glob: list[str] = []
    pairs = {p.label: p for p in C.pairs_of(model, accepted)}
    for c in accepted:
        if c.is_global:
            glob.append(f"the best fix changes every layer: {c.label}")
        elif c.kind in C.WEIGHT_KINDS:
            marks[(c.target, c.layer)] = c.label
        elif c.kind == "act16":
            for t in C.act16_region(model, c.target):
                marks[t] = c.label
        elif c.kind == "equalize" and c.target in pairs:
            p = pairs[c.target]
            marks[(p.producer, p.producer_out)] = c.label
            marks[(p.consumer, p.consumer_out)] = c.label
    return marks, glob


def overlays(path: Path, final: Path, setup, accepted, culprits) -> None:
    """Model Explorer overlays on the float model: "changed by fix" marks on what the best
    fix changed, and the diagnosis' culprit ranking when one was given."""
    from accdbg.reports.model_explorer import overlay_run

    marks, glob = changed_by_fix(setup.prepared, accepted)
    table = pd.DataFrame(
        {
            "Name": [c.name for c in culprits],
            "culprit_rank": pd.array([c.rank for c in culprits], dtype="Int64"),
            "cause": [c.cause for c in culprits],
        }
    )
    overlay_run(
        path,
        [path / "fixes.html"],
        setup.model_path,
        table,
        "Name",
        {},
        marks={"changed by fix": marks},
        final_dir=final,
        notes=glob,
    )


def findings(culprits, best: dict, base: dict, accepted, notes) -> list[str]:
    """The console's last lines: the cause, the best fix, before and after."""
    out = []
    if culprits:
        c = culprits[0]
        out.append(f"cause: culprit #{c.rank} {c.name} - {c.cause}")
    else:
        out.append("cause: no culprit in the diagnosis (global knobs only)")
    if accepted:
        out.append("best fix (verified on QNN HTP): " + " + ".join(a.label for a in accepted))
        gap = best.get("gap closed")
        top = best.get("top-1 agreement")
        top_b = base.get("top-1 agreement")
        out.append(
            f"before: output SQNR {_f(base.get('SQNR mean'))} dB (worst input {_f(base.get('SQNR worst'))}), "
            f"cosine {_f(base.get('cosine mean'), 5)}"
            + (f", top-1 agreement {_f(top_b, 3)}" if top_b is not None and not _nan(top_b) else "")
            + f" -> after: {_f(best.get('SQNR mean'))} dB (worst input {_f(best.get('SQNR worst'))}), "
            f"cosine {_f(best.get('cosine mean'), 5)}"
            + (f", top-1 agreement {_f(top, 3)}" if top is not None and not _nan(top) else "")
            + (
                f"; {100 * gap:.0f}% of the gap to float closed"
                if gap is not None and not _nan(gap)
                else ""
            )
        )
    else:
        out.append(
            f"no candidate raised the output SQNR ({_f(base.get('SQNR mean'))} dB) by "
            "0.1 dB or more on QNN HTP"
        )
    return out


def _nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def _f(x, digits: int = 2) -> str:
    try:
        return f"{float(x):.{digits}f}"
    except (TypeError, ValueError):
        return "n/a"


CHART_LABEL = 28  # characters of a change shown beside its point (the rest on hover)


def _chart(table: pd.DataFrame) -> str:
    ok = table[(table["status"] == "ok") & table["cost"].notna()]
    fig = go.Figure()
    for name, sel, color in (
        ("measured", ~ok["accepted"] & ~ok["Pareto"], "#1f5fa8"),
        ("Pareto front", ~ok["accepted"] & ok["Pareto"], "#e07b00"),
        ("accepted", ok["accepted"], "#6a1b9a"),
    ):
        part = ok[sel]
        labelled = name != "measured"  # the accepted path and the front say what they are
        fig.add_trace(
            go.Scatter(
                x=part["cost"],
                y=part["SQNR mean"],
                mode="markers+text" if labelled else "markers",
                name=name,
                marker={"size": 11, "color": color},
                text=[shorten(c, CHART_LABEL) for c in part["change"]] if labelled else None,
                textposition="top center",
                hovertext=[
                    f"{c}<br>{cfg}" for c, cfg in zip(part["change"], part["config"], strict=True)
                ],
                hoverinfo="text+x+y",
            )
        )
    front = ok[ok["Pareto"]].sort_values("cost")
    fig.add_trace(
        go.Scatter(
            x=front["cost"],
            y=front["SQNR mean"],
            mode="lines",
            name="Pareto front (line)",
            line={"color": "#e07b00", "dash": "dot"},
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        xaxis_title="cost: 16-bit tensors + Convert ops in the QNN graph",
        yaxis_title="output SQNR on QNN HTP (dB, mean over inputs)",
        height=460,
        margin={"l": 60, "r": 20, "t": 30, "b": 60},
    )
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def _html(path: Path, table: pd.DataFrame, cols, lines, notes, cmd: str) -> None:
    rows = []
    for _, r in table.iterrows():
        cls = ' class="accepted"' if r.get("accepted") else ""
        cells = "".join(f"<td>{escape(_cell(r.get(c)))}</td>" for c in cols)
        rows.append(f"<tr{cls}>{cells}</tr>")
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>accdbg fix search</title>
<style>
body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;vertical-align:top}} tr.accepted{{background:#efe3f7}}
.findings li{{margin:.2em 0}} .table-wrap{{overflow:auto;max-height:70vh;max-width:100%}} code{{background:#f4f4f4;padding:2px 4px;word-break:break-all}}
</style>
<script>{get_plotlyjs()}</script></head><body>
<h1>accdbg fix search</h1>
{findings_html(lines)}
{"<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>" if notes else ""}
<h2>Reproduce the best result</h2><p><code>{escape(cmd)}</code></p>
<h2>Output SQNR against cost (QNN HTP)</h2>{_chart(table)}
<h2>Every candidate measured</h2>
<p>Each row was quantized with the inference engine's pipeline and run on QNN HTP over every input;
the accepted path is highlighted. Rows of a round are measured on top of the changes accepted before it.</p>
<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>
</body></html>
"""
    path.write_text(doc, encoding="utf-8")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.4g}"
    return str(v)
