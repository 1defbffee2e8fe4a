"""``bert-multi pretrain``: pretrain with MLM + NSP on a backend, or on every framework with --compare."""

from __future__ import annotations

import argparse
import inspect
import os
import shlex
import sys

import numpy as np

from ..backend.registry import backends, check_names, frameworks, interpreter_of, load_backend
from ..display import ProgressBar, format_table
from ..engine.report import plot_training
from ..errors import InputError, UsageError
from ..safe_files import open_regular
from ..spec.config import BERTConfig
from ..spec.loss import MLM_NORMALIZATIONS
from ..spec.schema import SUPPORTED_DTYPES, init_weights
from ..spec.semantics import PRESETS, semantics_for
from ..spec.weight_file import save_weights
from ..training import (
    ADAM_EPSILON_STYLES,
    MIXED_PRECISIONS,
    OPTIMIZERS,
    LossValues,
    PretrainingData,
    TrainingRun,
    builtin_corpus,
    check_mixed_precision,
    load_training_state,
    paragraphs_from_lines,
    run_pretraining,
)
from .common import check_output, check_plot, positive_int, run_there


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "pretrain",
        help="pretrain with MLM + NSP on a backend, or on every framework with --compare",
        description="d2l's BERT pretraining (Adam, lr 0.01, batch 512, 128 hidden, 256 FFN, "
        "2 heads, 2 blocks, max_len 64) on the built-in corpus or yours.",
    )
    parser.add_argument("--backend", default="torch", help="a framework backend that can train (default torch)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run every framework that can train here from the same weights and batches, and compare the curves",
    )
    parser.add_argument("--steps", type=positive_int, default=10, help="optimizer steps in all (default 10)")
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="data-parallel worker processes on this machine, on the framework's own engine; each trains on "
        "its share of every batch",
    )
    parser.add_argument(
        "--threads-per-worker", type=positive_int, help="threads of each worker (default: the cores shared out)"
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="K",
        help="save the whole training state every K steps (atomically) to --checkpoint-dir",
    )
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="where the training state is saved")
    parser.add_argument(
        "--join",
        action="store_true",
        help="be one worker of a run launched by torchrun, with the DMLC_* variables for MXNet or the JAX_* "
        "variables for JAX, on one machine or several (docs/pretraining.md, 'More than one process')",
    )
    parser.add_argument(
        "--resume", metavar="DIR", help="go on from the training state in DIR to --steps in all (saving there too)"
    )
    parser.add_argument("--corpus", help="a WikiText-style file: a paragraph per line, sentences split by ' . '")
    parser.add_argument("--seed", type=int, default=0, help="seed for the data, the weights and the batches")
    parser.add_argument("--batch-size", type=positive_int, default=512, help="examples per step, d2l's 512 by default")
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam", help="d2l's Adam (the default) or plain SGD")
    parser.add_argument("--lr", type=float, default=0.01, help="the learning rate, d2l's 0.01 by default")
    parser.add_argument(
        "--adam-epsilon-style",
        choices=("native", *ADAM_EPSILON_STYLES),
        default="native",
        help="where Adam's epsilon acts: each framework's own way (default), or both the "
        "'torch' or the 'mxnet' way, so that the two compute the same update",
    )
    parser.add_argument(
        "--mlm-normalization",
        choices=MLM_NORMALIZATIONS,
        default="real_slots",
        help="average the MLM loss over the real slots (default) or over all slots, padding "
        "included, as d2l's PyTorch code does",
    )
    _add_model_options(parser)
    parser.add_argument(
        "--dtype", choices=SUPPORTED_DTYPES, default="float32", help="the weights' dtype (default float32)"
    )
    parser.add_argument("--device", default="cpu", help="cpu (the default), cuda or cuda:N, gpu or gpu:N")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="train through the framework's compiler where it is opt-in (torch.compile, Gluon's hybridize; "
        "JAX always compiles); compiling is the first step's time, reported apart",
    )
    parser.add_argument(
        "--mixed-precision",
        choices=MIXED_PRECISIONS,
        help="compute the matrix products in this dtype (torch.autocast); the float32 weights, their "
        "gradients and the updates stay float32",
    )
    parser.add_argument("--out", help="where to save the final weights (default bert-pretrained-BACKEND.npz)")
    parser.add_argument("--plot", metavar="PATH", help="with --compare: a PNG of the loss curves")
    return parser


