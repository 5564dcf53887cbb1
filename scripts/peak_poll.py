#!/usr/bin/env python3
"""Independent peak-memory measurement of a command's process tree (stdlib only).

Runs COMMAND, and every --interval-ms (default 20) walks the tree below it through
/proc/PID/task/TID/children and sums RssAnon + RssShmem + VmSwap over its processes -- the quantity
`memfit run` guards -- keeping the largest sum. It also keeps each process's last VmHWM (the kernel's
high-water mark of its RSS, file pages included) and its RssFile at the poll where its whole RSS was
largest (the poll nearest the mark), so a peak between two polls still shows in `hwm_minus_file_bytes`
(Σ over processes of VmHWM − that RssFile; the sum is the job's peak only when its processes peaked
together, as a single-process job does).

When COMMAND is `memfit run ...`, memfit itself is not counted: only the processes below it.

Prints one JSON object on stdout after COMMAND ends:
  {"exit_code", "polls", "poll_peak_bytes", "hwm_bytes", "hwm_minus_file_bytes", "processes", "stdout"}
where `stdout` is COMMAND's own stdout (e.g. memfit's --json summary).

Usage: peak_poll.py [--interval-ms N] [--skip-root] -- COMMAND...
"""

import argparse
import json
import os
import subprocess
import sys
import time


def status_fields(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Name":
                    out[key] = rest.strip()
                if key in ("RssAnon", "RssFile", "RssShmem", "VmSwap", "VmHWM"):
                    out[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        return None
    return out if "RssAnon" in out else None


def children(pid):
    kids = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(t) for t in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


def tree(root):
    out, i = [root], 0
    while i < len(out):
        out.extend(children(out[i]))
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--skip-root", action="store_true",
                    help="leave the command's own process out (set automatically for `memfit run`)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given")
    skip_root = a.skip_root or (os.path.basename(cmd[0]) == "memfit" and cmd[1:2] == ["run"])

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    # stdout is read after the command ends; memfit's summary is one line, far below a pipe's buffer.
    peak, polls = 0, 0
    hwm, max_rss, file_at_max, max_file, peak_each, names = {}, {}, {}, {}, {}, {}  # by PID: one short run
    period = a.interval_ms / 1000.0
    while proc.poll() is None:
        total = 0
        for pid in tree(proc.pid):
            if skip_root and pid == proc.pid:
                continue
            s = status_fields(pid)
            if s is None:
                continue
            charged = s["RssAnon"] + s.get("RssShmem", 0) + s.get("VmSwap", 0)
            total += charged
            peak_each[pid] = max(peak_each.get(pid, 0), charged)
            names[pid] = s["Name"]
            hwm[pid] = max(hwm.get(pid, 0), s.get("VmHWM", 0))
            max_file[pid] = max(max_file.get(pid, 0), s.get("RssFile", 0))
            rss = s["RssAnon"] + s.get("RssFile", 0) + s.get("RssShmem", 0)
            if rss >= max_rss.get(pid, 0):
                max_rss[pid], file_at_max[pid] = rss, s.get("RssFile", 0)
        peak = max(peak, total)
        polls += 1
        time.sleep(period)
    out = proc.stdout.read().decode(errors="replace")
    print(json.dumps({
        "exit_code": proc.returncode,
        "polls": polls,
        "poll_peak_bytes": peak,
        "hwm_bytes": sum(hwm.values()),
        "hwm_minus_file_bytes": sum(max(0, hwm[p] - file_at_max[p]) for p in hwm),
        "processes": [{"pid": p, "name": names[p], "poll_peak_bytes": peak_each[p], "hwm_bytes": hwm[p],
                       "rss_file_at_max_rss_bytes": file_at_max[p], "max_rss_file_bytes": max_file[p]} for p in sorted(hwm)],
        "stdout": out,
    }))


if __name__ == "__main__":
    sys.exit(main())
