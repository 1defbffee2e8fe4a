"""A worker of another environment that misbehaves as ``HOSTILE_WORKER`` says: the real worker
(``python -m bert_multi.backend.worker``) serving the NumPy oracle (or ``HOSTILE_BACKEND``) under whatever backend name
it is asked for, with one request answered badly. ``tests/test_environments.py`` runs it as the "Python" of a
backend (``hostile_python``), so the caller meets it exactly as it meets a real worker.

``HOSTILE_MARK``, when set, is a file the worker writes its process id to when it starts misbehaving.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from bert_multi.backend import worker
from bert_multi.errors import UserCodeError, WeightsError

MODE = os.environ.get("HOSTILE_WORKER", "")
Session = worker.Session
honest_load, honest_forward, honest_step, honest_state = Session.load, Session.forward, Session.step, Session.state
honest_cut, honest_kernel_eps = Session.cut, Session.kernel_eps


def mark() -> None:
    if os.environ.get("HOSTILE_MARK"):
        Path(os.environ["HOSTILE_MARK"]).write_text(str(os.getpid()))


def load(self, backend):
    if MODE == "floods stderr":
        for _ in range(200):  # 200 MB, written before the reply
            sys.stderr.write("x" * (1 << 20))
        sys.stderr.write("\nthe last line before the reply\n")
    described = honest_load(self, os.environ.get("HOSTILE_BACKEND", "numpy"))
    if MODE == "describes itself with the wrong types":
        return {**described, "devices": "cpu", "trains": 1}
    return described


def forward(self, model, inputs, out, intermediates):
    mark()
    if MODE == "hangs":  # its heartbeat goes on: only the request's deadline ends it
        time.sleep(3600)
    if MODE == "freezes":  # stopped whole, heartbeat and all
        os.kill(os.getpid(), signal.SIGSTOP)
    if MODE == "works slowly":
        time.sleep(3)
    if MODE == "dies":
        sys.stderr.write("the worker's last words\n")
        sys.stderr.flush()
        os._exit(3)
    if MODE == "dies leaving a child":  # which holds its pipes open, and says so in HOSTILE_MARK
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        Path(os.environ["HOSTILE_MARK"]).write_text(str(child.pid))
        os._exit(3)
    if MODE == "raises the user's error":
        raise UserCodeError.__new__(UserCodeError, "your forward raised ZeroDivisionError: division by zero")
    if MODE == "replies with a FIFO":
        os.mkfifo(out)
        return {"intermediates": None}
    if MODE.startswith("replaces its directory with a "):  # a link to HOSTILE_ELSEWHERE, or a file
        directory = Path(out).parent
        shutil.rmtree(directory)
        if MODE.endswith("link"):
            directory.symlink_to(os.environ["HOSTILE_ELSEWHERE"])
        else:
            directory.write_text("a file where the directory was")
        return {"intermediates": None}
    reply = honest_forward(self, model, inputs, out, intermediates)
    if MODE == "replies with garbage":
        Path(out).write_bytes(b"PK\x03\x04 not a zip at all")
    if MODE == "replies compressed":  # 1 MB of zeros that would inflate far beyond the file
        arrays = dict(np.load(out))
        np.savez_compressed(out, **arrays, padding=np.zeros(1 << 18, np.float32))
    if MODE == "replies misshapen":
        arrays = dict(np.load(out))
        np.savez(out, **{**arrays, "encoded": arrays["encoded"][:, :1]})
    if MODE == "replies with no output":
        with zipfile.ZipFile(out, "w"):
            pass
    return reply


def step(self, trainer, batch, totals):
    if MODE == "raises a bug":  # an exception of no bert_multi class, as a bug in the worker raises
        raise KeyError("no such optimizer slot")
    if MODE == "raises a long error":  # 1.4 MB of lines (twice: in its traceback too), past the worker's bound
        worker.MAX_ERROR_TEXT = 10**8
        raise WeightsError("the first line\n" + "and another line\n" * 80_000)
    if MODE == "dies":
        sys.stderr.write("the worker's last words\n")
        sys.stderr.flush()
        os._exit(3)
    return honest_step(self, trainer, batch, totals)


def state(self, trainer, out):
    reply = honest_state(self, trainer, out)
    if MODE == "forgets the optimizer state":
        np.savez(out)
    return reply


def cut(self, model, max_len):
    if MODE == "describes a model it does not hold":  # a number that is text, and no dtype
        return {"model": "7", "device": "cpu", "recorded": None, "info": {}}
    return honest_cut(self, model, max_len)


def kernel_eps(self, eps):
    if MODE == "answers with the wrong types":  # NaN, as Python's json writes it
        return {"eps": float("nan")}
    return honest_kernel_eps(self, eps)


def serve(requests, reply, interval=5.0):
    def replying(message):
        reply(message)
        if MODE == "replies ahead" and "role" in message:  # after load's reply, one to no request yet
            reply({"ok": True, "reason": None})

    honest_serve(requests, replying, interval)


honest_serve, worker.serve = worker.serve, serve
Session.load, Session.forward, Session.step, Session.state, Session.cut = load, forward, step, state, cut
Session.kernel_eps = kernel_eps

if __name__ == "__main__":
    worker.main()