def run(args: argparse.Namespace) -> int:
    """d2l's pretraining loop on one backend, or on every framework that can train side by side with --compare."""
    check_output(args.out, "--out")
    check_plot(args.plot)
    if args.checkpoint_every and not (args.checkpoint_dir or args.resume):
        raise UsageError("--checkpoint-every needs --checkpoint-dir (or --resume) to say where")
    if (args.workers > 1 or args.join) and (args.compare or args.device != "cpu"):
        raise UsageError("--workers runs workers on this machine's CPU: use it without --compare or another --device")
    if (args.workers > 1 or args.join) and args.compile:
        raise UsageError("--compile trains in one process: use it without --workers or --join")
    if (args.workers > 1 or args.join) and not args.compare:
        check_names([args.backend])
        python = interpreter_of(args.backend)  # known without starting a worker that the command would not use
        if python is not None and python != sys.executable:
            return _run_in_its_environment(args, python)
    names = _trainable(args.compare, args.backend)
    for name in names:
        check_mixed_precision(name, args.mixed_precision, args.dtype)
    config, data = _model_and_data(args)
    weights = init_weights(config, seed=args.seed, dtype=args.dtype)
    runs = [_train(args, name, config, weights, data) for name in names]
    if args.compare:
        _compare(args, runs)
        return 0
    if runs[0].rank == 0:  # every worker ends with the same weights; worker 0 writes them
        out = args.out or f"bert-pretrained-{args.backend}.npz"
        save_weights(out, config, runs[0].weights)
        print(f"weights written to {out}")
    return load_backend(args.backend).end_worker(0) if args.join else 0


def _run_in_its_environment(args: argparse.Namespace, python: str | os.PathLike) -> int:
    """This very command, run by the Python of the backend's own environment (data-parallel workers start
    from there, on the framework's own engine): its output is this one's, and so is its exit status."""
    print(f"{args.backend}'s data-parallel workers start from its own environment: this command runs there "
          f"({python})", flush=True)  # fmt: skip
    return run_there(args, python)


def _model_and_data(args: argparse.Namespace) -> tuple[BERTConfig, PretrainingData]:
    """The corpus's pretraining data and the model of the sizes asked for, over its vocabulary."""
    lines = _read_corpus(args.corpus) if args.corpus else builtin_corpus()
    data = PretrainingData.from_paragraphs(paragraphs_from_lines(lines), max_len=args.max_len, seed=args.seed)
    config = BERTConfig(
        len(data.vocab),
        args.num_hiddens,
        args.ffn_num_hiddens,
        args.num_heads,
        args.num_blks,
        dropout=args.dropout,
        max_len=args.max_len,
        semantics=semantics_for(args.preset),
    )
    print(f"corpus: {args.corpus or 'built-in'}, {len(data)} sentence pairs, vocabulary of {len(data.vocab)}")
    print(f"model: {config}")
    return config, data


