#!/usr/bin/env python3
"""moeserve against llama.cpp on the same model and the same cores (docs/peers.md).

The model (default: the `bench` preset, made if missing) is exported by tools/export_gguf.py to
an exact F32 GGUF; llama.cpp's own llama-quantize makes Q8_0 and Q4_K_M from it. Each bit width
pairs a llama.cpp file with moeserve options of about the same bits per weight:

  8: Q8_0 (8.5 bits)     vs  --gemm-int8 --lm-head-int8           (8.25: INT8 per 1x128)
     Q8_0                vs  --lm-head-int8                       (FP8 weights, 8-bit lm_head)
  4: Q4_K_M (~4.9 bits)  vs  --projection-dtype int4 --lm-head-dtype int4
                                                                  (4.5: INT4 per 1x128)

For each, in ROUNDS alternated rounds (DRAM bandwidth and the VM's share of the cores drift by
the minute: only ratios from one run mean anything), both engines with --threads:
  decode    batch-1 tokens/s: llama-bench -p 0 -n 64  |  moeserve-bench e2e --decode-tokens 64
  prefill   512-token prompt tokens/s: llama-bench -p 512 -n 0  |  moeserve generate --max-tokens 1
  prefill8k the same with 8192 tokens (--skip-8k leaves it out)
  serve32   output tokens/s of 32 streams, bench/load/loadgen.py against llama-server
            (--parallel 32, continuous batching) and moeserve serve
  serve1    the same with one stream
  rss       peak RSS (kB) of a batch-1 run: llama-bench -p 0 -n 16 -r 1  |  moeserve generate
  load_*    TTFT and TPOT p50 / p99 (ms) under Poisson arrivals (loadgen --request-rate) at
            --load-rate, or from round 2 on at 0.7 of the slowest engine's serve32 capacity
            (32 output tokens a request) measured in round 1
Medians over rounds; ratios are moeserve / llama.cpp (rss_ratio: moeserve's RSS over
llama.cpp's, lower is better). Prints progress on stderr and one JSON object on stdout.

--check first compares the engines on the exact F32 file (llama-server's top-5 probabilities of
20 greedy tokens against moeserve's reference path with an F32 KV cache): conversion_ok when the
log-probabilities agree within 0.01 nats up to the first different token and that difference is
a tie (moeserve's logprobs of the two tokens within 0.01 nats).

ik_llama.cpp (ikawrakow's fork: IQK CPU kernels, MLA variants, fused MoE) runs beside them when
given --ik-git (a git mirror for build_ik_llama_cpp.sh, which builds its pinned commit) or
--ik-bin (a directory with its llama-bench, llama-server and llama-quantize): its own
llama-quantize makes the same two types from the same F32 file, and it runs with its defaults
(-mla 3, -fa 1, -fmoe 1) plus its run-time repacking into its interleaved CPU layouts (-rtr 1:
its best CPU option; repacking is what llama.cpp's defaults do too). Its figures appear as
"ik_llama_cpp" beside each row, with `<figure>_vs_best`: moeserve over the better of the two
llama.cpps (above 1: moeserve faster; for rss, below 1: moeserve smaller).

vLLM's CPU backend runs beside them when given --vllm-venv (a venv made by install_vllm_cpu.sh):
its OpenAI server on a BF16 copy of the model (dequant_bf16.py; on CPUs without AMX vLLM refuses
DeepSeek's FP8 checkpoints), once per round, with figures from bench/load/loadgen.py through its
API: decode = 1000 / TPOT p50 of one stream (32 tokens out), prefill = 512 / TTFT p50 of one
stream with 512-token prompts, serve32 and serve1 as for the others, rss = the peak RSS of its
processes (its API server and engine core). It appears as "vllm" in every row (its BF16 is
neither width; its figures sit beside both).

Usage: python3 bench/peers/run.py [--model DIR] [--rounds 2] [--widths 8,4] [--check]
       [--threads 2] [--work build/peers] [--skip-serve] [--ik-git DIR | --ik-bin DIR]
       [--vllm-venv DIR]
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MOESERVE = os.path.join(ROOT, "build", "moeserve")
MOESERVE_BENCH = os.path.join(ROOT, "build", "moeserve-bench")

CONFIGS = {  # width -> [(name, llama.cpp type, moeserve flags)]
    "8": [("q8_0_vs_int8", "Q8_0", ["--gemm-int8", "--lm-head-int8"]),
          ("q8_0_vs_fp8", "Q8_0", ["--lm-head-int8"])],
    "4": [("q4_k_m_vs_int4", "Q4_K_M", ["--projection-dtype", "int4", "--lm-head-dtype",
                                        "int4"])],
}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    # llama.cpp's tools print pieces of tokens, not always whole UTF-8 sequences.
    return subprocess.run(cmd, check=True, capture_output=True, text=True, errors="replace", **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peak_rss_kb(cmd):
    """Peak RSS of a command, from wait4's rusage."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[0]} failed with status {status}")
    return ru.ru_maxrss


