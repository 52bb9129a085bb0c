"""Every culprit a run names, confirmed on QNN HTP by its fix.

The ranking's measures run on onnxruntime's CPU; what a user wants to know is what changes on
the device. For each named culprit the run builds, with the engine's own pipeline:

* the **counterfactual** - its region (the layer and the tensors that carry its error) kept
  in fp16 on HTP, the rest of the model exactly as quantized: whether it is the culprit at
  all. Under :attr:`~accdbg.algorithms.diagnosis.policy.Policy.confirm_db` of gain it is not
  named (it is listed with what was tried);
* the **changes its kind calls for** (:func:`~accdbg.algorithms.fixes.candidates.changes_for`:
  per-channel or 16-bit weights, 16-bit activations on it and its readers, equalization, a
  mask clamped, the activation kept...), each quantized again;

and measures each on QNN - graph outputs only (their logits when judged there), every
debugged input - on the executor's workers (:class:`~accdbg.algorithms.fixes.search.Search`,
the fix search's measuring loop: a crash is a result). The cheapest change within
:attr:`~accdbg.algorithms.diagnosis.policy.Policy.within_db` of the counterfactual is the
culprit's ``verified_fix``. When no culprit is confirmed and the outputs fail their
thresholds, the model-wide changes are measured instead.
"""

from __future__ import annotations

import logging
import math
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from accdbg.algorithms.checkpoint import JOURNAL, Journal
from accdbg.algorithms.diagnosis.culprit import (
    BEFORE_RUN,
    CALIBRATION,
    MASK,
    Change,
    Culprit,
    Verified,
)
from accdbg.algorithms.diagnosis.policy import POLICY, Policy
from accdbg.algorithms.diagnosis.sensitivity import scores
from accdbg.algorithms.fixes import candidates as C
from accdbg.algorithms.fixes.measure import float_outputs, save_reference
from accdbg.algorithms.fixes.search import Search, Setup, axes_of, weight_type
from accdbg.core.executors import ExecutorConfig
from accdbg.core.inputs import InputTensor
from accdbg.core.progress import stage
from accdbg.core.run_dir import final_of
from accdbg.core.tensor_store import safe_relpath
from accdbg.encodings.qdq import export_qdq_encodings
from accdbg.engines.options import EngineConfig

log = logging.getLogger("accdbg.verify")

FIXES_DIR = "fixes"
# what says whether a layer is the culprit at all: its region in fp16 on HTP, else (when QNN
# cannot run that) in 16-bit integers
COUNTERFACTUALS = (
    "float_region",
    "region16",
)  # in the run being written: each verified fix's encodings or model


@dataclass
class Verification:
    """The culprits confirmed on QNN (re-numbered), those that were not, and the lines."""

    culprits: list[Culprit]
    unconfirmed: list[Culprit]
    baseline_db: float
    findings: list[str] = field(default_factory=list)
    global_rows: list[dict[str, Any]] = field(default_factory=list)
    sessions: int = 0


@dataclass(frozen=True)
class FixContext:
    """What the verification needs of the run: its models, inputs and options, where to
    write, and the command that ran it (the fix's command is that one with the fix)."""

    prepared: Path  # the float model as prepared for QNN
    qdq: Path  # the QDQ model the run ran
    feeds: list  # per debugged input: name -> (path, dims, dtype name)
    config: EngineConfig
    work: Path  # scratch: candidates, journal (removed by the caller)
    out: Path  # the run folder being written (the fixes' files go in its fixes/)
    final: Path  # that folder's name once finished (what the commands name)
    command: tuple[str, ...] = ()  # the run's command line, without the fix
    executor: ExecutorConfig | None = None
    clamps: dict[str, float] = field(default_factory=dict)  # a mask constant -> its clamp

    @classmethod
    def of_run(
        cls,
        qdq: Path,
        feeds: list,
        config: EngineConfig,
        run_dir: Path,
        command: Sequence[str],
        executor: ExecutorConfig | None = None,
    ) -> FixContext:
        """The context of a run whose QDQ model ``qdq`` sits beside its prepared float model
        (and the defects found quantizing it); written into ``run_dir`` (being written)."""
        from accdbg.algorithms.diagnosis.ranking.defects import defects_beside

        stem = qdq.name.removesuffix(".qdq.onnx")
        clamps = {
            d.constant: float(d.extra["clamp"])
            for d in defects_beside(qdq)
            if d.extra.get("clamp") is not None  # the run clamped it (an infinite scale too)
        }
        return cls(
            qdq.with_name(f"{stem}.prepared.onnx"),
            qdq,
            feeds,
            config,
            run_dir / ".verify",
            run_dir,
            final_of(run_dir),
            tuple(command),
            executor,
            clamps,
        )


