"""The GPU check (devices and dtypes of the runner, the hooks and the shards).

Run on a machine with one NVIDIA GPU, < 8 minutes.

Checks, each printed as a row of one table (the script exits 1 if any check fails, 2 if no GPU):

1. ``cuda-fp32 == cpu``: the default model (``bl.load_model()``, SmolLM2-135M) collected on the GPU in
   float32 (TF32 off) equals the CPU run: next-token entropies, attention entropies (bits) and label
   log-probabilities within 1e-4 absolute; final-token value rows within 1e-4 of their largest magnitude.
2. ``bf16 entropies``: the same model in bfloat16 on the GPU against float32 on the GPU: the mean over
   prompts of |ΔH(next token)| and the largest |Δ| of a layer's mean attention entropy within 1e-2
   bits (the statistics the analyses report are means over prompts; the largest per-prompt |Δ| is
   printed alongside).
3. ``collect vs bare``: on a random-weight model shaped like Llama-3-8B (d_model 4096, 32 layers, 32
   query / 8 KV heads, d_mlp 14336, vocabulary 128256; bfloat16; built with transformers'
   ``LlamaConfig`` on the GPU, wrapped as a ``TransformerBridge``), ``collect`` with geometry's settings
   (final-token ``hook_v`` of the last layer, every layer's attention entropy) takes ≤ 1.15× the wall
   time of bare forward passes over the same padded batches and ≤ 1.1× their peak GPU memory
   (``torch.cuda.max_memory_allocated``; the peak above the weights is printed alongside).
   ``--llama-layers`` lowers the layer count if a machine is too slow (the table says so).
4. ``long prompt``: on the same 8B-shaped bf16 bridge, one prompt of ``--long-tokens`` (4,096) tokens:
   ``collect`` with geometry's settings against a bare forward of the same tokens, wall time (≤ 1.1×)
   and peak GPU memory (≤ 1.05× the bare forward's peak; the peak above the weights is printed
   alongside: what a pass of that length needs, eager attention's patterns included).
5. ``torchrun 2 ranks``: ``torchrun --nproc_per_node 2`` (gloo for the ranks' messages, both ranks'
   models on the one GPU) running ``bl.shard.collect_sharded`` on the default model gives the same
   reduced cache as one process (every array equal to 1e-6; whether bit-identical is printed).

``--cpu-dry-run`` runs the same code on the CPU with tiny shapes (the tiny random llama instead of
SmolLM2 and of the 8B shape) so the script can be smoke-tested without a GPU; its time and memory
rows are informational (no GPU figures exist in a dry run), its correctness rows are enforced.

Usage: ``python benchmarks/gpu_check.py`` (GPU) or ``python benchmarks/gpu_check.py --cpu-dry-run``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BAYES_LENS_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import bayes_lens as bl  # noqa: E402
from bayes_lens.collect import collect  # noqa: E402

PROMPTS = [
    "The capital of France is", "2 + 2 =", "Once upon a time, in a small village,",
    "The derivative of x squared is", "def fibonacci(n):", "Water boils at a temperature of",
    "The opposite of hot is", "In 1492, Columbus", "My favourite colour is", "The square root of 81 is",
    "Translate to French: cat ->", "A haiku about the sea:", "The chemical symbol for gold is",
    "Monday, Tuesday, Wednesday,", "The largest planet in the solar system is", "Roses are red, violets are",
]
ROWS = []  # (check, measured, criterion, verdict, seconds)


def row(check, measured, criterion, ok, seconds, info=False):
    verdict = "INFO" if info else ("PASS" if ok else "FAIL")
    ROWS.append((check, measured, criterion, verdict, f"{seconds:.1f}"))
    print(f"[{verdict}] {check}: {measured} ({criterion})", flush=True)


def table() -> str:
    head = ("check", "measured", "criterion", "verdict", "s")
    widths = [max(len(str(r[i])) for r in ROWS + [head]) for i in range(5)]
    line = lambda r: " | ".join(str(v).ljust(w) for v, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(head), "-+-".join("-" * w for w in widths)] + [line(r) for r in ROWS])


def max_abs(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a is not None else 0.0


def compare(a, b):
    """(largest |Δ| of the statistics, largest |Δ| of value rows / largest |value|, bit-identical) of two
    reduced caches (hook name -> [n, ...])."""
    if sorted(a) != sorted(b):
        raise ValueError(f"the reduced caches hold different hooks: {sorted(a)} vs {sorted(b)}")
    stats = max(max_abs(a.next_token_entropy_bits(), b.next_token_entropy_bits()),
                max_abs(a.attention_entropy_bits(), b.attention_entropy_bits()),
                max_abs(a.token_logprobs(), b.token_logprobs()))
    rel = max(max_abs(a.value_rows(k), b.value_rows(k)) / max(float(b.value_rows(k).abs().max()), 1e-12)
              for k in b.layers("v"))
    same = all(torch.equal(a[k], b[k]) for k in b) and torch.equal(a.n_tokens, b.n_tokens)
    return stats, rel, same


def default_model(dry: bool, device: str):
    if dry:
        from bayes_lens.models.tiny import tiny_model

        kind = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
        return tiny_model(kind).to(device)
    return bl.load_model(device=device)


def label_ids(model):
    tok = model.tokenizer
    return [tok(" yes", add_special_tokens=False)["input_ids"][-1], tok(" no", add_special_tokens=False)["input_ids"][-1]]


KW = dict(value_layers="all", attention=True, batch_size=8, progress=False)


# ----------------------------------------------------------------------------------------- checks


def check_fp32(dry, device, refs):
    t0 = time.perf_counter()
    cpu = default_model(dry, "cpu")
    ids = label_ids(cpu)
    ref = collect(cpu, PROMPTS, token_ids=ids, **KW)
    del cpu
    gpu = default_model(dry, device)
    got = collect(gpu, PROMPTS, token_ids=ids, **KW)
    refs.update(model=gpu, fp32=got, ids=ids)
    stats, rel, same = compare(got, ref)
    row(f"{device}-fp32 == cpu (default model)", f"stats |Δ| {stats:.2e}, values |Δ|/max {rel:.2e}",
        "both ≤ 1e-4", stats <= 1e-4 and rel <= 1e-4, time.perf_counter() - t0)


def check_bf16(dry, device, refs):
    t0 = time.perf_counter()
    model = refs["model"].to(torch.bfloat16)
    got = collect(model, PROMPTS, token_ids=refs["ids"], **KW)
    ref = refs["fp32"]
    g_next, r_next = got.next_token_entropy_bits(), ref.next_token_entropy_bits()
    g_attn, r_attn = got.attention_entropy_bits(), ref.attention_entropy_bits()  # [n, layers, heads]
    d_next = (g_next - r_next).abs()
    d_layer = (g_attn.mean((0, 2)) - r_attn.mean((0, 2))).abs()
    d_attn_max = (g_attn - r_attn).abs().max()
    finite = bool(torch.isfinite(g_next).all() and torch.isfinite(g_attn).all())
    ok = finite and g_attn.dtype == torch.float64 and float(d_next.mean()) <= 1e-2 \
        and float(d_layer.max()) <= 1e-2
    row("bf16 entropies vs fp32", f"next-token mean |Δ| {float(d_next.mean()):.2e} (max {float(d_next.max()):.2e}); "
        f"layer-mean attention |Δ| {float(d_layer.max()):.2e} (per head/prompt max {float(d_attn_max):.2e}) bits",
        "means ≤ 1e-2 bits, float64, finite", ok, time.perf_counter() - t0)
    refs.pop("model")
    del model


def llama_like(dry, device, n_layers):
    """A random-weight Llama-3-8B-shaped TransformerBridge (bf16) on ``device``; tiny shapes when ``dry``."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import LlamaConfig, LlamaForCausalLM

    from bayes_lens.models.tiny import tiny_tokenizer

    shape = (dict(hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=512) if dry else
             dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=n_layers, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256))
    cfg = LlamaConfig(**shape, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, attn_implementation="eager")
    torch.manual_seed(0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialize in bf16 directly: no fp32 copy of 8B weights
    try:
        with torch.device(device):
            hf = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    hf.eval()
    hf.config.name_or_path = "llama-8b-shaped-random"
    tok = tiny_tokenizer()
    model = TransformerBridge.boot_transformers("llama-8b-shaped-random", hf_model=hf, tokenizer=tok, device=device)
    model.cfg.default_prepend_bos = False
    model.eval()
    return model, shape


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def check_overhead(dry, device, n_layers, n_prompts, n_tokens, refs):
    t0 = time.perf_counter()
    model, shape = llama_like(dry, device, n_layers)
    refs["llama"] = (model, shape)  # the long-prompt check reuses it (building 8B weights takes a while)
    from bayes_lens.models.tiny import TINY_WORDS

    words = list(TINY_WORDS)
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(n_tokens * 3 // 4, n_tokens)))
               for _ in range(n_prompts)]
    bs = 8
    batches = [bl.adapter.tokenize(model, prompts[s:s + bs]) for s in range(0, len(prompts), bs)]
    cuda = device.startswith("cuda")

    def bare():
        with torch.inference_mode():
            for tokens, mask in batches:
                model(tokens, attention_mask=mask, return_type="logits")

    def ours():
        collect(model, prompts, value_layers=[-1], attention=True, batch_size=bs, progress=False)

    t_bare, m_bare, base = measure(bare, device)
    t_ours, m_ours, _ = measure(ours, device)
    what = (f"{shape['num_hidden_layers']} layers, d_model {shape['hidden_size']}, vocab {shape['vocab_size']}, "
            f"bf16, {n_prompts} prompts ≤ {n_tokens} tokens, batch {bs}")
    ratio_t = t_ours / t_bare
    row(f"collect / bare time ({what})", f"{ratio_t:.3f}x ({t_ours:.2f} s vs {t_bare:.2f} s)", "≤ 1.15x",
        ratio_t <= 1.15, time.perf_counter() - t0, info=dry)
    if cuda:
        ratio_m = m_ours / m_bare
        above = (m_ours - base) / max(m_bare - base, 1)
        row("collect / bare peak GPU memory", f"{ratio_m:.3f}x ({m_ours / 2**30:.2f} vs {m_bare / 2**30:.2f} GiB; "
            f"above the weights {above:.3f}x)", "≤ 1.1x", ratio_m <= 1.1, 0.0)
    else:
        row("collect / bare peak GPU memory", "n/a on the CPU", "≤ 1.1x (GPU only)", True, 0.0, info=True)


def measure(fn, device, rounds=2):
    """(best wall of ``rounds`` calls after a warm-up, peak GPU memory over them, memory allocated before)."""
    cuda = device.startswith("cuda")
    fn()  # warm-up
    sync(device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    best = float("inf")
    for _ in range(rounds):
        sync(device)
        s = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - s)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    return best, peak, base


def check_long(dry, device, n_layers, n_tokens, refs):
    """One ``n_tokens``-token prompt on the 8B-shaped bridge: collect (geometry's settings) vs a bare forward."""
    t0 = time.perf_counter()
    model, shape = refs.pop("llama", None) or llama_like(dry, device, n_layers)
    from bayes_lens.models.tiny import TINY_WORDS

    rng = random.Random(1)
    words = list(TINY_WORDS)
    prompt = " ".join(rng.choice(words) for _ in range(n_tokens))
    tokens, mask = bl.adapter.tokenize(model, [prompt])
    cuda = device.startswith("cuda")

    def bare():
        with torch.inference_mode():
            model(tokens, attention_mask=mask, return_type="logits")

    def ours():
        collect(model, [prompt], value_layers=[-1], attention=True, batch_size=1, progress=False)

    t_bare, m_bare, base = measure(bare, device, rounds=1 if not dry else 2)
    t_ours, m_ours, _ = measure(ours, device, rounds=1 if not dry else 2)
    what = f"{shape['num_hidden_layers']} layers, bf16, one prompt of {int(mask.sum())} tokens"
    ratio_t = t_ours / t_bare
    row(f"long prompt: collect / bare time ({what})", f"{ratio_t:.3f}x ({t_ours:.2f} s vs {t_bare:.2f} s)", "≤ 1.1x",
        ratio_t <= 1.1, time.perf_counter() - t0, info=dry)
    if cuda:
        ratio_m = m_ours / m_bare
        above = (m_ours - base) / max(m_bare - base, 1)
        row("long prompt: collect / bare peak GPU memory",
            f"{ratio_m:.3f}x ({m_ours / 2**30:.2f} vs {m_bare / 2**30:.2f} GiB; above the weights {above:.3f}x: "
            f"{(m_ours - base) / 2**30:.2f} vs {(m_bare - base) / 2**30:.2f} GiB)", "≤ 1.05x", ratio_m <= 1.05, 0.0)
    else:
        row("long prompt: collect / bare peak GPU memory", "n/a on the CPU", "≤ 1.05x (GPU only)", True, 0.0, info=True)
    del model


def check_torchrun(dry, device, refs):
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if dry:
            kind = "hooked" if bl.adapter.has_hooked_transformer() else "bridge"
            spec = ("bayes_lens.models.tiny:tiny_model", {"kind": kind})
        else:
            spec = ("default", {"device": "cuda:0"})  # both ranks on the one GPU (not remapped to cuda:LOCAL_RANK)
        job = Path(tmp) / "job.py"
        job.write_text(textwrap.dedent(f"""
            import sys
            import bayes_lens.shard as sh
            spec = sh.ModelSpec({spec[0]!r}, {spec[1]!r})
            engine = sh.TorchrunEngine(backend="gloo")  # two ranks cannot share one GPU under NCCL
            col = sh.collect_sharded(spec, {PROMPTS!r}, sys.argv[1] + "/shards", engine=engine, n_shards=2,
                                     token_ids={refs['ids']!r}, **{KW!r})
            if col is not None:
                col.save(sys.argv[1] + "/merged.safetensors")
        """))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   OMP_NUM_THREADS="1", BAYES_LENS_PROGRESS="0")
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(job), tmp], capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "Error" in ln or "error" in ln]
            print("torchrun output (tail):\n" + "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-30:]),
                  file=sys.stderr)
            row("torchrun 2 ranks == 1 process", f"torchrun failed (rc {proc.returncode}): "
                f"{(lines or ['see stderr'])[-1][:200]}", "same reduced cache", False, time.perf_counter() - t0)
            return
        got = bl.ReducedCache.load(Path(tmp) / "merged.safetensors")
        workers = sorted({json.loads(p.read_text())["worker"]["rank"] for p in (Path(tmp) / "shards").glob("shard-*.json")})
    ref = refs["fp32"]
    stats, rel, same = compare(got, ref)
    row("torchrun 2 ranks == 1 process", f"ranks {workers}; stats |Δ| {stats:.1e}, values |Δ|/max {rel:.1e}; "
        f"bit-identical: {same}", "≤ 1e-6, two ranks", stats <= 1e-6 and rel <= 1e-6 and workers == [0, 1],
        time.perf_counter() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes on the CPU (smoke test, no GPU figures)")
    ap.add_argument("--llama-layers", type=int, default=32, help="layers of the 8B-shaped model (default 32)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts for the overhead check (default 64)")
    ap.add_argument("--tokens", type=int, default=256, help="longest prompt of the overhead check (default 256)")
    ap.add_argument("--long-tokens", type=int, default=4096, help="tokens of the long-prompt check (default 4096)")
    args = ap.parse_args(argv)
    dry = args.cpu_dry_run
    if not dry and not torch.cuda.is_available():
        print("no CUDA device here; run on a GPU machine, or pass --cpu-dry-run for a smoke test.", file=sys.stderr)
        return 2
    device = "cpu" if dry else "cuda:0"
    if not dry:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the equality check
        torch.backends.cudnn.allow_tf32 = False
        print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}", flush=True)
    else:
        print("CPU dry run: tiny shapes, no GPU figures; time/memory rows are INFO only", flush=True)
    start = time.perf_counter()
    refs = {}
    for name, fn in [("fp32", lambda: check_fp32(dry, device, refs)), ("bf16", lambda: check_bf16(dry, device, refs)),
                     ("overhead", lambda: check_overhead(dry, device, args.llama_layers,
                                                         8 if dry else args.prompts, 24 if dry else args.tokens, refs)),
                     ("long prompt", lambda: check_long(dry, device, args.llama_layers,
                                                        64 if dry else args.long_tokens, refs)),
                     ("torchrun", lambda: check_torchrun(dry, device, refs))]:
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - one broken check must not hide the others
            row(name, f"error: {type(err).__name__}: {str(err)[:200]}", "runs", False, 0.0)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    total = time.perf_counter() - start
    print()
    print(table())
    failed = [r for r in ROWS if r[3] == "FAIL"]
    print(f"\ntotal {total:.0f} s (budget 480 s); " + ("all checks passed" if not failed else f"{len(failed)} FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
