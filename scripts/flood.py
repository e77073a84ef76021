#!/usr/bin/env python3
"""A slowloris against `lockprobe service`: RSS before, during and after N half-sent
requests, and how long /healthz takes to answer meanwhile (RELIABILITY.md, "A flood of
half-sent requests", has the figures).

    cargo build --release
    python3 scripts/flood.py --connections 19000              # the defaults
    python3 scripts/flood.py --connections 19000 -- --max-connections 18000 --header-read-timeout 60s

Arguments after `--` go to `lockprobe service`. Needs `ulimit -n` above --connections
(the script raises its soft limit to the hard one). Linux only (/proc).
"""

import argparse
import errno
import os
import resource
import selectors
import socket
import subprocess
import sys
import time
import urllib.request


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(port, timeout):
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as r:
            ok = r.status == 200
    except Exception:
        ok = False
    return ok, time.monotonic() - started


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/lockprobe")
    ap.add_argument("--connections", type=int, default=19000)
    ap.add_argument("--hold", type=float, default=30.0, help="seconds to keep the flood up")
    ap.add_argument("service_args", nargs="*")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.connections + 64 > hard:
        sys.exit(f"--connections {args.connections} needs ulimit -n above it (hard limit {hard})")

    port = free_port()
    env = dict(os.environ, LOCKPROBE_LOCK_API_KEY="flood-key")
    service = subprocess.Popen(
        [args.binary, "service", "--listen", f"127.0.0.1:{port}", *args.service_args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if healthz(port, 1)[0]:
                break
            time.sleep(0.1)
        else:
            sys.exit("the service did not start")
        for _ in range(50):
            healthz(port, 1)
        before = rss_mib(service.pid)

        sel = selectors.DefaultSelector()
        socks = []
        started = time.monotonic()
        for _ in range(args.connections):
            s = socket.socket()
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", port))
            if err not in (0, errno.EINPROGRESS):
                s.close()
                continue
            sel.register(s, selectors.EVENT_WRITE)
            socks.append(s)
        sent = 0
        peak = before
        worst_healthz = 0.0
        failed_healthz = 0
        last_check = 0.0
        while time.monotonic() - started < args.hold:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                sel.unregister(s)
                try:
                    s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    sent += 1
                except OSError:
                    pass
            peak = max(peak, rss_mib(service.pid))
            if time.monotonic() - last_check > 2:
                ok, took = healthz(port, 30)
                worst_healthz = max(worst_healthz, took)
                failed_healthz += not ok
                last_check = time.monotonic()
        for s in socks:
            s.close()
        sel.close()
        time.sleep(2)
        after = rss_mib(service.pid)
        time.sleep(10)
        settled = rss_mib(service.pid)
        ok, took = healthz(port, 5)
        print(
            f"flood: {args.connections} connections opened, {sent} half-sent requests, held {args.hold:.0f} s; "
            f"RSS before {before:.1f} MiB, peak {peak:.1f} MiB, 2 s after {after:.1f} MiB, 12 s after {settled:.1f} MiB; "
            f"/healthz during: worst {worst_healthz:.2f} s, {failed_healthz} failed; after: {'ok' if ok else 'FAILED'} in {took:.3f} s"
        )
    finally:
        service.terminate()
        service.wait(10)


if __name__ == "__main__":
    main()