@stage("culprit verification on QNN", line=False)  # its line: "verification on QNN: N session(s)"
def verify_ranking(ranking, ctx: FixContext):
    """A :class:`~accdbg.algorithms.diagnosis.ranking.Ranking` with its culprits measured on
    QNN (:class:`Verifier`) and what was measured applied (:func:`applied`); the scratch
    folder removed."""
    verifier = Verifier(ctx)
    try:
        out = verifier.verify(ranking.culprits, ranking.outputs_pass is False)
    finally:
        verifier.close()
        shutil.rmtree(ctx.work, ignore_errors=True)
    log.info("verification on QNN: %d session(s)", out.sessions)
    return applied(ranking, out)


def run_command(
    framework: str,
    model_path: str | Path,
    inputs: Sequence[InputTensor],
    input_list: str | Path | None,
    config: EngineConfig,
) -> tuple[str, ...]:
    """The oneshot command line of this run (what a fix's command adds its change to)."""
    q = config.quant
    cmd = ["qnn-accuracy-debugger", "-f", framework, "-m", str(Path(model_path).absolute())]
    for t in inputs:
        dims = ",".join(map(str, t.dims))
        cmd += ["-i", t.name, dims, str(Path(t.path).absolute()), t.dtype.name]
    if input_list:
        cmd += ["-l", str(Path(input_list).absolute())]
    cmd += ["-r", config.backend.runtime]
    for flag, value, default in (
        ("-abw", q.act_bitwidth, 8),
        ("-wbw", q.weights_bitwidth, 8),
        ("--act_quantizer", q.act_quantizer, "tf"),
        ("-pq", q.param_quantizer, "tf"),
    ):
        if value != default:
            cmd += [flag, str(value)]
    if q.per_channel:
        cmd.append("--per_channel_quantization")
    if q.keep_activations:
        cmd.append("--keep_removable_activations")
    if q.overrides is not None:
        cmd += ["-qo", str(q.overrides.absolute())]
    return tuple(cmd)


def _gain(res: dict, base: dict) -> float:
    """What a change gains the outputs' SQNR on QNN: the median over the debugged inputs of
    its gain on each (a change is not judged by the one input it cannot help, nor made by
    one it alone helps); the gain of the mean noise when per-input figures are missing."""
    if res.get("status") != "ok" or base.get("status") != "ok":
        return math.nan
    mine, theirs = res.get("SQNR inputs") or [], base.get("SQNR inputs") or []
    if mine and len(mine) == len(theirs):
        each = [
            0.0 if math.isinf(a) and math.isinf(b) else min(a - b, 200.0)
            for a, b in zip(map(float, mine), map(float, theirs), strict=True)
        ]
        return float(np.median(each))
    return float(res["SQNR mean"]) - float(base["SQNR mean"])


def _cost(res: dict, change: Change) -> float:
    """What a change costs on the device: its 16-bit tensors and Convert ops, a region in
    fp16 counted as its tensors twice over (float is dearer than 16-bit integers)."""
    if change.kind in COUNTERFACTUALS:
        return 2.0 * len(change.target.split(","))
    a, b = res.get("16-bit tensors"), res.get("Convert ops")
    return sum(0.0 if x is None or not math.isfinite(float(x)) else float(x) for x in (a, b))


