"""What ``verify`` found, and how it says it: the forward's conformance report, the gradient and loss
checks, the placements, the diagnoses and the parts not checked, as one sentence (``verdict``), the lines
under it (``failures``) and JSON (``to_json``)."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from ..engine.compare import Comparison
from ..engine.report import failure_details
from ..engine.results import Report, computation_rank
from ..spec.config import BERTConfig
from ..spec.semantics import releases_of
from .diagnosis import Diagnosis
from .gradients import CAUSES, GradientCheck, LossCheck
from .map_file import MapFile
from .placement import ParameterMap
from .subject import activation_of

# The parts after the encoder, and a model's outputs, as a report names them.
PARTS = {"pooler": "the pooler", "mlm": "the masked-LM head", "nsp": "the next-sentence classifier"}
OUTPUTS = {
    "encoded": "the encoding your model returns",
    "mlm": "the masked-LM output your model returns",
    "nsp": "the NSP output your model returns",
}


@dataclass
class VerifyReport:
    """What ``verify`` found: the forward conformance report, the gradient and loss checks, and how the
    user's parameters and activations were placed."""

    label: str
    config: BERTConfig
    mapping: ParameterMap
    activations: dict[str, str]  # canonical activation -> where it is in the user's model
    forward: Report
    gradients: list[GradientCheck] = field(default_factory=list)
    loss: LossCheck | None = None
    seed: int = 0  # of the weights and the cases
    gradients_skipped: dict[str, str] = field(default_factory=dict)  # device -> why its gradients were not taken
    map_file: MapFile | None = None
    diagnoses: list[Diagnosis] = field(default_factory=list)  # what each diverging module computes instead
    absent: dict[str, str] = field(default_factory=dict)  # a part after the encoder not checked -> why

    @property
    def passed(self) -> bool:
        """Every check asked for ran and passed (a forward run that compared nothing is a failure, and so is
        asking for gradients where none could be taken)."""
        return (
            self.forward.passed
            and (bool(self.gradients) or not self.gradients_skipped)
            and all(check.passed for check in self.gradients)
            and (self.loss is None or self.loss.passed)
        )

    def user_name(self, name: str) -> str:
        """A canonical parameter's or activation's place in the user's model, for a message."""
        if name in self.activations:
            return self.activations[name]
        if name in self.mapping.placements:
            return self.mapping.user_name(name)
        head = self._head_module(name) if name in OUTPUTS else None
        return f"{head} (output)" if head else OUTPUTS.get(name, name)

    def _head_module(self, output: str) -> str | None:
        """The user's module that holds all of the parameters of the head computing ``output`` and none
        other (``lm`` for ``lm.0.weight`` ... ``lm.3.bias``), or None where no one module does."""
        holders = {self.mapping.user_name(name): activation_of(self.config, name) == output
                   for name in self.mapping.placements}  # fmt: skip
        mine = [name.split(".") for name, in_head in holders.items() if in_head]
        common = _shared_prefix(mine)
        prefix = ".".join(common)
        if not mine or not prefix or any(len(path) == len(common) for path in mine):
            return None
        others = (name for name, in_head in holders.items() if not in_head)
        return None if any(name.startswith(f"{prefix}.") for name in others) else prefix

    def verdict(self) -> str:
        """One sentence: does the user's model compute d2l's BERT, and if not, where it first goes wrong."""
        if self.passed:
            asked = ["its outputs and activations"]
            asked += ["its gradients"] if self.gradients else []
            asked += ["its loss"] if self.loss else []
            name = self.config.semantics.name
            what = "the original BERT" if name == "bert" else f"the BERT of {releases_of(name).split(' (')[0]}"
            skipped = [f"{t.dtype} on {t.device}" for t in self.forward.skipped]
            skipped += [f"gradients on {device}" for device in self.gradients_skipped]
            unrun = f" (not run here: {', '.join(skipped)})" if skipped else ""
            return f"PASS: {self.label} computes {what}: {', '.join(asked)} conform{unrun}{self._unchecked()}."
        failures = self.forward.failures()
        if failures:
            check = min(failures, key=lambda check: computation_rank(check.first_divergence.name))  # type: ignore[union-attr]
            first = check.first_divergence
            assert first is not None
            found = next((d for d in self.diagnoses if d.activation == first.name and d.mistake is not None), None)
            instead = f": it {found.says()}" if found else ""
            return (
                f"FAIL: {self.label} first diverges at {first.name} (yours: {self.user_name(first.name)}), "
                f"case {check.case}, {check.target.dtype} on {check.target.device}{instead}{self._raised()}"
                f"{self._unchecked()}."
            )
        if not self.forward.passed:
            if self.forward.errors and all(error.case for error in self.forward.errors):
                return f"FAIL: {self.label} conforms where it ran{self._raised()}{self._unchecked()}."
            return f"FAIL: {self.label}'s forward did not run through{self._raised()}{self._unchecked()}."
        broken = next((check for check in self.gradients if not check.passed), None)
        if broken is not None:
            own = broken.caused_by("backward")
            where = own or broken.ungraded or [c.name for c in broken.comparisons if not c.passed]
            if not where:
                return f"FAIL: {self.label}'s gradient of the {broken.scalar} compared no parameter."
            rows = broken.rows_alone_differing.get(where[0])
            why = (": no gradient reaches it" if where[0] in broken.ungraded
                   else f": only its {_rows(rows)} differs (an embedding's padding_idx?)"
                   if rows else ": its module's own backward gives another gradient" if own else "")  # fmt: skip
            return (
                f"FAIL: {self.label}'s outputs conform, but its gradient of the {broken.scalar} does not, at "
                f"{self.user_name(where[0])}{why}."
            )
        return f"FAIL: {self.label}'s outputs conform, but its loss does not."

    def _unchecked(self) -> str:
        """The parts after the encoder that were not checked, and why."""
        if not self.absent:
            return ""
        parts = "; ".join(f"{PARTS[head]}: {why}" for head, why in self.absent.items())
        return f"; not checked: {parts}"

    def _raised(self) -> str:
        """The cases the user's code raised on, how many ran, and how to run the others alone; or what else
        raised (see the errors above)."""
        cases = list(dict.fromkeys(error.case for error in self.forward.errors if error.case))
        if not cases:
            return " (see the errors above)" if self.forward.errors else ""
        first = next(error for error in self.forward.errors if error.case)
        said = (first.error.splitlines() or [""])[0]
        others = [case for case in self.forward.cases if case not in cases]
        rest = f" (--cases {','.join(others)} checks the other {len(others)} alone)" if others else ""
        return f", but raised on {len(cases)} of {len(self.forward.cases)} cases ({', '.join(cases)}: {said}){rest}"

    def failures(self) -> str:
        """Where each failing check first goes wrong, in the user's names (empty when all passed)."""
        lines = [failure_details(self.forward, self.user_name)] if not self.forward.passed else []
        lines += [f"diagnosis: {diagnosis.describe()}" for diagnosis in self.diagnoses]
        for check in self.gradients:
            lines += [f"gradient of the {check.scalar} ({check.device}): {line}" for line in self.gradient_lines(check)]
        if self.loss is not None:
            lines += self.loss.problems()
        return "\n".join(lines)

    def gradient_lines(self, check: GradientCheck) -> list[str]:
        """What differs in one gradient check, put down to its causes where modules were checked alone, and
        each embedding table that differs only where rows get no gradient."""
        padded = [
            f"only {_rows(rows)} of {self.user_name(name)} differs: an embedding built with padding_idx (transformers' "
            "pad_token_id) gives its row no gradient from the lookup, where d2l's BERT trains every row"
            for name, rows in check.rows_alone_differing.items()
        ]
        return self._causes_of(check) + padded

    def _causes_of(self, check: GradientCheck) -> list[str]:
        if not check.causes:
            if check.ungraded:
                return [f"no gradient reaches {', '.join(self.user_name(name) for name in check.ungraded)}"]
            first = check.first_divergence
            return [] if first is None else [self._in_user_names(first)]
        lines = []
        follows = check.caused_by("forward")
        if follows:
            lines.append(f"{self._modules(follows)} compute other values from the oracle's input, and the gradients "
                         f"of their {len(follows)} parameter(s) differ with them")  # fmt: skip
        own = check.caused_by("backward")
        if own:
            missing = [self.user_name(name) for name in own if name in check.ungraded]
            wrong = [c for c in check.comparisons if c.name in own and not c.passed]
            said = ([f"no gradient reaches {', '.join(missing)}"] if missing else []) + (
                [f"worst {self._in_user_names(max(wrong, key=lambda c: c.ratio))}"] if wrong else []
            )
            lines.append(f"the backward of {self._modules(own)} is wrong on its own (fed the oracle's input and "
                         f"output gradient): {'; '.join(said)}")  # fmt: skip
        carried = check.caused_by("carried")
        if carried:
            lines.append(f"{len(carried)} other parameter(s) get the oracle's gradient when their modules are checked "
                         "alone: their differences are carried from the above")  # fmt: skip
        return lines

    def _in_user_names(self, comparison: Comparison) -> str:
        return dataclasses.replace(comparison, name=self.user_name(comparison.name)).describe()

    def _modules(self, parameters: list[str]) -> str:
        """The modules holding ``parameters``: each by the activation it computes and, where its parameters'
        names in the user's model share a prefix, that prefix."""
        groups: dict[str, list[list[str]]] = {}
        for name in parameters:
            groups.setdefault(activation_of(self.config, name), []).append(self.user_name(name).split("."))
        named = []
        for module, names in groups.items():
            prefix = ".".join(_shared_prefix(names) if len(names) > 1 else names[0][:-1])
            named.append(f"{module} (yours: {prefix})" if prefix else module)
        return ", ".join(named)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.label,
            "passed": self.passed,
            "parameters placed by": self.mapping.how,
            "placements": {name: self.mapping.user_name(name) for name in self.mapping.placements},
            "activations": self.activations,
            "forward": self.forward.to_json(),
            "gradients": [
                {
                    "scalar": check.scalar,
                    "device": check.device,
                    "passed": check.passed,
                    "no_gradient": list(check.ungraded),
                    "frozen": list(check.frozen),
                    "worst": _worst(check),
                    "causes": {self.user_name(name): CAUSES[cause] for name, cause in check.causes.items()},
                    "rows_alone_differing": {
                        self.user_name(name): list(rows) for name, rows in check.rows_alone_differing.items()
                    },
                }
                for check in self.gradients
            ],
            "gradients_skipped": self.gradients_skipped,
            "not_checked": self.absent,
            "diagnoses": [
                {
                    "activation": d.activation,
                    "module": d.where,
                    "mistake": d.mistake.name if d.mistake else None,
                    "also": [mistake.name for mistake, _ in d.also],
                    "change": {
                        key: str(value) for rule in (d.rule, *(r for _, r in d.also)) for key, value in rule.items()
                    },
                    "reproduces_to": d.error,
                    "d2l_rule_off_by": d.off,
                    "said": d.describe(),
                }
                for d in self.diagnoses
            ],
            "loss": None
            if self.loss is None
            else {
                "passed": self.loss.passed,
                "normalization": self.loss.normalization,
                "values": list(self.loss.values),
                "diagnosis": self.loss.diagnosis,
            },
        }


def _worst(check: GradientCheck) -> dict[str, Any] | None:
    if not check.comparisons:
        return None
    worst = max(check.comparisons, key=lambda c: c.ratio)
    return {"parameter": worst.name, "max_abs": worst.max_abs, "ratio": worst.ratio}


def _shared_prefix(paths: list[list[str]]) -> list[str]:
    """The leading parts that every one of ``paths`` (dotted names, split) shares."""
    return [level[0] for level in itertools.takewhile(lambda level: len(set(level)) == 1, zip(*paths))]


def _rows(rows: tuple[int, ...]) -> str:
    """ "row 0", "rows 0, 3", for a sentence (a table differs in at most ``MAX_PADDING_ROWS`` so)."""
    return f"row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows))}"
