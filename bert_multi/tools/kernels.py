"""Jupyter kernels for the project's environments (``bert-multi kernels``, ``make kernels``): one ipykernel
kernelspec per Python that runs some of the frameworks here, named for them (``bert_multi-mxnet-torch``
for ``.venv``, ``bert_multi-jax-torch`` for ``.venv-numpy2``), with this source tree on its path. A
notebook that ``lessons --notebooks`` writes names the kernel of its framework (``kernel_for``), so a
teacher opens it and runs it where its framework is.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..backend.channel import SOURCE_ROOT
from ..backend.registry import backends, frameworks, label_of
from ..errors import UsageError
from ..safe_files import replace_text
from .lessons import python_for

PREFIX = "bert_multi-"


def environments() -> dict[str, list[str]]:
    """Each Python that runs some of the frameworks here -> those frameworks, in the registry's order."""
    found: dict[str, list[str]] = {}
    status = backends()
    for framework in frameworks():
        if status[framework].available:
            found.setdefault(python_for(framework), []).append(framework)
    return found


def kernel_name(names: list[str]) -> str:
    """The kernel of an environment, named for its frameworks: ``bert_multi-jax-torch``."""
    return PREFIX + "-".join(sorted(names))


def kernel_for(framework: str) -> tuple[str, str]:
    """The name and display name of the kernel whose environment runs ``framework`` here."""
    for python, names in environments().items():
        if framework in names:
            return kernel_name(names), _display_name(python, names)
    raise UsageError(f"no environment here runs {label_of(framework)}: {backends()[framework].reason}")


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
