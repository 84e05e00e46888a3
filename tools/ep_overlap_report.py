#!/usr/bin/env python3
"""How much of the expert-parallel communication a run hid behind compute, from its Chrome
traces (`moeserve generate|serve --trace FILE` under mpirun writes FILE.rank<r>.json).

Per rank file:
  comm      wall time during which a dispatch or combine was in flight (union of the
            communication lane's dispatch*/combine* events)
  hidden    the part of `comm` during which the compute lane was busy (union of its events,
            leaving out whole-step spans): communication that did not stall the step thread
  exposed   comm - hidden: the step thread had nothing to compute while it waited
  fraction  hidden / comm
Without overlap the step thread blocks in every exchange, so hidden is ~0 by construction.

Usage: tools/ep_overlap_report.py TRACE.rank0.json [TRACE.rank1.json ...]
"""
import json
import sys


def union(intervals):
    """Sorted, merged [begin, end) intervals."""
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def length(intervals):
    return sum(e - b for b, e in intervals)


def intersect(a, b):
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def report(path):
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    comm = union((e["ts"], e["ts"] + e["dur"]) for e in events
                 if e["tid"] == 1 and e["name"].split()[0] in ("dispatch", "combine"))
    compute = union((e["ts"], e["ts"] + e["dur"]) for e in events
                    if e["tid"] == 0 and not e["name"].startswith("step"))
    busy = length(compute)
    c = length(comm)
    hidden = intersect(comm, compute)
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) if events else 0
    return {"file": path, "span_ms": span / 1e3, "compute_ms": busy / 1e3, "comm_ms": c / 1e3,
            "hidden_ms": hidden / 1e3, "exposed_ms": (c - hidden) / 1e3,
            "fraction_hidden": hidden / c if c else 0.0}


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = [report(p) for p in argv[1:]]
    print(f"{'file':40} {'span ms':>9} {'compute':>9} {'comm':>9} {'hidden':>9} {'exposed':>9} "
          f"{'hidden %':>8}")
    for r in rows:
        print(f"{r['file'][-40:]:40} {r['span_ms']:9.1f} {r['compute_ms']:9.1f} {r['comm_ms']:9.1f} "
              f"{r['hidden_ms']:9.1f} {r['exposed_ms']:9.1f} {100 * r['fraction_hidden']:7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
