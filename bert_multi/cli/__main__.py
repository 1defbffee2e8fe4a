"""``python -m bert_multi.cli``: the ``bert-multi`` command, from a source tree with nothing installed."""

from . import command

command()
