#!/usr/bin/env python3
"""Reference for src/eplb: DeepSeek's EPLB algorithm (github.com/deepseek-ai/EPLB, eplb.py),
re-implemented here in PyTorch from a reading of that file, so that torch's own CPU sort and
argmax decide every tie exactly as they do in the original.

Uses:
  eplb_reference_check.py --readme
      prints the plan for the README example of the EPLB repository (and checks it).
  eplb_reference_check.py --write-fixtures tests/data/eplb
      writes the JSON fixtures that tests/eplb/rebalance_test.cpp compares against.
  eplb_reference_check.py --moeserve build/moeserve --cases 200
      runs `moeserve eplb --json` on random cases and compares with this reference.

Needs torch (fixture generation only; CI reads the committed fixtures and needs no torch).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch


def balanced_packing(weight, num_packs):
    """weight [rows, n] -> (pack [rows, n], rank_in_pack [rows, n]); each pack gets n/num_packs
    items. Items go heaviest first (torch.sort descending) to the lightest pack that still has
    room; ties between packs go to the lowest pack index (Python's min)."""
    rows, n = weight.shape
    assert n % num_packs == 0
    per_pack = n // num_packs
    if per_pack == 1:
        pack = torch.arange(n, dtype=torch.int64).expand(rows, n).clone()
        return pack, torch.zeros(rows, n, dtype=torch.int64)
    order = weight.float().sort(-1, descending=True).indices
    pack = torch.full((rows, n), -1, dtype=torch.int64)
    rank = torch.full((rows, n), -1, dtype=torch.int64)
    for r in range(rows):
        load = [torch.tensor(0.0, dtype=torch.float32)] * num_packs
        count = [0] * num_packs
        for item in order[r].tolist():
            best = None
            for p in range(num_packs):
                if count[p] < per_pack and (best is None or load[p] < load[best]):
                    best = p
            pack[r, item] = best
            rank[r, item] = count[best]
            load[best] = load[best] + weight[r, item]  # float32 accumulation, as in eplb.py
            count[best] += 1
    return pack, rank


def replicate_experts(weight, num_phy):
    """weight [rows, num_log] -> (phy2log [rows, num_phy], rank [rows, num_phy], cnt [rows, num_log]).
    Slots 0..num_log-1 hold each expert once; every further slot goes to the expert with the
    largest load per replica (torch max: first index among equals)."""
    rows, num_log = weight.shape
    assert num_phy >= num_log
    phy2log = torch.arange(num_phy, dtype=torch.int64).repeat(rows, 1)
    rank = torch.zeros(rows, num_phy, dtype=torch.int64)
    cnt = torch.ones(rows, num_log, dtype=torch.int64)
    all_rows = torch.arange(rows)
    for slot in range(num_log, num_phy):
        pick = (weight / cnt).max(dim=-1).indices
        phy2log[:, slot] = pick
        rank[:, slot] = cnt[all_rows, pick]
        cnt[all_rows, pick] += 1
    return phy2log, rank, cnt


def invert(perm):
    inv = torch.empty_like(perm)
    src = torch.arange(perm.size(1), dtype=torch.int64).expand(perm.shape)
    inv.scatter_(1, perm, src)
    return inv


def hierarchical(weight, num_phy, num_groups, num_nodes, num_gpus):
    layers, num_log = weight.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    slots_per_gpu = num_phy // num_gpus
    log_per_node = num_log // num_nodes

    # 1. groups -> nodes. "mlog" numbers logical experts node by node.
    group_load = weight.unflatten(-1, (num_groups, group_size)).sum(-1)
    gpack, grank = balanced_packing(group_load, num_nodes)
    base = (gpack * groups_per_node + grank) * group_size  # [layers, groups]
    log2mlog = (base.unsqueeze(-1) + torch.arange(group_size)).flatten(-2)
    mlog2log = invert(log2mlog)

    # 2. replicate inside each node: rows are (layer, node).
    mlog_load = weight.gather(-1, mlog2log).view(-1, log_per_node)
    phy2mlog, phyrank, mlogcnt = replicate_experts(mlog_load, num_phy // num_nodes)

    # 3. replicas -> GPUs of their node.
    phy_load = (mlog_load / mlogcnt).gather(-1, phy2mlog)
    pack, rank = balanced_packing(phy_load, num_gpus // num_nodes)
    phy2pphy = pack * slots_per_gpu + rank
    pphy2phy = invert(phy2pphy)

    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    offsets = torch.arange(0, num_log, log_per_node).view(1, -1, 1)
    pphy2mlog = (pphy2mlog.view(layers, num_nodes, -1) + offsets).flatten(-2)
    pphy2log = mlog2log.gather(-1, pphy2mlog)
    pphyrank = phyrank.gather(-1, pphy2phy).view(layers, -1)
    logcnt = mlogcnt.view(layers, -1).gather(-1, log2mlog)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
    layers, num_log = weight.shape
    weight = weight.float().cpu()
    if num_groups % num_nodes == 0:
        phy2log, phyrank, logcnt = hierarchical(weight, num_replicas, num_groups, num_nodes, num_gpus)
    else:  # global policy: the hierarchical one with one group on one node
        phy2log, phyrank, logcnt = hierarchical(weight, num_replicas, 1, 1, num_gpus)
    width = int(logcnt.max().item())
    log2phy = torch.full((layers, num_log, width), -1, dtype=torch.int64)
    slots = torch.arange(num_replicas, dtype=torch.int64).expand(layers, -1)
    log2phy.view(layers, -1).scatter_(-1, phy2log * width + phyrank, slots)
    return phy2log, log2phy, logcnt


README_WEIGHT = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                 [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
README_PHY2LOG = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                  [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]


def make_case(weight, replicas, groups, nodes, gpus):
    w = torch.tensor(weight, dtype=torch.float32)
    phy2log, log2phy, logcnt = rebalance_experts(w, replicas, groups, nodes, gpus)
    return {"weight": weight, "num_replicas": replicas, "num_groups": groups,
            "num_nodes": nodes, "num_gpus": gpus,
            "policy": "hierarchical" if groups % nodes == 0 else "global",
            "phy2log": phy2log.tolist(), "log2phy": log2phy.tolist(), "logcnt": logcnt.tolist()}


def random_shape(gen, hierarchical_policy):
    """A valid (experts, replicas, groups, nodes, gpus), small enough for a fixture."""
    while True:
        nodes = [1, 2, 4][torch.randint(0, 3, (1,), generator=gen).item()]
        gpus = nodes * [1, 2, 4][torch.randint(0, 3, (1,), generator=gen).item()]
        experts = [8, 12, 16, 24, 32, 48, 64][torch.randint(0, 7, (1,), generator=gen).item()]
        divisors = [g for g in range(1, experts + 1) if experts % g == 0]
        groups = divisors[torch.randint(0, len(divisors), (1,), generator=gen).item()]
        if hierarchical_policy != (groups % nodes == 0):
            continue
        extra = torch.randint(0, 3, (1,), generator=gen).item()
        replicas = ((experts + gpus - 1) // gpus + extra) * gpus
        if replicas < experts:
            continue
        return experts, replicas, groups, nodes, gpus


def random_weight(gen, layers, experts, kind):
    if kind == "ties":  # few distinct values: tie-breaking decides the plan
        w = torch.randint(0, 4, (layers, experts), generator=gen)
        return w.tolist()
    if kind == "skewed":  # a few hot experts, integer token counts
        w = torch.randint(0, 50, (layers, experts), generator=gen)
        hot = torch.randint(0, experts, (layers, 3), generator=gen)
        w.scatter_add_(1, hot, torch.full((layers, 3), 1000, dtype=torch.int64))
        return w.tolist()
    # "fractional": float32-exact values with a fractional part (multiples of 1/8)
    w = torch.randint(0, 800, (layers, experts), generator=gen).float() / 8
    return w.tolist()


def random_cases(seed, count, hierarchical_policy, kinds):
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for i in range(count):
        experts, replicas, groups, nodes, gpus = random_shape(gen, hierarchical_policy)
        # fractional sums stay torch-exact only for groups of < 16 experts (see docs/eplb.md)
        kind = kinds[i % len(kinds)]
        if kind == "fractional" and experts // (groups if hierarchical_policy else 1) >= 16:
            kind = "ties"
        layers = 1 + torch.randint(0, 2, (1,), generator=gen).item()
        w = random_weight(gen, layers, experts, kind)
        case = make_case(w, replicas, groups, nodes, gpus)
        case["kind"] = kind
        cases.append(case)
    return cases


def big_sort_cases():
    """Cases whose sorts have more than 16 items, where torch's CPU sort is not stable."""
    gen = torch.Generator().manual_seed(7)
    cases = []
    # global policy, 40..96 replicas packed to 2..4 GPUs: sorts of 40..96 items
    for experts, replicas, gpus in [(32, 40, 2), (48, 64, 4), (64, 96, 4), (24, 48, 6)]:
        w = torch.randint(0, 3, (2, experts), generator=gen).tolist()
        cases.append(make_case(w, replicas, 5, 2, gpus))  # 5 % 2 != 0: global policy
    # hierarchical: 32 groups on 2 nodes (a sort of 32 groups), 48 replicas per node on 2 GPUs
    w = torch.randint(0, 3, (2, 64), generator=gen).tolist()
    cases.append(make_case(w, 96, 32, 2, 4))
    w = torch.randint(0, 6, (1, 64), generator=gen).tolist()
    cases.append(make_case(w, 128, 32, 1, 4))
    for c in cases:
        c["kind"] = "big_sort"
    return cases


def write_fixtures(outdir):
    os.makedirs(outdir, exist_ok=True)
    readme = make_case(README_WEIGHT, 16, 4, 2, 8)
    assert readme["phy2log"] == README_PHY2LOG, readme["phy2log"]
    files = {
        "readme.json": [readme],
        "hierarchical.json": random_cases(1, 40, True, ["ties", "skewed", "fractional"]),
        "global.json": random_cases(2, 40, False, ["ties", "skewed", "fractional"]),
        "big_sort.json": big_sort_cases(),
    }
    for name, cases in files.items():
        path = os.path.join(outdir, name)
        with open(path, "w") as f:
            f.write('{"generator": "tools/eplb_reference_check.py", "torch": "%s", "cases": [\n'
                    % torch.__version__)
            f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
            f.write("\n]}\n")
        print(f"wrote {path}: {len(cases)} cases, {os.path.getsize(path)} bytes")


def check_moeserve(binary, count):
    cases = (random_cases(100, count // 2, True, ["ties", "skewed", "fractional"]) +
             random_cases(200, count - count // 2, False, ["ties", "skewed", "fractional"]))
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(cases):
            path = os.path.join(tmp, "loads.json")
            with open(path, "w") as f:
                json.dump(c["weight"], f)
            cmd = [binary, "eplb", "--loads", path, "--replicas", str(c["num_replicas"]),
                   "--groups", str(c["num_groups"]), "--nodes", str(c["num_nodes"]),
                   "--gpus", str(c["num_gpus"]), "--json"]
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            for key in ("phy2log", "log2phy", "logcnt"):
                if out[key] != c[key]:
                    bad += 1
                    print(f"case {i}: {key} differs\n  cmd: {' '.join(cmd)}\n"
                          f"  torch:    {c[key]}\n  moeserve: {out[key]}")
                    break
    print(f"{len(cases) - bad}/{len(cases)} cases match")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--readme", action="store_true")
    ap.add_argument("--write-fixtures", metavar="DIR")
    ap.add_argument("--moeserve", metavar="BINARY")
    ap.add_argument("--cases", type=int, default=200)
    args = ap.parse_args()
    ok = True
    if args.readme:
        c = make_case(README_WEIGHT, 16, 4, 2, 8)
        print(json.dumps({k: c[k] for k in ("phy2log", "log2phy", "logcnt")}))
        ok = c["phy2log"] == README_PHY2LOG
        print("README example:", "match" if ok else "MISMATCH")
    if args.write_fixtures:
        write_fixtures(args.write_fixtures)
    if args.moeserve:
        ok = check_moeserve(args.moeserve, args.cases) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
