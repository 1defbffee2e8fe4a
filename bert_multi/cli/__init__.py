"""The ``bert-multi`` command line: conformance runs, comparisons on your own weights, pretraining, the
chapter demo."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..backend.contract import parse_device
from ..backend.registry import backend_names, backends, check_names, frameworks, load_backend, refused
from ..display import ProgressBar, format_table
from ..errors import BackendContractError, CannotRunHere, InputError, WeightsError, WorkerFailed
from ..files.checkpoints import (
    DIRECTORY_FRAMEWORKS,
    FORMATS,
    Checkpoint,
    inspect_checkpoint,
    load_checkpoint,
    output_format,
    read_vocab,
    save_checkpoint,
)
from ..files.safe import NpzReader, open_regular
from ..files.weights import save_weights
from ..spec.config import CONFIGS, HEADS, BERTConfig
from ..spec.loss import MLM_NORMALIZATIONS
from ..spec.schema import SUPPORTED_DTYPES, init_weights, random_weights
from ..spec.semantics import PRESETS, releases_of, semantics_for
from ..tools import bench, lessons
from ..tools.fixtures import DEFAULT_DIRECTORY, write_fixtures
from ..training import (
    ADAM_EPSILON_STYLES,
    OPTIMIZERS,
    PretrainingData,
    builtin_corpus,
    paragraphs_from_lines,
    run_pretraining,
)
from ..verify.cases import CASE_NAMES, CASES, Batch, CaseInput, get_case
from ..verify.conform import Report, Target, run_conformance
from ..verify.report import failure_details, plot_report, plot_training, runtime_lines, summary_table


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _targets(args: argparse.Namespace) -> list[Target]:
    """The targets asked for; any name that is not a backend, dtype or device is refused here."""
    names = frameworks() if args.backends is None else args.backends
    if args.reference:
        references = backend_names("reference")
        if args.reference not in references:
            raise ValueError(f"--reference {args.reference!r}: expected one of the references {references}")
        names = [*names, args.reference] if args.reference not in names else names
    check_names(names)
    for dtype in args.dtypes:
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected some of {list(SUPPORTED_DTYPES)}")
    for device in args.devices:
        parse_device(device)
    return [Target(backend, dtype, device) for device in args.devices for backend in names for dtype in args.dtypes]


def _model_and_weights(args: argparse.Namespace, spec: str, preset: str | None) -> tuple[BERTConfig, dict]:
    """A built-in config name with random weights from ``--seed``, or a checkpoint in any format with what
    the options state about it; computing the generation ``preset`` when one is given."""
    if spec in CONFIGS:
        stated = [option for option in ("num_heads", "d2l_version", "cast", "key") if getattr(args, option)]
        if stated:
            options = ", ".join("--" + option.replace("_", "-") for option in stated)
            raise ValueError(f"{options}: these describe a checkpoint file, not the built-in config {spec!r}")
        config = CONFIGS[spec].with_semantics(preset or "d2l")
        # Every tensor random (biases and LayerNorm parameters too), so that every weight is checked.
        return config, random_weights(config, seed=args.seed, dtype="float64")
    if Path(spec).exists():
        checkpoint = _load(args, spec, preset)
        return checkpoint.config, checkpoint.weights
    raise ValueError(f"--config {spec!r} is neither a built-in config {sorted(CONFIGS)} nor an existing checkpoint")


def _load(args: argparse.Namespace, path: str, preset: str | None) -> Checkpoint:
    """A checkpoint in any format, with the statements of --num-heads, --preset/--d2l-version, --cast, --key;
    what was done to read it is said."""
    checkpoint = load_checkpoint(
        path, num_heads=args.num_heads, preset=preset, d2l_version=args.d2l_version, dtype=args.cast, key=args.key
    )
    for note in checkpoint.info.notes:
        print(f"note: {note}")
    if checkpoint.info.ignored:
        print(f"ignored (not part of d2l's BERTModel): {', '.join(checkpoint.info.ignored)}")
    return checkpoint


MAX_INPUT_BYTES = 1 << 30  # what an inputs .npz may expand to


def _read_inputs(path: str) -> list[CaseInput]:
    """One batch from an .npz with tokens, segments and optionally valid_lens and pred_positions."""
    allowed = ("tokens", "segments", "valid_lens", "pred_positions")
    with open_regular(path, "file of inputs (.npz)", InputError) as file:
        archive = NpzReader(file, path, InputError, max_compressed_bytes=MAX_INPUT_BYTES)
        unknown = sorted(set(archive.names) - set(allowed))
        if unknown or not {"tokens", "segments"} <= set(archive.names):
            raise InputError(
                f"{path}: expected arrays tokens, segments and optionally valid_lens, pred_positions; "
                f"found {sorted(archive.names)}"
            )
        arrays = {name: archive.read(name, archive.header(name)) for name in archive.names}
    return [CaseInput(Path(path).stem, {name: arrays.get(name) for name in allowed})]


def _check_output(path: str | None, option: str, directory: bool = False) -> None:
    """Refuse, before any work starts, an output path that could not be written at the end: its
    directory must exist (or, for a directory to create, its nearest existing ancestor) and be writable."""
    if path is None:
        return
    target = Path(path)
    if directory:
        if target.exists() and not target.is_dir():
            raise ValueError(f"{option} {path}: exists and is not a directory")
        parent = next(p for p in (target, *target.parents) if p.exists())
    else:
        if target.is_dir():
            raise ValueError(f"{option} {path}: is a directory; expected a file name")
        parent = target.parent
        if not parent.is_dir():
            raise ValueError(f"{option} {path}: the directory {str(parent)!r} does not exist")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write in {str(parent)!r}")


def _check_plot(path: str | None, option: str = "--plot") -> None:
    _check_output(path, option)
    if path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{option} needs matplotlib: pip install 'bert_multi[plot]'")


def _describe_case(config: BERTConfig, case: CaseInput) -> str:
    cut = case.cut(config)
    return case.name if cut is None else f"{case.name} (on the model cut to max_len {cut})"


def _run_and_report(
    args: argparse.Namespace,
    targets: list[Target],
    config: BERTConfig,
    weights: dict[str, np.ndarray],
    cases: list[CaseInput] | list[tuple[str, Batch]],
) -> Report:
    print(f"config: {config}")
    absent = [head for head in HEADS if head not in config.heads]
    if absent:
        print(f"absent from this model, so not compared: {', '.join(absent)}")
    print(f"cases: {', '.join(_describe_case(config, CaseInput(*case)) for case in cases)}")
    bar = ProgressBar()
    try:
        report = run_conformance(config, weights, targets, cases, pairs=not args.no_pairs, progress=bar)
    finally:
        bar.close()
    print(summary_table(report))
    print(f"\nran on:\n{runtime_lines(report)}")
    if not report.passed:
        print("\n" + failure_details(report))
    checks = len(report.checks)
    verdict = "PASS" if report.passed else "FAIL"
    broken = f", {len(report.errors)} error(s)" if report.errors else ""
    print(
        f"\n{verdict}: {checks - len(report.failures())} of {checks} checks within tolerance{broken}, "
        f"{len(report.skipped)} target(s) skipped, {report.seconds:.1f} s"
    )
    return report


def _write_reports(args: argparse.Namespace, reports: dict[str, Report]) -> int:
    """Write --json and --plot (one plot per generation when there are several); the exit code."""
    if args.json:
        document = (
            next(iter(reports.values())).to_json()
            if len(reports) == 1
            else {preset: report.to_json() for preset, report in reports.items()}
        )
        Path(args.json).write_text(json.dumps(document, indent=1))
        print(f"report written to {args.json}")
    if args.plot:
        for preset, report in reports.items():
            path = Path(args.plot)
            if len(reports) > 1:
                path = path.with_name(f"{path.stem}-{preset}{path.suffix}")
            print(f"plot written to {plot_report(report, path)}")
    if not all(report.checks for report in reports.values()):
        print("bert-multi: nothing was checked: no requested backend could run here", file=sys.stderr)
        return 1
    return 0 if all(report.passed for report in reports.values()) else 1


def _check_report_outputs(args: argparse.Namespace) -> None:
    _check_output(args.json, "--json")
    _check_plot(args.plot)


def cmd_conform(args: argparse.Namespace) -> int:
    if args.list_cases:
        print(format_cases())
        return 0
    _check_report_outputs(args)
    targets = _targets(args)
    chosen = CASES if args.cases == ["all"] else [get_case(name) for name in args.cases]
    if args.preset == "all" and args.config not in CONFIGS:
        raise ValueError("--preset all needs a built-in --config: a weights file holds one generation's tensors")
    presets = list(PRESETS) if args.preset == "all" else [args.preset]
    reports = {}
    for preset in presets:
        config, weights = _model_and_weights(args, args.config, preset)
        if len(presets) > 1:
            print(f"\n== preset {config.semantics.name} ({releases_of(config.semantics.name)}) ==")
        cases = [case.input(config, args.seed) for case in chosen]
        reports[config.semantics.name] = _run_and_report(args, targets, config, weights, cases)
    return _write_reports(args, reports)


def cmd_compare(args: argparse.Namespace) -> int:
    _check_report_outputs(args)
    targets = _targets(args)
    checkpoint = _load(args, args.weights, args.preset)
    config, weights = checkpoint.config, checkpoint.weights
    if args.inputs:
        cases = _read_inputs(args.inputs)
    else:
        cases = [case.input(config, args.seed) for case in CASES]
    return _write_reports(args, {config.semantics.name: _run_and_report(args, targets, config, weights, cases)})


def format_cases() -> str:
    return format_table(("case", "what it covers"), [(case.name, case.description) for case in CASES])


def cmd_pretrain(args: argparse.Namespace) -> int:
    """d2l's pretraining loop on one backend, or on every framework that can train side by side with --compare."""
    _check_output(args.out, "--out")
    _check_plot(args.plot)
    if args.checkpoint_every and not (args.checkpoint_dir or args.resume):
        raise ValueError("--checkpoint-every needs --checkpoint-dir (or --resume) to say where")
    if (args.workers > 1 or args.join) and (args.compare or args.device != "cpu"):
        raise ValueError("--workers runs workers on this machine's CPU: use it without --compare or another --device")
    names = _trainable(args.compare, args.backend)
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
    weights = init_weights(config, seed=args.seed, dtype=args.dtype)
    print(f"corpus: {args.corpus or 'built-in'}, {len(data)} sentence pairs, vocabulary of {len(data.vocab)}")
    print(f"model: {config}")
    options = {"optimizer": args.optimizer, "lr": args.lr, "mlm_normalization": args.mlm_normalization}
    if args.adam_epsilon_style != "native":
        options["adam_epsilon_style"] = args.adam_epsilon_style
    if args.freeze_positions:
        options["train_positions"] = False

    threads = args.threads_per_worker or max(1, len(os.sched_getaffinity(0)) // args.workers)
    bar = ProgressBar()
    runs = []
    for name in names:
        print(f"{name}, {args.optimizer} lr {args.lr}, batch {args.batch_size}, {args.dtype} on {args.device}:")
        if args.workers > 1:
            print(
                f"  {args.workers} workers of {threads} thread(s), each on {args.batch_size // args.workers} examples"
            )

        def show(step: int, loss, name: str = name) -> None:
            bar.print(f"  step {step:>4}/{args.steps}  loss {loss.total:.4f}  (MLM {loss.mlm:.4f}, NSP {loss.nsp:.4f})")
            bar(step, args.steps, f"{name} pretraining")

        arguments = {"config": config, "weights": weights, "data": data, "steps": args.steps}
        arguments.update(batch_size=args.batch_size, seed=args.seed, dtype=args.dtype, on_step=show, **options)
        if args.checkpoint_every or args.resume:
            arguments.update(checkpoint_every=args.checkpoint_every or 0, resume=bool(args.resume))
            arguments["checkpoint_dir"] = args.checkpoint_dir or args.resume
        try:
            if args.join:
                run = load_backend(name).join_data_parallel(**arguments)
            elif args.workers > 1:
                run = load_backend(name).train_data_parallel(args.workers, threads, **arguments)
            else:
                run = run_pretraining(name, device=args.device, **arguments)
        finally:
            bar.close()
        print(
            f"  {run.tokens_per_second:,.0f} tokens/s, forward + backward + step "
            f"({args.workers} x {run.runtime.get('threads')} threads, {run.seconds:.1f} s)"
        )
        runs.append(run)
    if args.compare:
        totals = [[loss.total for loss in losses] for losses in zip(*(run.losses for run in runs))]
        rows = [
            (step, *(f"{total:.6f}" for total in step_totals), f"{max(step_totals) - min(step_totals):.2e}")
            for step, step_totals in enumerate(totals, start=1)
        ]
        print(format_table(("step", *(f"{run.backend} loss" for run in runs), "largest difference"), rows))
        first = runs[0]
        for other in runs[1:]:
            gap = max(float(np.abs(first.weights[k] - other.weights[k]).max()) for k in first.weights)
            print(f"largest weight difference after {args.steps} steps, {first.backend} vs {other.backend}: {gap:.3g}")
        if args.plot:
            print(f"plot written to {plot_training(runs, args.plot)}")
        return 0
    if runs[0].rank == 0:  # every worker ends with the same weights; worker 0 writes them
        out = args.out or f"bert-pretrained-{args.backend}.npz"
        save_weights(out, config, runs[0].weights)
        print(f"weights written to {out}")
    return load_backend(args.backend).end_worker(0) if args.join else 0


def _trainable(compare: bool, backend: str) -> list[str]:
    """The backends ``pretrain`` trains: ``backend``, or with ``compare`` every framework that can train
    here (at least two)."""
    if not compare:
        check_names([backend])
        if not load_backend(backend).can_train:
            raise ValueError(f"backend {backend!r} cannot train: it has no Pretrainer (bert-multi backends)")
        return [backend]
    status = backends()
    names = [name for name in frameworks() if status[name].available and load_backend(name).can_train]
    if len(names) < 2:
        missing = "; ".join(f"{name}: {status[name].reason}" for name in frameworks() if not status[name].available)
        raise ValueError(f"--compare needs two frameworks that can train here, and found {names} ({missing})")
    return names


def _read_corpus(path: str) -> list[str]:
    with open_regular(path, "corpus file", InputError) as file:
        data = file.read()
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: the corpus is not UTF-8 text ({error.reason} at byte {error.start})") from None


def cmd_inspect(args: argparse.Namespace) -> int:
    _check_output(args.json, "--json")
    info = inspect_checkpoint(args.path, key=args.key)
    print(info.describe())
    if args.json:
        Path(args.json).write_text(json.dumps(info.to_json(), indent=1))
        print(f"report written to {args.json}")
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    kind = output_format(args.out)
    _check_output(args.out, "OUT", directory=kind == "d2l-dir")
    vocab = read_vocab(args.vocab) if args.vocab else None
    checkpoint = _load(args, args.source, args.preset)
    save_checkpoint(
        args.out, checkpoint.config, checkpoint.weights, framework=args.framework, vocab=vocab or checkpoint.vocab
    )
    print(f"config: {checkpoint.config}")
    print(f"wrote {args.out}: {FORMATS[kind]}")
    return 0


def cmd_lessons(args: argparse.Namespace) -> int:
    """List the framework-differences guide's sections, or run one in every framework side by side."""
    sections = lessons.read_guide()
    if args.section is None:
        for listed in sections:
            print(f"{listed.number}. {listed.title}")
        print(f"\nbert-multi lessons N runs section N in every framework; the guide: {lessons.GUIDE}")
        return 0
    section = next((s for s in sections if s.number == args.section), None)
    if section is None:
        raise ValueError(f"no section {args.section}: the guide has sections 1 to {len(sections)}")
    print(f"{section.number}. {section.title}\n")
    status = backends()
    parts = []  # per sample: (header, code lines, printed lines, verdict)
    for sample in section.samples:
        outcome = lessons.run([sample])[0] if status[sample.framework].available else None
        printed = outcome.printed.rstrip() if outcome else f"(not run: {status[sample.framework].reason})"
        verdict = "" if outcome is None else ("as the guide says" if outcome.as_written else "NOT as the guide says")
        parts.append((f"{lessons.label(sample.framework)}:", sample.code.splitlines(), printed.splitlines(), verdict))
    code_rows = max(len(code) for _, code, _, _ in parts)
    printed_rows = max(len(printed) for _, _, printed, _ in parts)
    columns = [
        [
            header,
            *code,
            *[""] * (code_rows - len(code)),
            "",
            "prints:",
            *printed,
            *[""] * (printed_rows - len(printed)),
            verdict,
        ]  # fmt: skip
        for header, code, printed, verdict in parts
    ]
    width = max(len(line) for line in columns[0]) + 4
    for row in itertools.zip_longest(*columns, fillvalue=""):
        print("".join(f"{cell:<{width}}" for cell in row).rstrip())
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    _check_output(args.json, "--json")
    _check_plot(args.plot)
    shapes, rounds = (["tiny"], 2) if args.quick else (args.shapes, args.rounds)
    for shape in shapes:
        if shape not in bench.SHAPES:
            raise ValueError(f"unknown shape {shape!r}: expected some of {list(bench.SHAPES)}")
    bar = ProgressBar()
    try:
        rows = bench.run_bench(
            shapes,
            args.dtypes,
            rounds,
            train=not args.no_train,
            progress=lambda label: bar(0, 1, label),
            files=not args.no_files,
        )
    finally:
        bar.close()
    per_backend = {row.backend: row.threads for row in rows if row.threads is not None}
    threads = ", ".join(
        [f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"]
        + [f"{name} threads {count}" for name, count in per_backend.items()]
    )
    print(f"{rounds} interleaved rounds per workload; {threads}")
    print(bench.format_rows(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": threads, "rows": [row.to_json() for row in rows]}, indent=1))
        print(f"report written to {args.json}")
    if args.plot:
        print(f"plot written to {bench.plot_rows(rows, args.plot)}")
    return 0


def cmd_fixtures(args: argparse.Namespace) -> int:
    _check_output(args.dir, "--dir", directory=True)
    for path in write_fixtures(args.dir):
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    status = backends()
    rows = []
    for name, state in status.items():
        devices = ", ".join(load_backend(name).devices()) if state.available else "-"
        rows.append((name, "yes" if state.available else "no", state.role, devices, state.where, state.reason or ""))
    print(format_table(("backend", "available", "role", "devices here", "from", "why not"), rows))
    for reason in refused():
        print(f"refused: {reason}")
    usable = [name for name, state in status.items() if state.available]
    print(f"\n{len(usable)} of {len(status)} backends can run here: {', '.join(usable) or 'none'}.")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The d2l chapter's demo: its model and inputs through every installed framework backend (the
    references compute the original BERT, not d2l's)."""
    config = CONFIGS["chapter"]
    weights = init_weights(config, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    # As in the chapter: two sequences of 8 tokens, the second half in segment B, 3 MLM positions each.
    tokens = rng.integers(0, config.vocab_size, size=(2, 8))
    segments = np.array([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1]])
    mlm_positions = np.array([[1, 5, 2], [6, 1, 5]])
    print(f"d2l chapter demo: {config}")
    rows: list[tuple[object, ...]] = []
    for name, status in backends().items():
        if status.role == "reference":  # it computes the original BERT, not the chapter's
            continue
        if not status.available:
            rows.append((name, "-", "-", "-", "-", "-", f"skipped: {status.reason}"))
            continue
        model = load_backend(name).build(config, weights)
        start = time.perf_counter()
        out = model(tokens, segments, None, mlm_positions)
        elapsed = time.perf_counter() - start
        rows.append(
            (
                name,
                model.dtype,
                model.device,
                out.encoded.shape,
                "-" if out.mlm is None else out.mlm.shape,
                "-" if out.nsp is None else out.nsp.shape,
                f"{elapsed * 1000:.0f} ms",
            )
        )
    print(format_table(("backend", "dtype", "device", "encoded_X", "mlm_Y_hat", "nsp_Y_hat", "forward"), rows))
    return 0


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backends",
        type=_split,
        help="comma-separated backend names (default: every framework backend; bert-multi backends lists them)",
    )
    parser.add_argument(
        "--devices",
        type=_split,
        default=["cpu"],
        help="comma-separated: cpu, cuda, cuda:N, gpu, gpu:N (default: cpu); "
        "a device a backend cannot use here is reported as skipped",
    )
    parser.add_argument(
        "--dtypes", type=_split, default=list(SUPPORTED_DTYPES), help="comma-separated (default: float32,float64)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs (default 0)")
    parser.add_argument(
        "--no-pairs", action="store_true", help="compare with the oracle only, not backends with each other"
    )
    parser.add_argument(
        "--reference",
        help="add a reference backend, an independent implementation of the original BERT such as "
        "transformers, as one more row (the bert preset only)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of the error per layer")


def _add_checkpoint_options(parser: argparse.ArgumentParser, preset: bool = True) -> None:
    """What a user states about a checkpoint that its tensors cannot tell (see bert_multi.load_checkpoint)."""
    parser.add_argument(
        "--num-heads", type=int, help="the number of attention heads: required for a d2l file, which cannot reveal it"
    )
    if preset:
        parser.add_argument(
            "--preset",
            help=f"the d2l generation: one of {', '.join(PRESETS)} (required when the tensors fit more than one)",
        )
    parser.add_argument("--d2l-version", help="the d2l release that saved the file, such as 0.14.4 (or use --preset)")
    parser.add_argument(
        "--cast", choices=SUPPORTED_DTYPES, help="cast the weights to this dtype (float16/bfloat16 files need it)"
    )
    parser.add_argument("--key", help="the entry of a PyTorch wrapper dict that holds the state_dict, e.g. model")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bert-multi", description="d2l's BERT in PyTorch and MXNet, checked against a float64 NumPy oracle."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    conform = sub.add_parser(
        "conform",
        help="prove every backend matches the oracle and each other (the main job)",
        description="Run the conformance cases on every backend, dtype and device asked "
        "for; compare with the float64 oracle and pairwise; exit 1 on failure.",
    )
    conform.add_argument(
        "--config",
        default="chapter",
        help=f"a built-in config {sorted(CONFIGS)} with random weights, or a weights .npz (default: chapter)",
    )
    conform.add_argument(
        "--cases", type=_split, default=["all"], help="comma-separated case names or 'all' (default); see --list-cases"
    )
    conform.add_argument("--list-cases", action="store_true", help="list the cases and exit")
    conform.add_argument(
        "--preset",
        help=f"the d2l generation to compute: {', '.join(PRESETS)}, a d2l version such as 0.14.4, or 'all' "
        "(default: d2l, or a weights file's own)",
    )
    _add_checkpoint_options(conform, preset=False)
    _add_run_options(conform)
    conform.set_defaults(func=cmd_conform)

    compare = sub.add_parser(
        "compare",
        help="the same comparison on your own weights (and inputs)",
        description="Compare every backend with the oracle on a canonical weights file, "
        "and say where a failing backend first diverges.",
    )
    compare.add_argument(
        "weights", help="a checkpoint: canonical .npz, PyTorch .pt/.pth, Gluon .params or a d2l pretrained-model dir"
    )
    compare.add_argument(
        "--inputs",
        metavar="NPZ",
        help="an .npz with tokens, segments and optionally valid_lens, pred_positions "
        f"(default: the built-in cases: {', '.join(CASE_NAMES)})",
    )
    compare.add_argument(
        "--preset",
        help="compute the weights as this d2l generation (a preset or a d2l version) instead of the file's own; "
        "d2l 0.12-0.15 and 1.0 files have the same tensors, so only you can tell them apart",
    )
    _add_checkpoint_options(compare, preset=False)
    _add_run_options(compare)
    compare.set_defaults(func=cmd_compare)

    inspect = sub.add_parser(
        "inspect",
        help="what a checkpoint is: format, tensors, implied sizes and generations, what it cannot tell",
        description="Describe a checkpoint in any format bert_multi reads, without loading it into a model.",
    )
    inspect.add_argument("path", help="a .npz, .pt/.pth, .params, d2l pretrained-model directory or zip")
    inspect.add_argument("--key", help="the entry of a PyTorch wrapper dict that holds the state_dict")
    inspect.add_argument("--json", metavar="PATH", help="write the description as JSON")
    inspect.set_defaults(func=cmd_inspect)

    convert = sub.add_parser(
        "convert",
        help="convert a checkpoint between .npz, .pt, .params, d2l's pretrained-model directory and HuggingFace's",
        description="Read a checkpoint in any format and write it in the format OUT's name asks for: .npz "
        "(canonical), .pt/.pth (PyTorch state_dict), .params (Gluon), or a directory (with --framework: d2l's "
        "pretrained.params + vocab.json, or HuggingFace's config.json + model.safetensors). Each is what that "
        "framework's code loads with its own strict call.",
    )
    convert.add_argument("source", help="the checkpoint to read")
    convert.add_argument("out", help="where to write; the suffix picks the format (no suffix: a d2l directory)")
    _add_checkpoint_options(convert)
    convert.add_argument(
        "--framework",
        choices=DIRECTORY_FRAMEWORKS,
        help="for a directory: a d2l one with this framework's pretrained.params, or a HuggingFace one",
    )
    convert.add_argument("--vocab", help="for a d2l directory: a JSON list of tokens, when the source has no vocab")
    convert.set_defaults(func=cmd_convert)

    demo = sub.add_parser("demo", help="run the d2l chapter's demo model through every installed backend")
    demo.add_argument("--seed", type=int, default=0, help="seed for the weights and tokens (default 0)")
    demo.set_defaults(func=cmd_demo)

    pretrain = sub.add_parser(
        "pretrain",
        help="pretrain with MLM + NSP on a backend, or on every framework with --compare",
        description="d2l's BERT pretraining (Adam, lr 0.01, batch 512, 128 hidden, 256 FFN, "
        "2 heads, 2 blocks, max_len 64) on the built-in corpus or yours.",
    )
    pretrain.add_argument("--backend", default="torch", help="a framework backend that can train (default torch)")
    pretrain.add_argument(
        "--compare",
        action="store_true",
        help="run every framework that can train here from the same weights and batches, and compare the curves",
    )
    pretrain.add_argument("--steps", type=int, default=10)
    pretrain.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="data-parallel worker processes on this machine, on the framework's own engine; each trains on "
        "its share of every batch",
    )
    pretrain.add_argument(
        "--threads-per-worker", type=_positive_int, help="threads of each worker (default: the cores shared out)"
    )
    pretrain.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        metavar="K",
        help="save the whole training state every K steps (atomically) to --checkpoint-dir",
    )
    pretrain.add_argument("--checkpoint-dir", metavar="DIR", help="where the training state is saved")
    pretrain.add_argument(
        "--join",
        action="store_true",
        help="be one worker of a run launched by torchrun, or with the DMLC_* variables for MXNet, on one "
        "machine or several (README, 'More than one process')",
    )
    pretrain.add_argument(
        "--resume", metavar="DIR", help="go on from the training state in DIR to --steps in all (saving there too)"
    )
    pretrain.add_argument("--corpus", help="a WikiText-style file: a paragraph per line, sentences split by ' . '")
    pretrain.add_argument("--seed", type=int, default=0, help="seed for the data, the weights and the batches")
    pretrain.add_argument("--batch-size", type=int, default=512)
    pretrain.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    pretrain.add_argument("--lr", type=float, default=0.01)
    pretrain.add_argument(
        "--adam-epsilon-style",
        choices=("native", *ADAM_EPSILON_STYLES),
        default="native",
        help="where Adam's epsilon acts: each framework's own way (default), or both the "
        "'torch' or the 'mxnet' way, so that the two compute the same update",
    )
    pretrain.add_argument(
        "--mlm-normalization",
        choices=MLM_NORMALIZATIONS,
        default="real_slots",
        help="average the MLM loss over the real slots (default) or over all slots, padding "
        "included, as d2l's PyTorch code does",
    )
    pretrain.add_argument("--num-hiddens", type=int, default=128)
    pretrain.add_argument("--ffn-num-hiddens", type=int, default=256)
    pretrain.add_argument("--num-heads", type=int, default=2)
    pretrain.add_argument("--num-blks", type=int, default=2)
    pretrain.add_argument("--max-len", type=int, default=64)
    pretrain.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="d2l uses 0.2; the default 0 keeps the frameworks' runs comparable step by step, "
        "since their dropout masks come from different random generators",
    )
    pretrain.add_argument(
        "--preset", default="d2l", help=f"the d2l generation to train: {', '.join(PRESETS)} or a d2l version"
    )
    pretrain.add_argument(
        "--freeze-positions",
        action="store_true",
        help="never train the positional embedding, as d2l 0.16-0.17's PyTorch code did (pos_embedding.data)",
    )
    pretrain.add_argument("--dtype", choices=SUPPORTED_DTYPES, default="float32")
    pretrain.add_argument("--device", default="cpu")
    pretrain.add_argument("--out", help="where to save the final weights (default bert-pretrained-BACKEND.npz)")
    pretrain.add_argument("--plot", metavar="PATH", help="with --compare: a PNG of the loss curves")
    pretrain.set_defaults(func=cmd_pretrain)

    fixtures = sub.add_parser("fixtures", help="rewrite the golden fixtures (weights, inputs, oracle outputs)")
    fixtures.add_argument(
        "--dir",
        default=str(DEFAULT_DIRECTORY),
        help=f"where to write them (default: {DEFAULT_DIRECTORY}, run from the repository root)",
    )
    fixtures.set_defaults(func=cmd_fixtures)

    bench_parser = sub.add_parser(
        "bench",
        help="speed of every installed backend side by side (forward and a training step)",
        description="Every installed backend in one process, in interleaved rounds: median, min and max "
        "time, tokens/s and the share of a same-process GEMM peak; transformers as a reference where installed.",
    )
    bench_parser.add_argument(
        "--shapes", type=_split, default=["chapter"], help="comma-separated: chapter (8x64), base (8x128)"
    )
    bench_parser.add_argument("--dtypes", type=_split, default=list(SUPPORTED_DTYPES), help="comma-separated")
    bench_parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per workload (default 5)")
    bench_parser.add_argument("--no-train", action="store_true", help="no training step")
    bench_parser.add_argument(
        "--no-files", action="store_true", help="no weight-file save and load (at the last shape's size)"
    )
    bench_parser.add_argument("--quick", action="store_true", help="a tiny shape, two rounds: a smoke test")
    bench_parser.add_argument("--json", metavar="PATH", help="write every timing as JSON")
    bench_parser.add_argument("--plot", metavar="PATH", help="write a PNG of tokens/s")
    bench_parser.set_defaults(func=cmd_bench)

    lessons_parser = sub.add_parser(
        "lessons",
        help="how the frameworks differ: list the guide's sections, or run one in every framework",
        description="The framework-differences guide (docs/framework-differences.md), section by section: "
        "each sample run in its framework, printed side by side with the other's.",
    )
    lessons_parser.add_argument("section", nargs="?", type=int, help="the section to run (default: list them)")
    lessons_parser.set_defaults(func=cmd_lessons)

    listing = sub.add_parser("backends", help="list the backends and whether each can run here")
    listing.set_defaults(func=cmd_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (InputError, WeightsError, CannotRunHere, BackendContractError, ValueError, OSError, WorkerFailed) as error:
        print(f"bert-multi: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bert-multi: interrupted", file=sys.stderr)
        return 130
