"""``bert-multi kernels``: a Jupyter kernel for each of the project's environments, so that the notebooks
``lessons --notebooks`` writes open in the environment their framework needs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..tools import kernels


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "kernels",
        help="install a Jupyter kernel for each environment that runs some of the frameworks here",
        description="Write an ipykernel kernelspec for each Python that runs some of the frameworks here "
        "(this one and the other environment's), named for the frameworks each runs itself: "
        "bert_multi-mxnet-torch, bert_multi-jax-torch, whichever environment writes them. The notebooks of "
        "lessons --notebooks name the kernel of their framework; open them with any Jupyter (jupyter lab DIR).",
    )
    parser.add_argument(
        "--dir", type=Path, help="the kernels folder to write into (default: Jupyter's own, for this user)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    directory = args.dir or kernels.default_directory()
    for folder in kernels.write_kernels(directory):
        print(f"kernel {folder.name}: {folder / 'kernel.json'}")
    print(f"Jupyter lists them (jupyter kernelspec list) where it looks in {directory}; each notebook names its own")
    return 0