def _train(
    args: argparse.Namespace, name: str, config: BERTConfig, weights: dict[str, np.ndarray], data: PretrainingData
) -> TrainingRun:
    """One backend's run as the options ask: in this process, as workers, or as one worker of a run (whose
    lines worker 0 alone prints, once the run is over: the others would repeat them)."""
    threads = args.threads_per_worker or max(1, len(os.sched_getaffinity(0)) // args.workers)
    products = f" ({args.mixed_precision} products)" if args.mixed_precision else ""
    header = [
        f"{name}, {args.optimizer} lr {args.lr}, batch {args.batch_size}, {args.dtype}{products} on {args.device}:"
    ]
    if args.workers > 1:
        header.append(
            f"  {args.workers} workers of {threads} thread(s), each on {args.batch_size // args.workers} examples"
        )
    directory = args.checkpoint_dir or args.resume
    saved = load_training_state(args.resume) if args.resume else None
    if saved is not None:
        header.append(f"  resuming from {args.resume}: step {saved.step} of {args.steps} was done there")
    if not args.join:
        print("\n".join(header))
    bar = ProgressBar()

    def line(step: int, loss: LossValues) -> str:
        return f"  step {step:>4}/{args.steps}  loss {loss.total:.4f}  (MLM {loss.mlm:.4f}, NSP {loss.nsp:.4f})"

    def show(step: int, loss: LossValues) -> None:
        if not args.join:
            bar.print(line(step, loss))
        bar(step, args.steps, f"{name} pretraining")

    options = {"optimizer": args.optimizer, "lr": args.lr, "mlm_normalization": args.mlm_normalization}
    if args.adam_epsilon_style != "native":
        options["adam_epsilon_style"] = args.adam_epsilon_style
    if args.freeze_positions:
        options["train_positions"] = False
    if args.mixed_precision:
        options["mixed_precision"] = args.mixed_precision
    arguments = {"config": config, "weights": weights, "data": data, "steps": args.steps}
    arguments.update(batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, on_step=show, **options)
    if args.checkpoint_every or args.resume:
        arguments.update(checkpoint_every=args.checkpoint_every or 0, resume=bool(args.resume))
        arguments["checkpoint_dir"] = directory
    try:
        if args.join:
            run = load_backend(name).join_data_parallel(**arguments)
        elif args.workers > 1:
            run = load_backend(name).train_data_parallel(args.workers, threads, **arguments)
        else:
            run = run_pretraining(name, device=args.device, compile=args.compile, **arguments)
    except KeyboardInterrupt:
        bar.close()
        print(_where_to_go_on(args, directory), file=sys.stderr)
        raise
    finally:
        bar.close()
    if args.join:
        if run.rank != 0:
            return run
        print("\n".join(header))
        for step, loss in enumerate(run.losses, start=args.steps - len(run.losses) + 1):
            print(line(step, loss))
    if not run.losses:
        print(f"  nothing to train: {args.resume} already holds step {args.steps} of {args.steps}")
        return run
    rate = f"{run.tokens_per_second:,.0f} tokens/s"
    if len(run.losses) > 1:  # the first step apart: JAX compiles then, and every framework warms up
        rate = f"{run.steady_tokens_per_second:,.0f} tokens/s after the first step ({run.first_step_seconds:.2f} s)"
    print(
        f"  {rate}, forward + backward + step "
        f"({args.workers} x {run.runtime.get('threads')} threads, {run.seconds:.1f} s)"
    )
    return run


def _where_to_go_on(args: argparse.Namespace, directory: str | None) -> str:
    """What an interrupted run left to go on from, and the command that does."""
    saved = load_training_state(directory) if directory else None
    if saved is None:
        return (
            "bert-multi: pretraining interrupted with no checkpoint saved; --checkpoint-every K --checkpoint-dir DIR "
            "keeps one to resume from"
        )
    again = list(args.argv)
    if "--resume" in again:
        del again[again.index("--resume") : again.index("--resume") + 2]
    again = [argument for argument in again if not argument.startswith("--resume=")]
    command = " ".join(shlex.quote(argument) for argument in ["bert-multi", *again, "--resume", str(directory)])
    return (
        f"bert-multi: pretraining interrupted; the last checkpoint is step {saved.step} of {args.steps}, in "
        f"{directory}: go on with {command}"
    )


def _compare(args: argparse.Namespace, runs: list[TrainingRun]) -> None:
    """The runs' losses step by step, side by side, and how far apart their weights ended."""
    totals = [[loss.total for loss in losses] for losses in zip(*(run.losses for run in runs))]
    rows = [
        (step, *(f"{total:.6f}" for total in step_totals), f"{max(step_totals) - min(step_totals):.2e}")
        for step, step_totals in enumerate(totals, start=1)
    ]
    print(format_table(("step", *(f"{run.backend} loss" for run in runs), "largest difference"), rows))
    first = runs[0]
    for other in runs[1:]:
        gap = max(float(np.abs(first.weights[k] - other.weights[k]).max()) for k in first.weights)
        print(_compared(args, first.backend, other.backend, gap))
    if args.plot:
        print(f"plot written to {plot_training(runs, args.plot)}")


# How far two frameworks' weights may end apart after a short run and still have trained alike: what their
# rounding leaves (measured over 3 to 10 steps: Adam 1.3e-5 to 4.4e-5 in float32; in float64 up to 1.9e-6,
# from MXNet holding each step's learning rate as a C float). Adam's epsilon placed apart: 0.04.
ROUNDING = {"float32": 1e-3, "float64": 1e-4}


def _compared(args: argparse.Namespace, first: str, other: str, gap: float) -> str:
    """One sentence: whether two runs trained alike, and where they did not, why, and what makes them."""
    apart = f"{first} and {other}: their weights after {args.steps} steps differ by {gap:.3g}"
    if gap <= ROUNDING[args.dtype]:
        return f"{apart}, what rounding leaves in {args.dtype}: they trained alike"
    styles = {name: _native_epsilon(name) for name in (first, other)}
    if args.optimizer == "adam" and args.adam_epsilon_style == "native" and len(set(styles.values())) > 1:
        return (
            f"{apart}: Adam's epsilon acts where each framework puts it ({first} the {styles[first]} way, {other} "
            f"the {styles[other]} way); --adam-epsilon-style torch (or mxnet) gives both the same update"
        )
    why = "; dropout draws its masks from each framework's own generator" if args.dropout > 0 else ""
    return (
        f"{apart}, more than rounding leaves in {args.dtype} ({ROUNDING[args.dtype]:g}): they did not train alike{why}"
    )


def _native_epsilon(name: str) -> str:
    """Where a framework's own Adam puts epsilon: its Pretrainer's default ``adam_epsilon_style``."""
    parameter = inspect.signature(load_backend(name).Pretrainer).parameters.get("adam_epsilon_style")
    return str(parameter.default) if parameter is not None else "its own"


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    """The model's sizes and generation, and how the positional embedding trains."""
    parser.add_argument("--num-hiddens", type=int, default=128)
    parser.add_argument("--ffn-num-hiddens", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--num-blks", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="d2l uses 0.2; the default 0 keeps the frameworks' runs comparable step by step, "
        "since their dropout masks come from different random generators",
    )
    parser.add_argument(
        "--preset", default="d2l", help=f"the d2l generation to train: {', '.join(PRESETS)} or a d2l version"
    )
    parser.add_argument(
        "--freeze-positions",
        action="store_true",
        help="never train the positional embedding, as d2l 0.16-0.17's PyTorch code did (pos_embedding.data)",
    )


def _trainable(compare: bool, backend: str) -> list[str]:
    """The backends ``pretrain`` trains: ``backend``, or with ``compare`` every framework that can train
    here (at least two)."""
    if not compare:
        check_names([backend])
        if not load_backend(backend).can_train:
            raise UsageError(f"backend {backend!r} cannot train: it has no Pretrainer (bert-multi backends)")
        return [backend]
    status = backends()
    names = [name for name in frameworks() if status[name].available and load_backend(name).can_train]
    if len(names) < 2:
        missing = "; ".join(f"{name}: {status[name].reason}" for name in frameworks() if not status[name].available)
        raise UsageError(f"--compare needs two frameworks that can train here, and found {names} ({missing})")
    return names


def _read_corpus(path: str) -> list[str]:
    with open_regular(path, "corpus file", InputError) as file:
        data = file.read()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: the corpus is not UTF-8 text ({error.reason} at byte {error.start})") from None
