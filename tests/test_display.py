"""Showing work to people (``bert_multi.display``): progress on a terminal as a bar, and on a log (CI,
``nohup``, a file) as lines that never leave it silent for longer than ``ProgressBar.LOG_EVERY_S``."""

import io

from bert_multi import verify
from bert_multi.display import ProgressBar


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def lines_of(stream):
    return stream.getvalue().splitlines()


def test_on_a_log_work_is_told_as_it_starts_and_ends_and_at_least_every_ten_seconds_between():
    """Updates at uneven times (one step of 47 s without any) and the timer's tick every second: the gaps
    between the lines a log gets are never over LOG_EVERY_S (a tick is a second late at most)."""
    clock, stream = Clock(), io.StringIO()
    bar = ProgressBar(stream, clock=clock)
    bar.stopped.set()  # the timer's ticks are this test's own, on its clock
    updates = {0.0: 0, 2.0: 1, 3.5: 2, 50.5: 3, 51.0: 4, 63.0: 5, 64.0: 6}
    said = []
    for tenth in range(0, 700):
        clock.now = tenth / 10
        before = len(lines_of(stream))
        if clock.now in updates:
            bar(updates[clock.now], 6, f"case {updates[clock.now]}")
        elif tenth % 10 == 0:
            bar.tick()
        said += [clock.now] * (len(lines_of(stream)) - before)
    assert said[0] == 0.0 and said[-1] == 64.0  # the start, and the end (6/6) at once
    assert max(b - a for a, b in zip(said, said[1:])) <= ProgressBar.LOG_EVERY_S + 1
    assert any(line.endswith("2/6 case 2 (still at it)") for line in lines_of(stream))  # inside the long step
    assert len(said) < 12  # now and then, not at every update
    assert "\r" not in stream.getvalue()


def test_on_a_terminal_it_is_a_bar_redrawn_in_place():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = ProgressBar(stream)
    bar(1, 4, "case 1")
    bar(2, 4, "case 2")
    bar.close()
    assert "\n" not in stream.getvalue() and stream.getvalue().count("\r") == 4  # two updates, the clearing
    assert "[##############..............] 2/4 case 2" in stream.getvalue()
    assert bar.timer is None  # a terminal has its bar: no timer


def test_verify_tells_each_check_after_the_forward_run_as_it_starts():
    from test_verify_core import CONFIG, OracleInDisguise

    heard = []
    verify(OracleInDisguise(CONFIG), CONFIG, gradients=True, progress=lambda *update: heard.append(update))
    assert heard[-3:] == [
        (0, 2, "OracleInDisguise: the diagnosis"),
        (1, 2, "OracleInDisguise: gradients"),
        (2, 2, "OracleInDisguise: checked"),
    ]
