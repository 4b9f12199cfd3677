#!/usr/bin/env python3
"""Sharded tuning end to end: real `tokamax autotune --store` processes and a real redis-server on
a free loopback port (started and stopped here).

1, 2 and 4 processes tune the same bound-args file and end with the same complete result; a process
killed with SIGKILL mid-run has its keys re-tuned by the other; a run id reused with other inputs is
refused; the store stopped mid-run gives the deadline's error, and a new run resumes from what was
published once it is back; the remote cache rung serves a key only another process tuned, and a dead
store falls back to the local ladder within its timeout; a store that answers a byte every 0.3 s
ends `explain` and `autotune --store` within their bounds; `cache show|verify --store`.

Usage: fleet_cli_test.py TOKAMAX_CLI WORK_DIR
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

CLI, WORK = sys.argv[1], sys.argv[2]
FAST = ["--max-candidates", "2", "--measure-budget-s", "0.2"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self, port, data_dir):
        self.port, self.dir, self.proc = port, data_dir, None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self, *extra):
        os.makedirs(self.dir, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--dbfilename", "dump.rdb",
             "--loglevel", "warning", *extra], stdout=subprocess.DEVNULL)
        for _ in range(250):
            if self.cli("ping") == "PONG":
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True,
                           text=True)
        return r.stdout.strip()

    def stop(self, save=False):
        if self.proc is None:
            return
        if save:
            self.cli("save")
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class TrickleServer:
    """A fake Redis that answers every command a byte every 0.3 s (with prompt_info, every one
    but the handshake's INFO): each read of the client sees data well within any timeout, so only
    a bound on the whole command ends the wait."""

    def __init__(self, prompt_info=False):
        self.prompt_info = prompt_info
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.accept, daemon=True)]
        self.threads[0].start()

    def accept(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            t = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def serve(self, conn):
        # A 200-byte INFO reply (a minute at this pace), whatever the command.
        info = b"# Server\r\nredis_version:7.0.15\r\n" + b"x" * 160
        reply = b"$%d\r\n%s\r\n" % (len(info), info)
        with conn:
            try:
                while True:
                    command = conn.recv(65536)
                    if not command:
                        return
                    if self.prompt_info and b"INFO" in command:
                        conn.sendall(reply)
                        continue
                    for i in range(len(reply)):
                        if self.stop.wait(0.3):
                            return
                        conn.sendall(reply[i:i + 1])
            except OSError:
                return  # the client gave up and closed the connection

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.sock.close()


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what, flush=True)


def env(**kw):
    e = dict(os.environ, TOKAMAX_LOG="warning", TOKAMAX_CACHE_DIR=os.path.join(WORK, "cache"))
    e.update(kw)
    return e


def autotune(args, **kw):
    return subprocess.Popen([CLI, "autotune", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(**kw))


def keys_of(path):
    with open(path) as f:
        d = json.load(f)
    return sorted(json.dumps(b, sort_keys=True) for b, _ in d["data"])


def sharded(redis, run_id, bound_args, n, extra=()):
    procs = [autotune(["--bound-args", bound_args, "--store", redis.url, "--run-id", run_id,
                       "--rank", str(r), "--world-size", str(n), "-o",
                       os.path.join(WORK, f"{run_id}_{r}.json"), *FAST, *extra])
             for r in range(n)]
    outs = [p.communicate(timeout=600) for p in procs]
    return procs, outs


def main():
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            sys.exit("redis-server missing (scripts/install-deps installs it)")
        print("redis-server not installed: skipped")
        sys.exit(77)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    os.chdir(WORK)
    # The bound-args file: every smoke spec's native implementation (10+ cheap keys).
    specs = json.loads(subprocess.run([CLI, "specs", "--tag", "smoke", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    entries = [{"arguments": s["arguments"], "op": {"family": s["op"], "implementation": "native"}}
               for s in specs if "backward" not in s["tags"]]
    with open("ba.json", "w") as f:
        json.dump(entries, f)
    with open("ba_other.json", "w") as f:
        json.dump(entries[:-1], f)
    port = free_port()
    redis = Redis(port, os.path.join(WORK, "redis"))
    redis.start()
    try:
        # 1, 2 and 4 processes: the same complete result in every process.
        expected = None
        for n in (1, 2, 4):
            procs, outs = sharded(redis, f"r{n}", "ba.json", n)
            for r, (p, (out, err)) in enumerate(zip(procs, outs)):
                check(p.returncode == 0, f"{n} processes: rank {r} exit 0 ({err[-2000:]})")
            sets = [keys_of(f"r{n}_{r}.json") for r in range(n)]
            if expected is None:
                expected = sets[0]
                check(len(expected) == len(entries), f"one result per key ({len(expected)})")
            check(all(s == expected for s in sets), f"{n} processes: same merged result set")
        # Work was shared: with 2 processes each tuned some keys (the results name who tuned).
        workers = {json.loads(v)["worker"] for v in redis.cli(
            "hvals", f"tokamax:{{r2}}:{scope(redis, 'r2')}:results").splitlines()}
        check(len(workers) == 2, f"2 processes both tuned keys ({workers})")

        # A run id reused with other inputs is refused (exit 2, a clear message).
        p = autotune(["--bound-args", "ba_other.json", "--store", redis.url, "--run-id", "r1",
                      *FAST])
        out, err = p.communicate(timeout=120)
        check(p.returncode == 2 and "other bound arguments" in err,
              f"differing inputs refused ({p.returncode}: {err.strip()[-300:]})")

        # SIGKILL mid-run: the other process re-tunes the dead one's keys when its lease expires.
        a = autotune(["--bound-args", "ba.json", "--store", redis.url, "--run-id", "rkill",
                      "--lease-s", "1.5", "-o", "rkill_a.json", *FAST])
        b = autotune(["--bound-args", "ba.json", "--store", redis.url, "--run-id", "rkill",
                      "--lease-s", "1.5", "-o", "rkill_b.json", *FAST])
        inflight = run_key(redis, "rkill", "inflight")
        held = wait_until(lambda: [i for i, v in hash_items(redis, inflight)
                                   if f":{b.pid}/" in v])
        check(bool(held), f"the second process holds a key ({held})")
        b.send_signal(signal.SIGKILL)
        b.wait()
        out, err = a.communicate(timeout=600)
        check(a.returncode == 0, f"survivor of a SIGKILL exits 0 ({err[-1500:]})")
        check(keys_of("rkill_a.json") == expected, "survivor's result is complete")
        # The dead process held a key when killed; the result is complete, so the survivor tuned
        # it after the lease expired, and nothing is left in flight.
        check(not hash_items(redis, inflight), "nothing left in flight")

        # The store stopped mid-run: the deadline's error; restarted, a new run resumes.
        p = autotune(["--bound-args", "ba.json", "--store", redis.url, "--run-id", "rstop",
                      "--deadline-s", "12", "--store-timeout-s", "0.5", *FAST])
        results_key = run_key(redis, "rstop", "results")
        wait_until(lambda: int(redis.cli("hlen", results_key) or 0) >= 2)
        published = int(redis.cli("hlen", results_key))
        redis.stop(save=True)
        t0 = time.time()
        out, err = p.communicate(timeout=120)
        check(p.returncode == 1 and "deadline" in err and "still missing" in err,
              f"store down: deadline error ({p.returncode}: {err.strip()[-400:]})")
        check(time.time() - t0 < 20, f"the error came within the deadline ({time.time() - t0:.1f} s)")
        redis.start()
        # At least those counted before the stop: the run may publish another between the
        # count and the SAVE, and that one is kept too.
        kept = int(redis.cli("hlen", results_key))
        check(published <= kept <= len(expected),
              f"{published} published results kept over the restart ({kept} there)")
        p = autotune(["--bound-args", "ba.json", "--store", redis.url, "--run-id", "rstop",
                      "-o", "rstop.json", *FAST])
        out, err = p.communicate(timeout=600)
        check(p.returncode == 0 and keys_of("rstop.json") == expected,
              f"the resumed run completes ({err[-800:]})")
        before = [v for v in redis.cli("hvals", results_key).splitlines()
                  if f":{p.pid}/" not in v]
        check(len(before) >= published, f"{len(before)} keys came from the first run, not re-tuned")

        # The remote cache rung: process A tunes and publishes; B (empty local caches) is served.
        empty = os.path.join(WORK, "empty")
        os.makedirs(empty, exist_ok=True)
        p = autotune(["--spec", "layer_norm_smoke", "--op", "layer_norm", "--impl", "native",
                      "--into-cache", *FAST], TOKAMAX_REMOTE_CACHE=redis.url,
                     TOKAMAX_CACHE_DIR=os.path.join(WORK, "cache_a"))
        out, err = p.communicate(timeout=300)
        check(p.returncode == 0 and "published 1 keys" in err, f"publish on --into-cache ({err[-500:]})")
        r = subprocess.run([CLI, "explain", "--op", "layer_norm", "--spec", "layer_norm_smoke",
                            "--impl", "native", "--json"], capture_output=True, text=True,
                           env=env(TOKAMAX_REMOTE_CACHE=redis.url, TOKAMAX_CACHE_DIR=empty,
                                   TOKAMAX_DATA_DIR=empty))
        check(r.returncode == 0 and json.loads(r.stdout)["rung"] == "remote_cache",
              f"explain names the remote_cache rung ({r.stdout[-400:]} {r.stderr[-300:]})")
        r = subprocess.run([CLI, "cache", "show", "--store", redis.url], capture_output=True,
                           text=True, env=env())
        check(r.returncode == 0 and "layer_norm" in r.stdout, "cache show --store lists it")
        r = subprocess.run([CLI, "cache", "merge", "r1_0.json", "--store", redis.url],
                           capture_output=True, text=True, env=env())
        check(r.returncode == 0 and f"{len(expected)} of {len(expected)} keys published" in r.stdout,
              f"cache merge --store publishes a result file ({r.stdout.strip()} {r.stderr[-300:]})")
        r = subprocess.run([CLI, "cache", "verify", "--store", redis.url], capture_output=True,
                           text=True, env=env())
        check(r.returncode == 0 and r.stdout.startswith("ok"), f"cache verify --store ({r.stdout})")
        # One cache hash replaced by a string (another writer's key): that hash is named as bad,
        # the others are still listed and verified (the command used to stop at it).
        hashes = sorted(redis.cli("--scan", "--pattern", "tokamax:cache:*").splitlines())
        check(len(hashes) >= 1, f"the remote cache's hashes are in the store ({hashes})")
        foreign = hashes[0]
        redis.cli("del", foreign)
        redis.cli("set", foreign, "not a hash")
        r = subprocess.run([CLI, "cache", "verify", "--store", redis.url], capture_output=True,
                           text=True, env=env())
        check(r.returncode == 1 and f"BAD  {foreign} " in r.stdout and "WRONGTYPE" in r.stdout,
              f"cache verify --store names the wrong-typed hash ({r.stdout[-600:]} {r.stderr[-300:]})")
        r = subprocess.run([CLI, "cache", "show", "--store", redis.url, "--json"],
                           capture_output=True, text=True, env=env())
        shown = json.loads(r.stdout) if r.returncode == 0 else []
        check(any(e["hash"] == foreign and "WRONGTYPE" in e.get("error", "") for e in shown)
              and {e["hash"] for e in shown} == set(hashes),
              f"cache show --store lists every hash, the wrong-typed one as an error ({r.stdout[-600:]})")
        redis.cli("del", foreign)
        # A dead store: the local ladder serves, within the bounded timeout, with a warning.
        dead = f"redis://127.0.0.1:{free_port()}/0"
        t0 = time.time()
        r = subprocess.run([CLI, "explain", "--op", "layer_norm", "--spec", "layer_norm_smoke",
                            "--impl", "native", "--json"], capture_output=True, text=True,
                           env=env(TOKAMAX_REMOTE_CACHE=dead, TOKAMAX_CACHE_DIR=empty,
                                   TOKAMAX_DATA_DIR=empty))
        check(r.returncode == 0 and json.loads(r.stdout)["rung"] == "heuristics"
              and "local cache only" in r.stderr and time.time() - t0 < 5,
              f"dead store: heuristics, warning, {time.time() - t0:.1f} s")
        # A store that answers a byte every 0.3 s: each command is bounded as a whole (the
        # remote rung's 0.5 s, --store-timeout-s), not each read, so neither command outlasts
        # its bound (the checks allow for a loaded machine).
        trickle = TrickleServer()
        try:
            t0 = time.time()
            r = subprocess.run([CLI, "explain", "--op", "layer_norm", "--spec", "layer_norm_smoke",
                                "--impl", "native", "--json"], capture_output=True, text=True,
                               env=env(TOKAMAX_REMOTE_CACHE=trickle.url, TOKAMAX_CACHE_DIR=empty,
                                       TOKAMAX_DATA_DIR=empty), timeout=120)
            took = time.time() - t0
            check(r.returncode == 0 and json.loads(r.stdout)["rung"] == "heuristics" and took < 10,
                  f"trickling store: explain falls back to heuristics in {took:.1f} s "
                  f"({r.stderr[-300:]})")
            t0 = time.time()
            p = autotune(["--bound-args", "ba.json", "--store", trickle.url, "--run-id", "t",
                          "--deadline-s", "15", "--store-timeout-s", "1", *FAST])
            out, err = p.communicate(timeout=300)
            took = time.time() - t0
            check(p.returncode == 1 and "timed out" in err and took < 40,
                  f"trickling store: autotune --store fails in {took:.1f} s ({err[-300:]})")
        finally:
            trickle.close()
        # The handshake answered, every later command trickled: the run's deadline holds.
        trickle = TrickleServer(prompt_info=True)
        try:
            t0 = time.time()
            p = autotune(["--bound-args", "ba.json", "--store", trickle.url, "--run-id", "t",
                          "--deadline-s", "15", "--store-timeout-s", "1", *FAST])
            out, err = p.communicate(timeout=300)
            took = time.time() - t0
            check(p.returncode == 1 and "timed out" in err and took < 40,
                  f"trickling store after the handshake: autotune --store ends in {took:.1f} s "
                  f"({err[-300:]})")
        finally:
            trickle.close()
        # Unreachable store for sharded tuning: a clear error naming it, no hang.
        p = autotune(["--bound-args", "ba.json", "--store", dead, "--run-id", "x", *FAST])
        out, err = p.communicate(timeout=60)
        check(p.returncode == 1 and "cannot connect" in err, f"unreachable store ({err[-300:]})")
        # A host measurement lock that cannot be used: refused before any work.
        p = autotune(["--bound-args", "ba.json", "--store", redis.url, "--run-id", "lock",
                      "--host-lock", os.path.join(WORK, "no", "such", "dir"), *FAST])
        out, err = p.communicate(timeout=60)
        check(p.returncode == 2 and "cannot be opened" in err, f"unusable host lock ({err[-300:]})")
    finally:
        redis.stop()

    # Redis Cluster, one node holding every slot: the same protocol unchanged, every key of a
    # run in the one slot of its hash tag.
    # The cluster bus port is given, not left at the default port + 10000: that one may be taken
    # or past 65535 (the test then failed now and then with "redis-server did not start"). A
    # node file left by an earlier run is removed.
    cluster = Redis(free_port(), os.path.join(WORK, "cluster"))
    shutil.rmtree(cluster.dir, ignore_errors=True)
    cluster.start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                  "--cluster-port", str(free_port()))
    try:
        cluster.cli("cluster", "addslotsrange", "0", "16383")
        for _ in range(250):
            if "cluster_state:ok" in cluster.cli("cluster", "info"):
                break
            time.sleep(0.02)
        procs, outs = sharded(cluster, "rc", "ba.json", 2)
        for r, (p, (out, err)) in enumerate(zip(procs, outs)):
            check(p.returncode == 0, f"cluster: rank {r} exit 0 ({err[-1000:]})")
        check(all(keys_of(f"rc_{r}.json") == expected for r in range(2)),
              "cluster: same merged result set")
        slots = {cluster.cli("cluster", "keyslot", k)
                 for k in cluster.cli("keys", "tokamax:{rc}:*").splitlines()}
        check(len(slots) == 1, f"cluster: every key of the run in one slot ({slots})")
    finally:
        cluster.stop()
    print("fleet ok")


def wait_until(fn, timeout=60):
    """fn's first truthy value, polled every 50 ms (its last value after `timeout` seconds)."""
    end = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() > end:
            return v
        time.sleep(0.05)


def run_key(redis, run_id, suffix):
    """A key of the run's scope, once the run has started."""
    sc = wait_until(lambda: scope(redis, run_id))
    return f"tokamax:{{{run_id}}}:{sc}:{suffix}"


def hash_items(redis, key):
    lines = redis.cli("hgetall", key).splitlines()
    return list(zip(lines[::2], lines[1::2]))


def scope(redis, run_id):
    """The run's scope (device kind@version), read from the store's keys."""
    for k in redis.cli("keys", f"tokamax:{{{run_id}}}:*:cursor").splitlines():
        return k.split(":", 2)[2].rsplit(":", 1)[0]
    return None


if __name__ == "__main__":
    main()
