"""Jupyter kernels for the project's environments (``bert-multi kernels``, ``make kernels``): one ipykernel
kernelspec per Python that runs some of the frameworks here, named for the frameworks that Python runs in
its own process (``bert_multi-mxnet-torch`` for ``.venv``, ``bert_multi-jax-torch`` for ``.venv-numpy2``),
so that the names are the same whichever environment writes them, with this source tree on its path. A
notebook that ``lessons --notebooks`` writes names the kernel of its framework (``kernel_for``), so a
teacher opens it and runs it where its framework is.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

from ..backend.channel import SOURCE_ROOT, worker_environment
from ..backend.registry import backends, frameworks, label_of, not_in_process
from ..errors import UsageError
from ..safe_files import replace_text
from .lessons import python_for

PREFIX = "bert_multi-"


def environments() -> dict[str, list[str]]:
    """Each Python that runs some of the frameworks here -> the frameworks it runs in its own process, in
    the registry's order."""
    status = backends()
    pythons = dict.fromkeys(python_for(framework) for framework in frameworks() if status[framework].available)
    return {python: list(frameworks_of(python)) for python in pythons}


@functools.cache
def frameworks_of(python: str) -> tuple[str, ...]:
    """The frameworks ``python`` runs in its own process (asked of it, for another Python)."""
    if python == sys.executable:
        return tuple(name for name in frameworks() if backends()[name].available and not not_in_process(name))
    asked = "import sys; from bert_multi.tools.kernels import frameworks_of; print(*frameworks_of(sys.executable))"
    done = subprocess.run([python, "-c", asked], capture_output=True, text=True, timeout=300, env=worker_environment())
    if done.returncode != 0:
        raise UsageError(f"{python} could not say which frameworks it runs: {done.stderr.strip()[-300:]}")
    return tuple(done.stdout.split())


def kernel_name(names: list[str]) -> str:
    """The kernel of an environment, named for its frameworks: ``bert_multi-jax-torch``."""
    return PREFIX + "-".join(sorted(names))


def kernel_for(framework: str) -> tuple[str, str]:
    """The name and display name of the kernel whose environment runs ``framework`` here (this one, where
    it does)."""
    if not backends()[framework].available:
        raise UsageError(f"no environment here runs {label_of(framework)}: {backends()[framework].reason}")
    python = python_for(framework)
    return kernel_name(list(frameworks_of(python))), _display_name(python, list(frameworks_of(python)))


def _display_name(python: str, names: list[str]) -> str:
    environment = Path(python).parent.parent.name
    return f"bert_multi: {', '.join(label_of(name) for name in names)} ({environment})"


def write_kernels(directory: str | Path) -> list[Path]:
    """A kernelspec per environment in ``directory`` (Jupyter's ``kernels`` folder): the directories
    written. Each environment's Python must have ipykernel, else a ``UsageError`` says how to get it."""
    written = []
    for python, names in environments().items():
        done = subprocess.run([python, "-c", "import ipykernel"], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise UsageError(
                f"{python} has no ipykernel, which a Jupyter kernel needs: {python} -m pip install ipykernel "
                "(the [notebooks] extra; make venv installs it)"
            )
        spec = {
            "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": _display_name(python, names),
            "language": "python",
            "env": {"PYTHONPATH": str(SOURCE_ROOT)},  # bert_multi from this source tree, as the worker has it
            "metadata": {"bert_multi": {"frameworks": names}},
        }
        folder = Path(directory) / kernel_name(names)
        folder.mkdir(parents=True, exist_ok=True)
        replace_text(folder / "kernel.json", json.dumps(spec, indent=1) + "\n")
        written.append(folder)
    return written


def default_directory() -> Path:
    """Jupyter's own kernels folder for this user, where ``jupyter kernelspec list`` looks."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "kernels"
