"""``python -m bert_multi.cli``: the ``bert-multi`` command, from a source tree with nothing installed."""

import sys

from . import main

sys.exit(main())
