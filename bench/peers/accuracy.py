#!/usr/bin/env python3
"""Accuracy of each weight format on the trained default model, moeserve's and llama.cpp's.

The held-out text of tiny-py (assets/models/tiny-py/train_log.json: its held-out files, in
order) scored by
  moeserve   `moeserve perplexity --text FILES --max-windows 200` per --expert-dtype /
             --projection-dtype / --lm-head-dtype configuration: nats/token and the change from
             the checkpoint's FP8;
  llama.cpp  `llama-perplexity -c 512 --chunks 200` on the files concatenated: the exact F32
             export (tools/export_gguf.py) as the KL-divergence base, then Q8_0 and Q4_K_M made
             from it by llama-quantize: ln(PPL(Q)/PPL(F32)), mean KL divergence, same top token;
  ik_llama.cpp (with --ik-bin) the same files through its own llama-perplexity, its own F32 run
             as its base.
llama.cpp scores the second half of each 512-token chunk, so its absolute perplexity is not
comparable to moeserve's; each format's change against its own exact weights is. Not in CI.
Prints one JSON object (docs/quantization.md).

Usage: python3 bench/peers/accuracy.py [--model build/models/tiny-py] [--work build/peers]
       [--windows 200] [--threads 2] [--ik-bin DIR]
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MOESERVE = os.path.join(ROOT, "build", "moeserve")
CONFIGS = {"fp8": [], "int8_experts": ["--expert-dtype", "int8"],
           "int4_experts": ["--expert-dtype", "int4"],
           "int4_experts_int8_rest": ["--expert-dtype", "int4", "--gemm-int8", "--lm-head-int8"],
           "int4_all": ["--projection-dtype", "int4", "--lm-head-dtype", "int4"]}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, errors="replace")


def heldout_files(model):
    corpus = json.load(open(os.path.join(ROOT, "assets", "models",
                                         os.path.basename(os.path.normpath(model)),
                                         "train_log.json")))["corpus"]
    files = [os.path.join(corpus["dir"], f) for f in corpus["heldout_file_list"]]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        sys.exit(f"accuracy.py: held-out files missing (Debian's python3.11 tree): {missing[:3]}")
    return files


def llama_perplexity(llama_bin, gguf, text, args, base_kld, make_base, no_repack=True):
    cmd = [os.path.join(llama_bin, "llama-perplexity"), "-m", gguf, "-f", text, "-c", "512",
           "--chunks", str(args.windows), "-t", str(args.threads), "--kl-divergence-base",
           base_kld]
    if not make_base:
        cmd += ["--kl-divergence"]
    if not make_base and no_repack:
        # llama.cpp's defaults abort on the quantized files of this MoE on an AMX Xeon
        # (docs/peers.md); without repacking it runs its AVX-512 kernels, the same arithmetic.
        cmd += ["--no-repack"]
    out = run(cmd)
    text_out = out.stdout + out.stderr
    if make_base:
        m = re.search(r"Final estimate: PPL = ([\d.]+)", text_out)
        return {"ppl": float(m.group(1))}
    def grab(pattern):
        m = re.search(pattern, text_out)
        if not m:
            sys.exit(f"accuracy.py: no '{pattern}' in llama-perplexity's output for {gguf}")
        return m.groups()
    dln, dln_err = grab(r"Mean\s+ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s*([-\d.]+)\s*±\s*([\d.]+)")
    (kld,) = grab(r"Mean\s+KLD:\s*([-\d.]+)")
    (same,) = grab(r"Same top p:\s*([\d.]+)")
    return {"dln_ppl": float(dln), "dln_ppl_err": float(dln_err), "mean_kld": float(kld),
            "same_top_pct": float(same)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "build", "models", "tiny-py"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "peers"))
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ik-bin", help="a built ik_llama.cpp bin directory (build_ik_llama_cpp.sh)")
    args = ap.parse_args()
    for name in ("model", "work", "ik_bin"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    # ik_llama.cpp's tools write llama.log into the working directory: keep it in the work folder.
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)
    files = heldout_files(args.model)
    result = {"model": args.model, "windows": args.windows, "moeserve": {}, "llama_cpp": {}}
    if args.ik_bin:
        result["ik_llama_cpp"] = {}

    for name, flags in CONFIGS.items():
        out = run([MOESERVE, "perplexity", "--model", args.model, "--text", *files,
                   "--max-windows", str(args.windows), "--window", "512", "--json",
                   "--threads", str(args.threads), *flags]).stdout
        r = json.loads(out.strip().splitlines()[-1])
        result["moeserve"][name] = {"nats_per_token": r["nats_per_token"],
                                    "ppl": r["perplexity"], "predictions": r["tokens"]}
        log(name, json.dumps(result["moeserve"][name]))
    base = result["moeserve"]["fp8"]["nats_per_token"]
    for r in result["moeserve"].values():
        r["delta_vs_fp8"] = round(r["nats_per_token"] - base, 6)

    llama_bin = run(["bash", os.path.join(ROOT, "bench", "peers", "build_llama_cpp.sh"),
                     args.work]).stdout.strip()
    stem = os.path.join(args.work, os.path.basename(os.path.normpath(args.model)))
    f32 = stem + "-F32.gguf"
    if not os.path.exists(f32):
        run(["python3", os.path.join(ROOT, "tools", "export_gguf.py"), args.model, f32])
    text = os.path.join(args.work, "heldout.txt")
    with open(text, "w", encoding="utf-8") as out:
        for f in files:
            out.write(open(f, encoding="utf-8").read())
    kld = stem + "-F32.kld"
    result["llama_cpp"]["F32"] = llama_perplexity(llama_bin, f32, text, args, kld, True)
    for q in ("Q8_0", "Q4_K_M"):
        qf = f"{stem}-{q}.gguf"
        if not os.path.exists(qf):
            run([os.path.join(llama_bin, "llama-quantize"), f32, qf, q])
        result["llama_cpp"][q] = llama_perplexity(llama_bin, qf, text, args, kld, False)
        log(q, json.dumps(result["llama_cpp"][q]))
    if args.ik_bin:  # the same files, ik_llama.cpp's own F32 logits as its base
        ik_kld = stem + "-F32.ik.kld"
        try:
            result["ik_llama_cpp"]["F32"] = llama_perplexity(args.ik_bin, f32, text, args, ik_kld,
                                                             True)
            for q in ("Q8_0", "Q4_K_M"):
                result["ik_llama_cpp"][q] = llama_perplexity(
                    args.ik_bin, f"{stem}-{q}.gguf", text, args, ik_kld, False, no_repack=False)
                log("ik", q, json.dumps(result["ik_llama_cpp"][q]))
        except subprocess.CalledProcessError as e:
            # It refuses MLA widths other than DeepSeek's 512 + 64 (tiny-py's are 128 + 16):
            # "Detected incompatible DeepSeek model without a known way to fix it".
            why = [l for l in (e.stdout + e.stderr).splitlines() if l.strip()]
            refused = [l for l in why if "incompatible" in l or "error" in l.lower()]
            result["ik_llama_cpp"] = {"failed": (refused or why or ["?"])[0][:300]}
            log("ik_llama.cpp:", result["ik_llama_cpp"]["failed"])
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
