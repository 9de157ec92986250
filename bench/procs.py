"""Processes the load benchmark starts: each on loopback, waited for until it listens or
announces its port (at most 30 s), and stopped by its PID; their CPU ticks read from /proc."""

import socket
import subprocess
import time
from pathlib import Path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A process we started; stopped by its PID."""

    def __init__(self, args, wait_port=None, announce=False, env=None):
        started = time.monotonic()
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        self.port = wait_port
        if announce:
            deadline = time.time() + 30
            while time.time() < deadline:
                line = self.p.stdout.readline()
                if line.startswith("LISTENING "):
                    self.port = int(line.split()[1])
                    break
            else:
                raise RuntimeError(f"{args[0]} did not announce its port")
        elif wait_port:
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", wait_port), timeout=0.2):
                        break
                except OSError:
                    time.sleep(0.01)
            else:
                raise RuntimeError(f"{args[0]} did not listen on {wait_port}")
        self.ready_ms = (time.monotonic() - started) * 1e3
        self.idle_rss = self.rss_mib("VmRSS:")

    def cpu_ticks(self):
        fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    def rss_mib(self, field="VmHWM:"):
        for line in Path(f"/proc/{self.p.pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def proc_ticks(pid):
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])