# ---- files ----

def quantize(bin_dir, f32, out, qtype, threads, engine):
    """`out` made by the engine's own llama-quantize, unless it is there already."""
    if os.path.exists(out):
        return
    log(f"{engine} llama-quantize {qtype}")
    run([os.path.join(bin_dir, "llama-quantize"), f32, out + ".tmp", qtype, str(threads)])
    os.rename(out + ".tmp", out)  # a cut-off run leaves no half file behind


def quantized_files(bin_dir, f32, widths, threads, engine, tag=""):
    """{type: file} of every type the widths pair, each made by the engine's own llama-quantize
    from the F32 file (named <stem><tag>-<type>.gguf beside it)."""
    stem = f32[:-len("-F32.gguf")]
    files = {}
    for w in widths:
        for _, qtype, _ in CONFIGS[w]:
            out = f"{stem}{tag}-{qtype}.gguf"
            quantize(bin_dir, f32, out, qtype, threads, engine)
            files[qtype] = out
    return files


def ik_binaries(args):
    """ik_llama.cpp's bin directory, or (None, why not)."""
    if args.ik_bin:
        need = ["llama-bench", "llama-server", "llama-quantize"]
        missing = [t for t in need if not os.access(os.path.join(args.ik_bin, t), os.X_OK)]
        return (None, f"--ik-bin {args.ik_bin} lacks {', '.join(missing)}") if missing \
            else (args.ik_bin, None)
    if args.ik_git:
        try:
            return run(["bash", os.path.join(ROOT, "bench", "peers", "build_ik_llama_cpp.sh"),
                        args.ik_git, args.work]).stdout.strip(), None
        except subprocess.CalledProcessError as e:
            return None, f"build_ik_llama_cpp.sh failed: {e.stderr[-500:]}"
    return None, "not asked for (--ik-git or --ik-bin)"


def prepare_files(args, llama_bin, widths):
    os.makedirs(args.work, exist_ok=True)
    if not os.path.isdir(args.model):
        log(f"making the bench preset at {args.model}")
        run([MOESERVE, "make-model", "--preset", "bench", "--out", args.model])
    stem = os.path.join(args.work, os.path.basename(os.path.normpath(args.model)))
    f32 = stem + "-F32.gguf"
    if not os.path.exists(f32):
        log(f"exporting {f32}")
        run([sys.executable, os.path.join(ROOT, "tools", "export_gguf.py"), args.model,
             f32 + ".tmp"] + (["--tokenizer", args.tokenizer] if args.tokenizer else []))
        os.rename(f32 + ".tmp", f32)
    return {"F32": f32} | quantized_files(llama_bin, f32, widths, args.threads, "llama.cpp")


# ---- llama.cpp ----

# llama.cpp's defaults put weights in its extra buffer types (AMX tiles, repacked layouts) where
# the CPU has them; at 0c1e570 that aborts on DeepSeek's MoE on an AMX Xeon
# (GGML_ASSERT(*cur_backend_id != -1) in ggml_backend_sched_split_graph). Each file is tried with
# the defaults first; only where they abort does it run with repacking off (docs/peers.md).
NO_REPACK = {}  # gguf path -> True when the defaults abort


def llama_flags(llama_bin, gguf, tool):
    if gguf not in NO_REPACK:
        probe = subprocess.run([os.path.join(llama_bin, "llama-bench"), "-m", gguf, "-p", "8",
                                "-n", "4", "-r", "1"], capture_output=True)
        NO_REPACK[gguf] = probe.returncode != 0
        if NO_REPACK[gguf]:
            log(f"llama.cpp aborts on {os.path.basename(gguf)} with its defaults: --repack 0")
    if not NO_REPACK[gguf]:
        return []
    return ["--repack", "0"] if tool == "llama-bench" else ["--no-repack"]


