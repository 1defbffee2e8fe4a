"""``bert-multi gpu-check``: everything this project checks on a GPU, in one offline command that runs from
a source tree with nothing installed, for every GPU found and every installed backend that can use it.

The checks (``CHECKS``) run in the order of what they prove, each on every backend and GPU before the
next: d2l's BERT against the float64 oracle and against the same framework on the CPU; float32 products
at full precision unless TF32 is asked for; gradients and training steps against the CPU; the earlier
generations; the golden fixtures; then speed (``bench`` on the GPU). A run tells as it goes (a line as
each part starts and ends, a report rewritten after each), and with a budget it stops cleanly when the
budget is spent, listing what did not run as NOT RUN, never as passed. A backend with no GPU here, or a
GPU its build cannot use, is a SKIP saying so.
"""

from .checks import (
    CHECKS,
    TF32_CASES,
    BudgetSpent,
    Check,
    Setting,
    check_bench,
    check_fixtures,
    check_tf32,
    check_training,
    conformance,
)
from .report import EXIT_INCOMPLETE, FAIL, NOT_RUN, PASS, SKIP, GpuReport, Part
from .run import Deadline, Listener, Unit, environment, gpus, nvidia_smi, plan, run_gpu_check, run_unit

__all__ = [
    "CHECKS",
    "EXIT_INCOMPLETE",
    "FAIL",
    "NOT_RUN",
    "PASS",
    "SKIP",
    "TF32_CASES",
    "BudgetSpent",
    "Check",
    "Deadline",
    "GpuReport",
    "Listener",
    "Part",
    "Setting",
    "Unit",
    "check_bench",
    "check_fixtures",
    "check_tf32",
    "check_training",
    "conformance",
    "environment",
    "gpus",
    "nvidia_smi",
    "plan",
    "run_gpu_check",
    "run_unit",
]
