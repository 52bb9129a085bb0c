"""The diagnosis: what a layer loses, whether it matters, what fixing it gains, the verdict.

Every algorithm (oneshot, the snooping algorithms, dataset mode) hands what it measured on
the backend to :func:`~accdbg.algorithms.diagnosis.culprits.find_culprits` and gets one
verdict back. The measurements, one module each: :mod:`.evidence` (each layer's own
encodings against its golden values), :mod:`.local` and :mod:`.ranges` (what they lose),
:mod:`.sensitivity` (what a layer costs the outputs, on onnxruntime's CPU fake-quant),
:mod:`.reach` (the layers an outlier channel blows), :mod:`.divergence` (QNN's kernels
against the CPU's), :mod:`.attribution` (where the error enters); :mod:`.ranking` turns them
into culprits.
"""
