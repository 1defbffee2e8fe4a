"""A model's weights alone, with no config beside them: a safetensors file (``safetensors.torch.save_file`` or
``save_model``, a HuggingFace directory's ``model.safetensors`` taken out of it), and the ``.h5`` transformers 4's
TensorFlow BERT writes with ``save_weights``. Each is read by its names; where no name tells what a config would,
the reader asks (``bert_multi.files.checkpoints``), and a transformers BERT's computes with transformers'
defaults, said in a note."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import WeightsError
from ...safe_files import describe_format
from . import flax, gluon
from .base import CheckpointFormat, Probe, Raw, no_key
from .hdf5 import SIGNATURE as HDF5_SIGNATURE
from .hdf5 import read_hdf5
from .huggingface import NAMED_BY, TO_TORCH_NAMES, torch_names
from .safetensors import read_metadata, read_safetensors
from .transformers_names import is_transformers_state_dict


def by_their_names(kind: str, arrays: dict[str, np.ndarray], dtypes: dict[str, str], notes: list[str]) -> Raw:
    """Named arrays in a file of no framework's (an .npz, a safetensors file) as the framework whose names
    they are would read them: a Flax tree's paths (``flatten_dict``'s, joined by "/" or ".") as Flax's own
    file is read, Gluon's (a LayerNorm's gamma and beta) as Gluon's, any other as a state_dict's."""
    paths = {name.replace("/", "."): name for name in arrays}  # flax.traverse_util.flatten_dict(tree, sep="/")
    if len(paths) == len(arrays) and flax.is_tree(list(paths)):
        tree = {path: arrays.pop(name) for path, name in paths.items()}
        kinds = {path: dtypes[name] for path, name in paths.items()}
        said = [*notes, "read the names as a Flax tree's paths (flatten_dict's)"]
        return flax.with_pytorch_names(Raw(kind, flax.BACKEND, *flax.turned(tree, kinds, said)))
    if not is_transformers_state_dict(arrays) and gluon.is_own(list(arrays)):
        return Raw(kind, gluon.FORMAT.framework, arrays, dtypes, [*notes, "read the names as Gluon's"])
    return Raw(kind, None, arrays, dtypes, notes)


class WeightsAlone(CheckpointFormat):
    """A safetensors file alone, its tensors under their model's names: saved by ``safetensors.torch.save_file``
    or ``save_model``, or a HuggingFace directory's ``model.safetensors`` taken out of it (transformers 4's
    TensorFlow and Flax classes wrote their own names there, read as its PyTorch classes'). No framework's own
    file, so its names are read as the canonical ones, a transformers BERT's as such."""

    kind = "safetensors"
    description = "safetensors file (a model's tensors alone, as safetensors' save_file writes them)"
    holds_transformers_names = True

    def recognizes(self, probe: Probe) -> bool:
        # Named so, it is read as one: that reader says precisely what is wrong with a file that is not.
        return probe.path.suffix.lower() == ".safetensors"

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        arrays, dtypes = read_safetensors(path)
        names = read_metadata(path).get("format", "pt")
        if names in TO_TORCH_NAMES:
            arrays, dtypes, _ = torch_names(path, arrays, dtypes, TO_TORCH_NAMES[names])
            whose = NAMED_BY[names]
            note = f"read {whose}'s names as transformers' PyTorch classes' ({whose}'s kernels transposed)"
            return Raw(self.kind, None, arrays, dtypes, [note])
        return by_their_names(self.kind, arrays, dtypes, [])


class KerasWeightsAlone(WeightsAlone):
    """transformers 4's TensorFlow BERT's weights alone: what its ``save_weights`` writes (a directory's
    ``tf_model.h5``, taken out of it), read as its PyTorch classes' state_dict is. Another Keras file names
    its directory, where bert_multi reads it (a KerasHub preset's ``model.weights.h5``)."""

    kind = "keras-h5"
    description = "Keras weights file (.h5) of transformers 4's TensorFlow BERT (save_weights)"

    def recognizes(self, probe: Probe) -> bool:
        return probe.path.suffix.lower() == ".h5" and probe.head.startswith(HDF5_SIGNATURE)

    def read(self, path: Path, key: str | None) -> Raw:
        no_key(path, key)
        arrays, dtypes = read_hdf5(path)
        if not is_transformers_state_dict(TO_TORCH_NAMES["keras"](name)[0] for name in arrays):
            raise WeightsError(f"{path}: {describe_format(HDF5_SIGNATURE)}, its names no transformers BERT's")
        arrays, dtypes, _ = torch_names(path, arrays, dtypes, TO_TORCH_NAMES["keras"])
        return Raw(self.kind, None, arrays, dtypes, ["read TensorFlow's names as transformers' PyTorch classes' "
                                                     "(TensorFlow's kernels transposed)"])  # fmt: skip


SAFETENSORS = WeightsAlone()
KERAS = KerasWeightsAlone()
