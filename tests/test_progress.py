"""Progress bars (rgpt_dist/progress.py): drawn on a terminal, never into a pipe or a log, and not at
all under --quiet (RGPT_QUIET), which the processes a command starts inherit."""
import fcntl
import os
import pty
import struct
import termios
import subprocess
import sys
import threading

import pytest

CODE = ("from rgpt_dist.progress import bar\n"
        "for _ in bar(range(3), desc='cells', unit='cell'): pass\n"
        "print('done', flush=True)\n")


def _run(stderr_tty: bool, quiet: bool) -> tuple[str, str]:
    """The child's stdout and stderr, its stderr a pseudo-terminal or a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "RGPT_QUIET"}
    if quiet:
        env["RGPT_QUIET"] = "1"
    if not stderr_tty:
        done = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=60)
        return done.stdout, done.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    chunks: list[bytes] = []

    def drain():  # read while the child runs: once it has closed the terminal, what it held is gone
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    proc = subprocess.Popen([sys.executable, "-c", CODE], env=env, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    out, _ = proc.communicate(timeout=60)
    reader.join(timeout=10)
    os.close(master)
    err = b"".join(chunks)
    return out, err.decode(errors="replace")


@pytest.mark.parametrize("tty,quiet,drawn", [(True, False, True), (True, True, False), (False, False, False)])
def test_a_bar_is_drawn_only_on_a_terminal_and_not_when_quiet(tty, quiet, drawn):
    out, err = _run(tty, quiet)
    assert out == "done\n"
    assert ("cells:" in err and "cell/s" in err) == drawn, err


def test_quiet_reaches_the_processes_a_command_starts(monkeypatch):
    from rgpt_dist import progress

    monkeypatch.delenv("RGPT_QUIET", raising=False)
    progress.quiet()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('RGPT_QUIET'))"],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout == "1\n"
