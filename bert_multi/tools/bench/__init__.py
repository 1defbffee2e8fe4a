"""``bert-multi bench``: every installed backend side by side, in one process, in interleaved rounds.

Each workload (a forward at a shape and precision, or a pretraining step) runs once per round on every
backend in turn, so a machine that slows down mid-run slows every backend alike; a backend's variants run
as rows of their own (compiled, where its build takes ``compile``: PyTorch's ``torch.compile``, Gluon's
hybridize; and its ``BENCH_VARIANTS``: transformers' fused attention), each one's first call timed apart
(where it compiles). A forward row times the model on its device, inputs there and outputs left there;
the common interface's NumPy round trip is a row of its own. Reported per row: median, min and max
seconds, tokens per second, the time against the fastest framework's on the same workload (the oracle
and references are shown against it but are not candidates), and the share of a peak that the model's
FLOPs reach: on the CPU a same-process GEMM (the framework's own dense-layer product at the model's
widest shape, at least 512 a side, best of every round), on a GPU the data sheet's dense peak for the
precision (MFU). On a GPU the precisions are float32 with TF32 off, TF32, and bfloat16 products, and the
attention is each framework's fused kernel where it has one. Speed is shown here, never asserted by a test.
"""

from .overheads import file_rows, verify_rows
from .results import (
    COMPILED,
    GOAL,
    Row,
    against_fastest,
    backend_of,
    describe_row,
    format_rows,
    goal_verdict,
    plot_rows,
    row_name,
)
from .workloads import (
    DEFAULT_SHAPES,
    GPU_PEAKS,
    GPU_PRECISIONS,
    QUICK_SHAPES,
    ROUND_TRIP,
    SHAPES,
    computable,
    forward_flops,
    gpu_peak,
    variants,
    workloads,
)

__all__ = [
    "COMPILED",
    "DEFAULT_SHAPES",
    "GOAL",
    "GPU_PEAKS",
    "GPU_PRECISIONS",
    "QUICK_SHAPES",
    "ROUND_TRIP",
    "SHAPES",
    "Row",
    "against_fastest",
    "backend_of",
    "computable",
    "describe_row",
    "file_rows",
    "format_rows",
    "forward_flops",
    "goal_verdict",
    "gpu_peak",
    "plot_rows",
    "row_name",
    "variants",
    "verify_rows",
    "workloads",
]
