"""Dataset mode of the oneshot: many inputs streamed through golden and QNN, bounded memory."""

from accdbg.algorithms.dataset.run import (
    AUTO_THRESHOLD,
    DatasetResult,
    check_dataset,
    run_dataset,
    wants_dataset_mode,
)

__all__ = ["AUTO_THRESHOLD", "DatasetResult", "check_dataset", "run_dataset", "wants_dataset_mode"]
