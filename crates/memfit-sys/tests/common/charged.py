# The memory a process is charged for, as the guard counts it (RssAnon + RssShmem + VmSwap), read by
# the process itself: the tests' independent truth for the peaks memfit records.
import json, sys, time
def charged():
    f = {}
    for line in open('/proc/self/status'):
        k, _, v = line.partition(':')
        if k in ('RssAnon', 'RssShmem', 'VmSwap'):
            f[k] = int(v.split()[0]) * 1024
    return sum(f.values())
