"""The fleet's stores for `bench/load.py --fleet`: a redis-server and a PostgreSQL cluster in one
temp dir on loopback (OS-picked ports; `initdb` run as the `postgres` user when started as root),
what they did per call (Redis `INFO commandstats`, their CPU from /proc, the audit rows written),
and the everything-on config pointed at them. Every wait is bounded; both are stopped by PID."""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from procs import Proc, free_port, proc_ticks


class Fleet:
    """redis-server and a PostgreSQL cluster for the fleet targets, in one temp dir, on loopback."""

    def __init__(self):
        self.work = work = tempfile.mkdtemp(prefix="portcullis-fleet-")
        self.redis_port = free_port()
        self.redis = Proc(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", work], wait_port=self.redis_port)
        self.pg = None
        try:
            self.start_postgres(work)
        except BaseException:
            self.stop()
            raise

    def start_postgres(self, work):
        pg_bin = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))[-1].parent
        self.pg_bin = pg_bin
        data = Path(work) / "pgdata"
        user = None
        if os.geteuid() == 0:
            import pwd
            pw = pwd.getpwnam("postgres")
            user = (pw.pw_uid, pw.pw_gid)
            os.chown(work, *user)
        demote = (lambda: (os.setgid(user[1]), os.setuid(user[0]))) if user else None
        subprocess.run([str(pg_bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, preexec_fn=demote, timeout=120)
        self.pg_port = free_port()
        self.pg = subprocess.Popen([str(pg_bin / "postgres"), "-D", str(data), "-p", str(self.pg_port), "-c", "listen_addresses=127.0.0.1",
                                    "-c", f"unix_socket_directories={work}", "-c", "max_connections=50"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=demote)
        deadline = time.time() + 30
        while time.time() < deadline:
            if subprocess.run([str(pg_bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-q"]).returncode == 0:
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("PostgreSQL did not start within 30 s")

    def redis_url(self):
        return f"redis://127.0.0.1:{self.redis_port}"

    def pg_url(self):
        return f"postgres://postgres@127.0.0.1:{self.pg_port}/postgres"

    def commandstats(self):
        """Calls per command since start, from `INFO commandstats`."""
        out = {}
        for line in redis_command(self.redis_port, "INFO commandstats").splitlines():
            if line.startswith("cmdstat_"):
                name, _, rest = line[8:].partition(":")
                fields = dict(kv.split("=") for kv in rest.split(","))
                out[name] = int(fields["calls"])
        return out

    def redis_ticks(self):
        return proc_ticks(self.redis.p.pid)

    def pg_ticks(self):
        """CPU ticks of the postmaster and every backend it forked."""
        total = proc_ticks(self.pg.pid)
        for child in Path("/proc").iterdir():
            if child.name.isdigit():
                try:
                    stat = (child / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(stat[1]) == self.pg.pid:
                    total += int(stat[11]) + int(stat[12])
        return total

    def audit_rows(self):
        out = subprocess.run([str(self.pg_bin / "psql"), "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres", "-X", "-A",
                              "-t", "-q", "-c", "select count(*) from portcullis_events"], capture_output=True, text=True, timeout=30)
        try:
            return int(out.stdout.strip())
        except ValueError:
            return 0

    def settled_rows(self, seconds=10):
        """The audit rows once shipping has caught up (the count unchanged for about a second), waiting at most `seconds`."""
        last, same, deadline = -1, 0, time.time() + seconds
        while time.time() < deadline:
            rows = self.audit_rows()
            same = same + 1 if rows == last else 0
            if same == 3:
                return rows
            last = rows
            time.sleep(0.3)
        return last

    def stop(self):
        if self.pg:
            self.pg.send_signal(2)
            try:
                self.pg.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.pg.kill()
        self.redis.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def redis_command(port, line):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"{line}\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            # A bulk reply: `$<len>\r\n<data>\r\n`.
            if data.startswith(b"$"):
                head, _, body = data.partition(b"\r\n")
                if len(body) >= int(head[1:]) + 2:
                    return body[: int(head[1:])].decode()
            elif data.endswith(b"\r\n"):
                return data.decode()
        return data.decode()


# The fleet targets (--fleet): label -> (state and buckets in Redis, audit in PostgreSQL).
FLEET_TARGETS = {"everything on, Redis state": (True, False), "everything on, PostgreSQL audit": (False, True),
                 "everything on, Redis + PostgreSQL": (True, True)}


def fleet_config(base, fleet, work, label, redis, postgres):
    """The everything-on config with the fleet's stores: state and buckets in Redis, the audit in PostgreSQL."""
    text = base
    if postgres:
        text = re.sub(r'\[audit\]\n[^\[]*', f'[audit]\nbackend = "postgres"\nurl = "{fleet.pg_url()}"\n'
                      f'spool = "{work}/spool-{slug(label)}.jsonl"\n', text)
    if redis:
        text += (f'[state]\nbackend = "redis"\nredis_url = "{fleet.redis_url()}"\nnamespace = "{slug(label)}"\n'
                 f'[rate_limit]\nbackend = "redis"\n[approvals]\nkey = "{"k" * 40}"\n')
    return text


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