class Verifier:
    """One run's verification: the fix search's measuring loop over the run's own model."""

    def __init__(self, ctx: FixContext, policy: Policy = POLICY):
        self.ctx, self.policy = ctx, policy
        ctx.work.mkdir(parents=True, exist_ok=True)
        prepared = onnx.load(str(ctx.prepared), load_external_data=False)
        judged = scores(prepared)
        reference = ctx.work / "float_outputs.npz"
        save_reference(reference, float_outputs(prepared, judged, ctx.feeds))
        quant = ctx.config.quant
        self.setup = Setup(
            ctx.prepared,
            prepared,
            ctx.prepared,
            ctx.feeds,
            reference,
            ctx.config.engine_options(),
            quant,
            axes_of(prepared),
            judged,
            baseline_model=ctx.qdq,
            clamps=dict(ctx.clamps),
        )
        workers = max(1, min(2, (ctx.executor.workers if ctx.executor else 2) or 2))
        self.search = Search(
            self.setup,
            ctx.work,
            Journal(ctx.work / JOURNAL),
            workers,
            weight_type(quant),
            ctx.executor,
        )
        self.search.label = "culprits verified on QNN"

    def close(self) -> None:
        self.search.close()

    def _changes(self, c: Culprit) -> list[Change]:
        """The counterfactual first, then what its kind calls for."""
        q = self.ctx.config.quant
        region = [t for t in dict.fromkeys(c.region or (c.name,)) if t]
        out = [Change("float_region", ",".join(region), c.name, f"culprit #{c.rank}")]
        int4 = C.int4_weights(self.setup.prepared, q.weights_bitwidth)
        own, _ = C.changes_for(self.setup.prepared, c, q.per_channel, q.act_bitwidth, int4=int4)
        if c.kind == MASK and c.source not in self.setup.clamps:
            own = [x for x in own if x.kind != "clamp_mask"]
        return out + own

    def verify(self, culprits: Sequence[Culprit], outputs_fail: bool) -> Verification:
        """Measure each culprit's changes on QNN (one batch over the workers), confirm or
        drop it, and pick its fix; with none confirmed and failing outputs, the global
        knobs. Returns the culprits with their :class:`Verified` set."""
        chosen = list(culprits)[: self.policy.verify_max]
        per: list[list[Change]] = [self._changes(c) for c in chosen]
        configs: list[list[Change]] = [[]] + [[x] for changes in per for x in changes]
        results = self.search._many(configs)
        base, rest = results[0], iter(results[1:])
        baseline = float(base["SQNR mean"]) if base.get("status") == "ok" else math.nan
        measured = [[(x, next(rest)) for x in changes] for changes in per]
        # a region QNN cannot run in fp16 (a Quantize it cannot place after a float op, an op
        # it cannot finalize in fp16): the same region in 16-bit integers is the
        # counterfactual, in one more batch
        for fallback in ("region16",):
            again = [
                (i, self._fallback(fallback, rows[0][0]))
                for i, rows in enumerate(measured)
                if not any(
                    res.get("status") == "ok" for x, res in rows if x.kind in COUNTERFACTUALS
                )
            ]
            if again:
                results = self.search._many([[x] for _, x in again])
                for (i, x), res in zip(again, results, strict=True):
                    measured[i].insert(1, (x, res))
        confirmed, dropped = [], []
        for c, rows in zip(chosen, measured, strict=True):
            c.verified = self._judge(c, rows, base)
            kept = c.verified.confirmed or c.verified.refused  # unverifiable: as the CPU ranked
            (confirmed if kept else dropped).append(c)
        confirmed += [c for c in culprits[len(chosen) :]]  # past the verified: as ranked
        for r, c in enumerate(confirmed, start=1):
            c.rank = r
        out = Verification(confirmed, dropped, baseline, sessions=self.search.sessions)
        if outputs_fail and _best(out) is None:  # no culprit's change measured to help
            out.global_rows = self._globals(base)
            out.sessions = self.search.sessions
        out.findings = self._lines(out)
        return out

    @staticmethod
    def _fallback(kind: str, first: Change) -> Change:
        """The next counterfactual after ``first`` (the region in fp16) was refused: the same
        region in 16-bit integers (not the layer alone: an outlier's error is in the ranges of
        the layers it reaches, which the layer alone in fp16 keeps)."""
        return Change(kind, first.target, first.layer, first.why)

    def _judge(self, c: Culprit, rows: list[tuple[Change, dict]], base: dict) -> Verified:
        """The counterfactual's gain decides; the cheapest change near it is the fix."""
        p = self.policy
        tried = []
        for x, res in rows:
            gain = _gain(res, base)
            tried.append(
                {
                    "change": x.label,
                    "kind": x.kind,
                    "gain_db": None if math.isnan(gain) else round(gain, 3),
                    "status": res.get("status", ""),
                    "reason": (res.get("reason") or "")[:300],
                    "cost": _cost(res, x),
                    "folder": res.get("folder", ""),
                }
            )
        counter = next(
            (
                t["gain_db"]
                for t in tried
                if t["kind"] in COUNTERFACTUALS and t["gain_db"] is not None
            ),
            None,
        )
        float_gain = math.nan if counter is None else float(counter)
        before_run = c.kind in (*BEFORE_RUN, CALIBRATION)  # found, not ranked: its fix decides
        best_gain = max((t["gain_db"] for t in tried if t["gain_db"] is not None), default=None)
        if best_gain is not None and best_gain < p.confirm_db:
            best_gain = None
        confirmed = (math.isfinite(float_gain) and float_gain >= p.confirm_db) or (
            before_run and best_gain is not None and best_gain >= p.confirm_db
        )
        if before_run and math.isnan(float(base.get("SQNR mean", math.nan))):
            confirmed = True  # the model as quantized does not run: structural, named
        # a mask this run clamped already (its encodings could not hold it: the model as given
        # does not run on QNN): confirmed by that; its fix is the clamp, which no gain measures
        clamped = c.kind == MASK and bool(c.source) and c.source in self.setup.clamps
        confirmed = confirmed or clamped
        # the fix: a change a user can make (not the counterfactual), the cheapest within
        # within_db of the most any measured change gained; else the best that gains at all
        real = [
            (t, x)
            for t, (x, _) in zip(tried, rows, strict=True)
            if x.kind not in COUNTERFACTUALS and t["gain_db"] is not None
        ]
        ceiling = max([float_gain, *(t["gain_db"] for t, _ in real)], default=math.nan)
        near = [(t, x) for t, x in real if t["gain_db"] >= ceiling - p.within_db]
        if not near:
            near = [max(real, key=lambda tx: tx[0]["gain_db"])] if real else []
            near = [(t, x) for t, x in near if t["gain_db"] >= p.confirm_db]
        fix, gain, command = "", math.nan, ""
        clamp = [(t, x) for t, (x, _) in zip(tried, rows, strict=True) if x.kind == "clamp_mask"]
        if clamped and clamp and clamp[0][0]["status"] == "ok":
            t, x = clamp[0]
            fix, command = x.label, self._command(c, x, t["folder"])
        elif confirmed and near:
            t, x = min(near, key=lambda tx: (tx[0]["cost"], -tx[0]["gain_db"]))
            fix, gain = x.label, float(t["gain_db"])
            command = self._command(c, x, t["folder"])
        refused = (
            not any(t["status"] == "ok" for t in tried if t["kind"] in COUNTERFACTUALS)
            and base.get("status") == "ok"
        )
        return Verified(
            float(base["SQNR mean"]) if base.get("status") == "ok" else math.nan,
            float_gain,
            fix,
            gain,
            bool(confirmed),
            tried,
            command,
            refused=refused and not confirmed,
        )

    def _globals(self, base: dict) -> list[dict[str, Any]]:
        q = self.ctx.config.quant
        int4 = bool(C.int4_weights(self.setup.prepared, q.weights_bitwidth))
        knobs = C.global_changes(q.per_channel, q.act_bitwidth, q.act_quantizer, int4)
        results = self.search._many([[k] for k in knobs])
        rows = []
        for k, res in zip(knobs, results, strict=True):
            gain = _gain(res, base)
            rows.append({"change": k.label, "gain_db": gain, "status": res.get("status", "")})
            if math.isfinite(gain) and gain >= self.policy.global_min_db:
                rows[-1]["command"] = self._command(None, k, res.get("folder", ""))
        return sorted(rows, key=lambda r: -r["gain_db"] if math.isfinite(r["gain_db"]) else 0)

    def _command(self, c: Culprit | None, x: Change, folder: str) -> str:
        """The run's command with the fix: its encodings (``-qo``) for a change of encodings,
        the flag for a model-wide knob, the edited model (``-m``) for a clamped mask."""
        cmd = list(self.ctx.command)
        if not cmd:
            return ""
        flags = {
            "per_channel_all": ["--per_channel_quantization"],
            "act16_all": ["-abw", "16"],
            "keep_activation": ["--keep_removable_activations"],
        }
        if x.kind in flags:
            return shlex.join(cmd + flags[x.kind])
        if x.kind == "w8_all":  # the default 8-bit weights: the run's -wbw 4 dropped
            return shlex.join(_without(cmd, ("-wbw", "--weights_bitwidth", "--weight_block_size")))
        if x.kind == "calibration":
            return shlex.join(cmd + ["--act_quantizer", x.target])
        if x.kind == "recalibrate":  # the given encodings dropped, min/max on the inputs
            return shlex.join(_without(cmd, ("-qo", "--quantization_overrides", "--act_quantizer")))
        fixes = self.ctx.out / FIXES_DIR
        fixes.mkdir(parents=True, exist_ok=True)
        stem = safe_relpath(f"{c.name if c else 'global'}.{x.kind}").replace("/", "_")
        cand = self.ctx.work / "candidates" / folder
        if x.kind == "clamp_mask":
            src = cand / "float.onnx"
            if not src.is_file():
                return ""
            model = fixes / f"{stem}.onnx"
            model.write_bytes(src.read_bytes())
            return shlex.join(_with_model(cmd, self.ctx.final / FIXES_DIR / model.name))
        qdq = cand / "candidate.qdq.onnx"
        if not qdq.is_file():
            return ""
        enc = fixes / f"{stem}.encodings"
        final = self.ctx.final / FIXES_DIR / enc.name  # where the finished run has it
        export_qdq_encodings(qdq, enc, overwrite=True, shown_as=("the fix's QDQ model", final))
        return shlex.join(cmd + ["-qo", str(final)])

    def _lines(self, out: Verification) -> list[str]:
        """The findings: what QNN confirmed, what it did not, and the best change last."""
        lines = []
        for c in out.unconfirmed:
            v = c.verified
            tried = ", ".join(
                f"{t['change']} {_db(t['gain_db'])}" if t["gain_db"] is not None else t["status"]
                for t in v.tried
            )
            lines.append(
                f"not a culprit on QNN: {c.name} - ranked #{c.rank} by the CPU measures, but its "
                f"region kept in fp16 gains {_db(v.float_gain_db)} on QNN HTP (under "
                f"{self.policy.confirm_db:g} dB; tried: {tried})"
            )
        best = _best(out)
        if best is not None:
            what, gain, cmd = best
            n = len(self.ctx.feeds)
            outputs = {o.name for o in self.setup.prepared.graph.output}
            at = "outputs" if set(self.setup.judged) <= outputs else "outputs' logits"
            where = (
                f"the median over {n} inputs"
                if n > 1
                else f"{at} {out.baseline_db:.1f} -> {out.baseline_db + gain:.1f} dB SQNR"
            )
            lines.append(
                f"fix: {what}: {_db(gain)} on QNN HTP (measured, {where})"
                f"{' -> ' + cmd if cmd else ''}"
            )
        elif out.global_rows:
            lines.append(
                "no single change measured on QNN HTP helps: "
                + ", ".join(f"{r['change']} {_db(r['gain_db'])}" for r in out.global_rows)
            )
        return lines


