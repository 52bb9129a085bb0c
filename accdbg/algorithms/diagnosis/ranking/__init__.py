"""One ranking, one verdict: the layers that stand out from the model's own noise floor, and why.

Every layer of an 8-bit model loses some information; on a real model most layers "fail" an
absolute threshold. A culprit is a layer whose *own* encodings (weights, output, a Concat's
shared range; see :mod:`accdbg.algorithms.diagnosis.evidence`) destroy far more than the model's other
layers do - or whose backend result is far worse than its quantization explains:

* **noise floor** - the local SQNR of every layer with evidence; its median and a robust spread
  (1.4826 x the median absolute deviation, in dB).
* **stands out** - a layer's local SQNR is below ``floor - Z_MIN x spread`` (that gap kept
  between ``POLICY.gap_db`` and ``POLICY.max_gap_db``: a few layers make a weak spread estimate) and
  below ``POLICY.abs_db`` (the SQNR pass mark: its own encodings alone fail what the model must keep);
  or its encoding clips at least ``POLICY.clip_min`` of its golden values and ``POLICY.clip_ratio`` times the
  model's median layer. Clipping is not judged by its noise power: it removes the largest
  values, those that carry the most, so a few percent clipped can wreck the outputs at a local
  SQNR that looks healthy (an encoding calibrated by min/max on the debugged inputs clips
  nothing).
* **matters** - quantizing that layer alone, or taking only its quantizers out of the whole
  QDQ model (CPU simulation, :mod:`accdbg.algorithms.diagnosis.sensitivity`), shows it causes at least
  ``POLICY.share`` of the error of quantizing everything, or the layer destroys its information (local
  SQNR under ``POLICY.destroyed_db``: its median channel is mostly noise) and still causes
  ``POLICY.min_share``. A layer that is bad locally but drowned by the error around it is reported in
  its ``cause`` and not named; so is one costing much alone whose quantizers, taken out of the
  whole QDQ model, remove under ``POLICY.min_share`` (the other layers' errors mask its own: its fix
  alone would not show - a finding names such layers, measured taken out together), unless it
  destroys its information: that must be fixed whatever masks it (its cause says both). A
  layer that loses only its weights' rounding (its output keeps its range, its weights' own
  wide output channel blows theirs - not a few outlier weights, which also multiply the error
  their input channels bring) needs ``POLICY.lone_share`` taken out (``POLICY.min_share`` when its
  weights destroy their information, never less): its error travels through no other layer's
  range, so taken out is exactly what its fix removes. Faults that hurt only together are measured together: a layer
  with the layers whose range the outlier channel it makes blows (measured on the float model:
  :mod:`accdbg.algorithms.diagnosis.reach`) and with the weights that scale that channel back; a
  compensated pair (weights whose range one input channel blows) with the producer that shrank
  that channel; and weights whose rounding multiplies a constant one input channel carries (an
  offset the bias cancels in float) are blamed on that channel's maker, measured with them;
  so is an activation whose range a channel blows that the weights just before it make loud
  (that output channel's weights ``POLICY.outlier_ratio`` times the median one's), whether or not the
  weights' own layer stands out on the debugged input. A standout whose only losses are the
  rounding of encodings over channels spread as trained - per-tensor weights whose widest
  channel spans under ``POLICY.outlier_ratio`` times the next widest, an output whose loudest channel
  reaches under ``POLICY.outlier_ratio`` times as far as the next - is measured and not named: no
  channel alone beyond the others, a change of the model's encodings answers it (per-channel
  weights, cross-layer equalization, 16-bit activations); a finding says what each costs.
* **outlier weights** - a layer with a few weights ``POLICY.blown_ratio`` times its tensor's 99th
  percentile or more, whether it stands out or not, is asked what the model would be without
  them: those weights brought to the rest's range in the float model and in the QDQ model
  (requantized), each judged against its own float. When the outputs then lose ``POLICY.share`` of
  their error or more, it is a culprit: such a weight multiplies the error its input channel
  brings from every encoding upstream, which no encoding of its own layer explains (alone and
  taken out it may cost little). So is a standout whose widest output channel of weights
  spans ``POLICY.outlier_ratio`` times the next widest or more: that channel brought to the next one's
  range in both models, the QDQ model's activation encodings refitted (noise-to-signal); a
  layer at the noise floor is not asked (its loud weights make no loud output where it counts),
  unless the outputs are judged at it (there its loud channel is an output).
* **backend** - the target's error at a layer (per channel) exceeds what the layer's own
  quantization plus the error it inherits explain by ``POLICY.backend_db`` or more, standing out the
  same way among the model's layers: the kernel, not the encodings (golden inputs: layerwise).
  Such a layer is run alone in onnxruntime's CPU fake-quant too, fed the same golden inputs: a
  layer can multiply its inputs' rounding beyond their encodings' noise (a loud output channel
  weighing it), and then the CPU loses as much - it is named only when QNN is ``POLICY.backend_db``
  worse than the CPU. A layer right alone whose error jumps only run after its producers
  (layerwise's context runs: HTP fuses it with them) is run again there in the CPU fake-quant,
  and from the model's inputs on QNN: the backend's only when the CPU's cut does not jump and
  the whole model does (a cut feeds its producers as graph inputs, which HTP may take
  otherwise), named when their difference costs the outputs ``POLICY.share`` as above - whatever
  its error there: a jump to an error the pass mark would not see stands by that cost.
  In a full run, each layer's QNN result is compared with onnxruntime's CPU fake-quant of that
  layer fed QNN's own inputs (:func:`~accdbg.algorithms.diagnosis.divergence.local_divergence`); a layer
  where they part far more than at the model's other layers (with fewer than
  ``POLICY.min_diverging`` layers that differ, no spread is known: ``POLICY.max_gap_db`` under their median,
  or under ``POLICY.abs_db``) is named when that difference,
  added to the layer in the CPU fake-quant of the whole model, costs the outputs at least
  ``POLICY.share`` of their error on QNN (:meth:`~accdbg.algorithms.diagnosis.divergence.KernelRuns.each`), and
  noted otherwise. When the kernels carry ``POLICY.share`` of the outputs' error and no layer is
  named at all, the layers where QNN differs are halved down to one whose difference alone
  costs that much (``kernel_share.search``: a small difference that does not average out).

Culprits are ranked by what they were measured to cost the outputs (the largest of: alone,
taken out, with their partners; for a backend culprit, its kernel difference's share of the
error on QNN): the one whose fix would remove the most comes first - after an upstream culprit
that causes most of the error itself and whose outlier blows its range. Those whose cost could not
be measured follow, then ties, by the information their own encodings destroy (lowest local
SQNR first). Shares of several culprits need not add up (their errors interact), so a share
orders them, it does not split the error between them. When none
stands out, the verdict says the error is diffuse: a global change (per-channel weights,
16-bit activations, calibration; those the model already has left out) is the question, not a
layer. Every other row's ``cause``
says where its error comes from when it is inherited.

The package, one step each: :mod:`.measures` (the floor, the shares, the columns),
:mod:`.causes` (what a layer's encodings lose), :mod:`.partners` (layers that hurt together),
:mod:`.kernels` (the backend's part: QNN's kernels against the CPU fake-quant),
:mod:`.findings` (the lines printed) and :mod:`.rank` (the ranking itself, which calls them).
"""

from accdbg.algorithms.diagnosis.ranking.findings import NONE_STANDS, Culprit
from accdbg.algorithms.diagnosis.ranking.kernels import ContextCheck, KernelsAdded
from accdbg.algorithms.diagnosis.ranking.measures import COLUMNS
from accdbg.algorithms.diagnosis.ranking.rank import FEW, Ranking, rank

__all__ = [
    "COLUMNS",
    "FEW",
    "NONE_STANDS",
    "ContextCheck",
    "Culprit",
    "KernelsAdded",
    "Ranking",
    "rank",
]