class Server:
    """A server process on a free loopback port, killed at exit."""

    def __init__(self, cmd, port, log_path, env=None, start_s=600):
        self.port = port
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)
        deadline = time.time() + start_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited; see {log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.5)
        raise RuntimeError(f"{cmd[0]} did not come up; see {log_path}")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


SERVE_API = "chat"  # --serve-api: loadgen's endpoint for every engine


def loadgen_json(url, streams, seed, prompt_len, output_len, requests, extra=()):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "load", "loadgen.py"), "--url", url,
           "-c", str(streams), "-r", str(requests), "--prompt-len", prompt_len,
           "--output-len", output_len, "--seed", str(seed), "--api", SERVE_API, "--json", *extra]
    j = json.loads(run(cmd).stdout)
    if j.get("errors"):
        raise RuntimeError(f"loadgen against {url}: {j.get('first_errors')}")
    return j


def tree_peak_rss_kb(pid):
    """The sum of VmHWM over a process and its descendants (read while they run)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return total


def vllm_round(args, venv, bf16_dir, seed, load_rate=None):
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="4",
               VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}")
    s = Server([os.path.join(venv, "bin", "python"), "-m", "vllm.entrypoints.openai.api_server",
                "--model", bf16_dir, "--dtype", "bfloat16", "--max-model-len", "10240",
                "--max-num-seqs", "32", "--host", "127.0.0.1", "--port", str(port)],
               port, os.path.join(args.work, "vllm-server.log"), env=env, start_s=1800)
    try:
        pre = loadgen_json(s.url, 1, seed, "512,512", "2,2", 3)
        dec = loadgen_json(s.url, 1, seed, "64,128", "32,32", 3)
        r = {"decode": 1000.0 / dec["tpot_ms"]["p50"],
             "prefill": 512 * 1000.0 / pre["ttft_ms"]["p50"], "serve1": float(dec["output_tok_s"])}
        if not args.skip_8k:  # (loadgen's prompts are about a token a word: the exact count)
            j = loadgen_json(s.url, 1, seed, "8192,8192", "2,2", 1)
            r["prefill8k"] = j["input_tokens"] / j["requests"] * 1000.0 / j["ttft_ms"]["p50"]
        if not args.skip_serve:
            r["serve32"] = loadgen(s.url, 32, seed)
            if load_rate:
                r.update(load_figures(s.url, seed, load_rate))
        r["rss"] = tree_peak_rss_kb(s.proc.pid)
        return r
    finally:
        s.close()


def vllm_model(args, venv):
    """The BF16 copy vLLM serves (made once, in the work directory)."""
    out = os.path.join(args.work, os.path.basename(os.path.normpath(args.model)) + "-bf16")
    if not os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        log(f"dequantizing {args.model} to {out} for vLLM")
        run([os.path.join(venv, "bin", "python"),
             os.path.join(ROOT, "bench", "peers", "dequant_bf16.py"), args.model, out])
    return out


def loadgen(url, streams, seed):
    j = loadgen_json(url, streams, seed, "64,128", "32,32", 1 if streams > 1 else 3)
    return float(j["output_tok_s"])


LOAD_REQUESTS = 48  # requests of a Poisson load run (prompts 64-128, 32 tokens out)


def load_figures(url, seed, rate):
    """TTFT and TPOT p50 / p99 (ms) under Poisson arrivals of `rate` requests per second."""
    j = loadgen_json(url, 1, seed, "64,128", "32,32", 1,
                     ["--request-rate", str(rate), "--num-requests", str(LOAD_REQUESTS)])
    return {"load_ttft_p50": j["ttft_ms"]["p50"], "load_ttft_p99": j["ttft_ms"]["p99"],
            "load_tpot_p50": j["tpot_ms"]["p50"], "load_tpot_p99": j["tpot_ms"]["p99"]}


def serve_figures(cmd, port, log_path, seed, load_rate=None):
    s = Server(cmd, port, log_path)
    try:
        r = {"serve32": loadgen(s.url, 32, seed), "serve1": loadgen(s.url, 1, seed)}
        if load_rate:
            r.update(load_figures(s.url, seed, load_rate))
        return r
    finally:
        s.close()


# ---- one round ----

def llama_round(args, llama_bin, gguf, seed, ik=False, load_rate=None):
    """One round of llama.cpp's figures, or ik_llama.cpp's (its run-time repacking on)."""
    if ik:
        bench_flags, server_flags, name = ["-rtr", "1"], ["-rtr"], "ik-llama-server"
    else:
        bench_flags = llama_flags(llama_bin, gguf, "llama-bench")
        server_flags, name = llama_flags(llama_bin, gguf, "llama-server"), "llama-server"

    def bench(p, n):
        out = run([os.path.join(llama_bin, "llama-bench"), "-m", gguf, "-t", str(args.threads),
                   "-p", str(p), "-n", str(n), "-r", "2", "-o", "json", *bench_flags]).stdout
        return float(json.loads(out)[0]["avg_ts"])

    r = {"decode": bench(0, 64), "prefill": bench(512, 0),
         **({} if args.skip_8k else {"prefill8k": bench(8192, 0)}),
         "rss": peak_rss_kb([os.path.join(llama_bin, "llama-bench"), "-m", gguf, "-t",
                             str(args.threads), "-p", "0", "-n", "16", "-r", "1", *bench_flags])}
    if not args.skip_serve:
        port = free_port()
        try:
            r.update(serve_figures([os.path.join(llama_bin, "llama-server"), "-m", gguf, "-t",
                                    str(args.threads), "--parallel", "32", "-c", str(32 * 256),
                                    "--host", "127.0.0.1", "--port", str(port), *server_flags],
                                   port, os.path.join(args.work, name + ".log"), seed,
                                   load_rate))
        except (RuntimeError, subprocess.CalledProcessError) as e:
            # Reported, not dropped: ik_llama.cpp's server aborts on some outputs of the random
            # preset ("Failed to parse input at pos 0", its chat parser; docs/peers.md).
            r["serve_error"] = f"{name}: {str(e)[-300:]} (see {name}.log)"
            log(r["serve_error"])
    return r


def moeserve_round(args, flags, seed, load_rate=None):
    # The prefill attention form (docs/kernels-mla.md): generate and serve take it, the decode
    # bench has no prefill.
    cache = ["--weight-cache", args.weight_cache, "--attention", args.moeserve_attention]
    common = ["--model", args.model, "--threads", str(args.threads)]
    e2e = json.loads(run([MOESERVE_BENCH, "e2e", "--model", args.model, "--decode-tokens", "64",
                          "--threads", str(args.threads), "--json"] + flags).stdout)
    prompt = ",".join(str((t * 37 + 11) % 5000 + 3) for t in range(512))
    err = run([MOESERVE, "generate", *common, "--prompt-ids", prompt, "--max-tokens", "1",
               *cache, *flags]).stderr
    gen_s = float(re.findall(r" tokens in ([0-9.]+) s", err)[-1])
    r = {"decode": float(e2e["tokens_per_s"]), "prefill": 512 / gen_s,
         "rss": peak_rss_kb([MOESERVE, "generate", *common, "--prompt-ids", "1,2,3",
                             "--max-tokens", "16", *cache, *flags])}
    if not args.skip_8k:
        long = ",".join(str((t * 37 + 11) % 5000 + 3) for t in range(8192))
        err = run([MOESERVE, "generate", *common, "--prompt-ids", long, "--max-tokens", "1",
                   *cache, *flags]).stderr
        r["prefill8k"] = 8192 / float(re.findall(r" tokens in ([0-9.]+) s", err)[-1])
    if not args.skip_serve:
        port = free_port()
        r.update(serve_figures([MOESERVE, "serve", *common, "--port", str(port),
                                "--max-num-seqs", "32", *cache, *flags],
                               port, os.path.join(args.work, "moeserve-serve.log"), seed,
                               load_rate))
    return r


# ---- the conversion check ----

def check_conversion(args, llama_bin, f32):
    prompt = [0] + [(t * 97 + 13) % 5000 + 3 for t in range(15)]
    out = run([MOESERVE, "generate", "--model", args.model, "--compute", "reference",
               "--kv-cache-dtype", "f32", "--prompt-ids", ",".join(map(str, prompt)),
               "--max-tokens", "20", "--logprobs", "5", "--ignore-eos", "--json",
               "--threads", str(args.threads)]).stdout
    ours = json.loads(out.strip().splitlines()[0])
    port = free_port()
    s = Server([os.path.join(llama_bin, "llama-server"), "-m", f32, "-t", str(args.threads),
                "-c", "256", "-ctk", "f32", "-ctv", "f32", "--host", "127.0.0.1", "--port",
                str(port), *llama_flags(llama_bin, f32, "llama-server")], port,
               os.path.join(args.work, "llama-server-check.log"))
    try:
        body = json.dumps({"prompt": prompt, "n_predict": 20, "n_probs": 5, "temperature": 0,
                           "ignore_eos": True, "cache_prompt": False}).encode()
        req = urllib.request.Request(f"{s.url}/completion", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            theirs = json.loads(r.read())
    finally:
        s.close()
    steps = theirs["completion_probabilities"]
    their_tokens = [st["id"] for st in steps]
    # Compare up to the first different token (after it the two continuations differ). On the
    # random-weight presets a step's top two are often within a few thousandths of a nat, where
    # the engines' F32 rounding (~1e-3 nats apart, docs/peers.md) may pick either: such a
    # difference is a tie, anything else a conversion error.
    same = 0
    while same < min(len(ours["tokens"]), len(their_tokens)) and \
            ours["tokens"][same] == their_tokens[same]:
        same += 1
    max_delta, compared = 0.0, 0
    for ours_top, st in list(zip(ours["top_logprobs"], steps))[:same + 1]:
        mine = {t["id"]: t["logprob"] for t in ours_top}
        for t in st["top_logprobs"]:
            if t["id"] in mine:
                max_delta = max(max_delta, abs(mine[t["id"]] - t["logprob"]))
                compared += 1
    result = {"tokens_equal": ours["tokens"] == their_tokens, "steps_equal": same,
              "moeserve_tokens": ours["tokens"], "llama_cpp_tokens": their_tokens,
              "top5_logprobs_compared": compared, "max_abs_logprob_delta": round(max_delta, 7)}
    ok = max_delta < 0.01
    if same < len(ours["tokens"]):
        mine = {t["id"]: t["logprob"] for t in ours["top_logprobs"][same]}
        theirs_tok = their_tokens[same] if same < len(their_tokens) else None
        gap = mine[ours["tokens"][same]] - mine[theirs_tok] if theirs_tok in mine else None
        result["first_difference_gap"] = None if gap is None else round(gap, 7)
        ok = ok and gap is not None and gap < 0.01
    result["conversion_ok"] = ok
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="/tmp/benchmodel")
    ap.add_argument("--tokenizer", help="tokenizer.json directory when the model lacks one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--widths", default="8,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "peers"))
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--skip-8k", action="store_true", help="no 8k-token prefill figure")
    ap.add_argument("--moeserve-attention", choices=["absorbed", "mha-prefill"],
                    default="absorbed", help="moeserve's --attention for its prefill and serving")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--ik-git", help="git mirror of ik_llama.cpp (build_ik_llama_cpp.sh builds it)")
    ap.add_argument("--ik-bin", help="a built ik_llama.cpp bin directory instead")
    ap.add_argument("--vllm-venv", help="a venv with vLLM's CPU backend (install_vllm_cpu.sh)")
    ap.add_argument("--load-rate", type=float,
                    help="Poisson requests/s for the latency figures (default: after round 1, "
                         "0.7 of the slowest engine's serve32 capacity)")
    ap.add_argument("--serve-api", choices=["chat", "completions"], default="chat",
                    help="the serving figures' endpoint for every engine: chat completions, or "
                         "completions with the same text (ik_llama.cpp's server aborts in its "
                         "chat output parser on the random preset's text: docs/peers.md)")
    args = ap.parse_args()
    global SERVE_API
    SERVE_API = args.serve_api
    for name in ("work", "model", "tokenizer", "ik_git", "ik_bin", "vllm_venv"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    # ik_llama.cpp's tools write llama.log into the working directory: keep it in the work folder.
    os.makedirs(args.work, exist_ok=True)
    os.chdir(args.work)
    widths = [w for w in args.widths.split(",") if w]
    for w in widths:
        if w not in CONFIGS:
            sys.exit(f"run.py: no bit width {w} (have {', '.join(CONFIGS)})")
    llama_bin = run(["bash", os.path.join(ROOT, "bench", "peers", "build_llama_cpp.sh"),
                     args.work]).stdout.strip()
    files = prepare_files(args, llama_bin, widths)
    ik_bin, ik_why = ik_binaries(args)
    ik = (quantized_files(ik_bin, files["F32"], widths, args.threads, "ik_llama.cpp", "-ik")
          if ik_bin else None)
    result = {"model": args.model, "threads": args.threads, "rounds": args.rounds,
              "serve_api": args.serve_api,
              "ik_llama_cpp": {"bin": ik_bin} if ik_bin else {"skipped": ik_why}}
    vllm_dir, vllm_rounds = None, []
    if args.vllm_venv:
        try:
            vllm_dir = vllm_model(args, args.vllm_venv)
        except (subprocess.CalledProcessError, OSError) as e:
            result["vllm"] = {"skipped": f"the BF16 copy failed: {e}"}
    else:
        result["vllm"] = {"skipped": "not asked for (--vllm-venv)"}
    result["llama_cpp_no_repack"] = NO_REPACK  # filled in as the files are first run
    result["moeserve_attention"] = args.moeserve_attention
    if args.check:
        result["conversion_check"] = check_conversion(args, llama_bin, files["F32"])
        log("conversion check:", json.dumps(result["conversion_check"]))
    with tempfile.TemporaryDirectory() as cache:
        args.weight_cache = cache
        for w in widths:  # fill the weight cache (not timed)
            for _, _, flags in CONFIGS[w]:
                run([MOESERVE, "generate", "--model", args.model, "--prompt-ids", "1",
                     "--max-tokens", "1", "--weight-cache", cache,
                     "--attention", args.moeserve_attention, *flags])
        rows = {}
        load_rate = args.load_rate
        for r in range(args.rounds):
            if vllm_dir:  # one BF16 run per round, beside every width
                try:
                    vllm_rounds.append(vllm_round(args, args.vllm_venv, vllm_dir, 100 + r,
                                                  load_rate))
                    log(f"round {r + 1} vllm: {json.dumps(vllm_rounds[-1])}")
                except (RuntimeError, subprocess.CalledProcessError, KeyError, TypeError) as e:
                    result["vllm"] = {"skipped": f"it failed: {e} (see vllm-server.log)"}
                    vllm_dir = None
            for w in widths:
                for name, qtype, flags in CONFIGS[w]:
                    ll = llama_round(args, llama_bin, files[qtype], 100 + r, load_rate=load_rate)
                    ms = moeserve_round(args, flags, 100 + r, load_rate)
                    ikr = llama_round(args, ik_bin, ik[qtype], 100 + r, True, load_rate) \
                        if ik else None
                    log(f"round {r + 1} {name}: llama.cpp {json.dumps(ll)} moeserve "
                        f"{json.dumps(ms)} ik_llama.cpp {json.dumps(ikr)}")
                    rows.setdefault(name, []).append((ll, ms, ikr))
            if load_rate is None and not args.skip_serve:
                # 70% of the slowest engine's capacity (32 output tokens a request), from this
                # round's serve32: the later rounds measure latency under that offered load.
                caps = [e["serve32"] for pairs in rows.values() for e in pairs[-1]
                        if e and "serve32" in e]
                caps += [v["serve32"] for v in vllm_rounds if "serve32" in v]
                load_rate = round(0.7 * min(caps) / 32, 3)
                result["load_rate_per_s"] = load_rate
                log(f"the latency rounds offer {load_rate} requests/s")
    for name, pairs in rows.items():
        fig = {}
        engines = (("llama_cpp", 0), ("moeserve", 1)) + ((("ik_llama_cpp", 2),) if ik else ())
        for engine, i in engines:
            keys = dict.fromkeys(k for p in pairs for k in p[i])  # (load figures: later rounds)
            fig[engine] = {k: round(statistics.median(p[i][k] for p in pairs if k in p[i]), 2)
                           for k in keys if k != "serve_error"}
            errors = [p[i]["serve_error"] for p in pairs if "serve_error" in p[i]]
            if errors:
                fig[engine]["serve_error"] = errors[0]
        lower_better = ("rss", "load_ttft_p50", "load_ttft_p99", "load_tpot_p50", "load_tpot_p99")
        for k in ("decode", "prefill", "prefill8k", "serve32", "serve1", "rss", *lower_better[1:]):
            if k not in fig["llama_cpp"] or k not in fig["moeserve"]:
                continue
            fig[f"{k}_ratio"] = round(fig["moeserve"][k] / fig["llama_cpp"][k], 3)
            if ik and k in fig["ik_llama_cpp"]:
                # the best peer at these bits: the faster (for RSS and latency, the smaller)
                peers = [fig["llama_cpp"][k], fig["ik_llama_cpp"][k]]
                best = min(peers) if k in lower_better else max(peers)
                fig[f"{k}_vs_best"] = round(fig["moeserve"][k] / best, 3)
        result[name] = fig
    if vllm_rounds:
        keys = dict.fromkeys(k for v in vllm_rounds for k in v)
        result["vllm"] = {"bf16": {k: round(statistics.median(v[k] for v in vllm_rounds if k in v),
                                            2) for k in keys}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