def _best(out: Verification) -> tuple[str, float, str] | None:
    """The best measured change: the first confirmed culprit's fix, else the best global."""
    for c in out.culprits:
        v = c.verified
        if v is not None and v.confirmed and v.fix and math.isfinite(v.gain_db):
            return f"{v.fix} ({c.name})", v.gain_db, v.command
    ok = [r for r in out.global_rows if r.get("command")]
    if ok:
        r = ok[0]
        return r["change"], r["gain_db"], r["command"]
    return None


def _db(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "not measured"
    return f"{x:+.1f} dB"


def _without(cmd: list[str], flags: tuple[str, ...]) -> list[str]:
    """The command without these flags and their values."""
    out, i = [], 0
    while i < len(cmd):
        if cmd[i] in flags and i + 1 < len(cmd):
            i += 2
            continue
        out.append(cmd[i])
        i += 1
    return out


def _with_model(cmd: list[str], model: Path) -> list[str]:
    out, i = [], 0
    while i < len(cmd):
        if cmd[i] in ("-m", "--model_path") and i + 1 < len(cmd):
            out += [cmd[i], str(model)]
            i += 2
            continue
        out.append(cmd[i])
        i += 1
    return out


def verified_columns(culprits: Sequence[Culprit]) -> dict[str, dict[str, object]]:
    """The table's verified columns, by row name."""
    from accdbg.algorithms.diagnosis.ranking.measures import VERIFIED_FIX, VERIFIED_GAIN

    out: dict[str, dict[str, object]] = {}
    for c in culprits:
        v = c.verified
        if v is None:
            continue
        out[c.name] = {
            VERIFIED_FIX: v.fix
            or (
                "none within reach"
                if v.confirmed
                else "not verifiable on QNN"
                if v.refused
                else "not confirmed"
            ),
            VERIFIED_GAIN: v.gain_db if math.isfinite(v.gain_db) else None,
        }
    return out


def applied(ranking, out: Verification):
    """The ranking with what QNN measured: unconfirmed culprits lose their rank (their cause
    says what was tried), the others are numbered again and carry their verified fix; the
    findings end with the best measured change. ``ranking``: a
    :class:`~accdbg.algorithms.diagnosis.ranking.Ranking`."""
    from accdbg.algorithms.diagnosis.ranking.measures import CAUSE, RANK, RULES_COL

    cols = ranking.columns

    def fired(name: str, rule_id: str) -> None:
        row = cols.setdefault(name, {})
        row[RULES_COL] = ", ".join(x for x in (row.get(RULES_COL) or "", rule_id) if x)

    for c in out.unconfirmed:
        fired(c.name, "unconfirmed")
        c.rules = (*c.rules, "unconfirmed")
    for c in out.culprits:
        if c.verified is not None and c.verified.confirmed:
            fired(c.name, "confirmed")
            c.rules = (*c.rules, "confirmed")
    old = {c.name: c for c in ranking.culprits}
    names = {c.name for c in out.unconfirmed}
    for c in out.unconfirmed:
        row = cols.setdefault(c.name, {})
        row.pop(RANK, None)
        v = c.verified
        first = v.tried[0] if v.tried else {}
        why = (
            f"{_db(v.float_gain_db)}"
            if math.isfinite(v.float_gain_db)
            else f"nothing measurable ({first.get('status', '')}: {first.get('reason', '')[:200]})"
        )
        row[CAUSE] = (
            f"{row.get(CAUSE, c.cause)}; not confirmed on QNN HTP: its region in fp16 gains {why}"
        )
    for c in out.culprits:
        cols.setdefault(c.name, {})[RANK] = c.rank
    for name, values in verified_columns([*out.culprits, *out.unconfirmed]).items():
        cols.setdefault(name, {}).update(values)
    lines, dropped_at = [], None
    for line in ranking.findings:
        hit = next((n for n in old if line.startswith("culprit #") and f": {n} (" in line), None)
        if hit in names:
            dropped_at = len(lines) if dropped_at is None else dropped_at
            continue
        if hit is not None:
            c = old[hit]
            head, _, rest = line.partition(f": {hit} (")
            line = f"culprit #{c.rank}: {hit} ({rest}{_verified_words(c.verified)}"
        lines.append(line)
    if names and not out.culprits:
        lines.insert(
            dropped_at or 0,
            "no culprit confirmed on QNN HTP: the layers the CPU measures named do not gain "
            f"{POLICY.confirm_db:g} dB with their region in fp16 (below) - the error is the "
            "model's, a global change is the question",
        )
    lines += out.findings
    ranking.culprits = list(out.culprits)
    ranking.unconfirmed = list(out.unconfirmed)
    ranking.findings = lines
    return ranking


def _verified_words(v: Verified | None) -> str:
    if v is None:
        return ""
    if v.refused:
        return (
            "; not verified on QNN HTP: QNN runs its region neither in fp16 nor in 16 bits - "
            "named as the CPU measures rank it"
        )
    if math.isnan(v.baseline_db) and v.confirmed:
        return "; on QNN HTP: the model as quantized does not run"
    if v.confirmed and v.fix and math.isnan(v.gain_db):  # a mask this run clamped already
        return (
            f"; on QNN HTP: the model as given does not run (infinite scales); this run "
            f"applies the fix, {v.fix}"
        )
    fix = f", fix {v.fix} {_db(v.gain_db)}" if v.fix else ""
    return f"; on QNN HTP: its region in fp16 {_db(v.float_gain_db)}{fix} (measured)"
