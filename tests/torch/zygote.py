"""Fork server of the torch tests (harness.py starts one per pytest session): imports torch once,
then starts every rank it is asked for as a fork of itself, as torch's DataLoader forks its
workers. A rank so saves torch's import (seconds on 2 cores, four ranks at once); from there on
it is the script run as a program: its own environment, argv, stdout, and a normal exit
(atexit handlers and C++ destructors run). hicoll is not imported here: ranks import it under
their own environment, and without_import.py checks that nothing did before it.

One JSON object per line; stdin carries requests, stdout answers:
  {"argv": [SCRIPT, ARG...], "env": {...}, "out": PATH}  ->  {"pid": PID}
  and once that rank ends                                 ->  {"exit": PID, "rc": RC}
  {"kill": [PID...]}: SIGKILL to those of them still running (no answer)
RC as subprocess gives it: the exit status, or -N after signal N. EOF on stdin ends it."""
import json
import os
import runpy
import select
import signal
import sys

import torch  # noqa: F401  what every rank imports first
import torch.distributed  # noqa: F401


def answer(msg: dict) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def serve() -> dict:
    """Returns only in a forked rank, with its request."""
    pending = b""
    ranks: dict[int, int] = {}  # pidfd -> pid
    while True:
        readable, _, _ = select.select([0, *ranks], [], [])
        for fd in readable:
            if fd == 0:
                continue
            pid = ranks.pop(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            answer({"exit": pid, "rc": os.waitstatus_to_exitcode(status)})
        if 0 not in readable:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)  # the session ended; ranks still running are the harness's to kill
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            if "kill" in req:  # only ranks not reaped yet: their pids cannot have been reused
                for fd, pid in ranks.items():
                    if pid in req["kill"]:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                continue
            pid = os.fork()
            if pid == 0:
                for fd in ranks:
                    os.close(fd)
                return req
            ranks[os.pidfd_open(pid)] = pid
            answer({"pid": pid})


req = serve()
out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.dup2(out, 1)
os.dup2(out, 2)
os.close(null)
os.close(out)
os.environ.clear()
os.environ.update(req["env"])
sys.argv = list(req["argv"])
sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
del req, out, null
runpy.run_path(sys.argv[0], run_name="__main__")
