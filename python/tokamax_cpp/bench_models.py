"""A transformers model, stock and patched by tokamax_cpp.transformers, timed side by side.

    python -m tokamax_cpp.bench_models --model qwen3_moe --layers 2
    python -m tokamax_cpp.bench_models --model olmoe --layers 2 --decode-batch 1,8 --prefill 512

The model has the architecture's real dimensions (hidden size, experts, expert width, heads,
vocabulary) with few layers and random weights (nothing is downloaded), in bf16. The stock model
runs transformers' default CPU settings (``sdpa`` attention and its default experts backend,
``grouped_mm``) and torch's default thread settings. The patched model shares its weights (and
holds the experts' packed copy). Steps, each timed as a forward pass:

* decode: one new token for each of ``--decode-batch`` sequences, after a 32-token prompt in the
  KV cache (the cache is cropped back after each step, so every step sees the same length);
* prefill: ``--prefill`` tokens of one sequence, no cache.

The rounds are interleaved: in each round, every (step, model) pair is timed once, in a fresh
random order, with a --gap-ms idle before each sample so that no library's worker threads are still
spinning from the previous one. Reported: the median ms per step and the per-round ratio
stock / patched (median, with the [min, max] range). Above 1, patched is faster.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
from typing import Callable, Sequence

import torch

# Real dimensions: hidden, layers kept, heads, kv heads, head dim, experts, top-k, expert width,
# vocabulary.
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=2048, num_attention_heads=32,
                                         num_key_value_heads=4, head_dim=128, num_experts=128,
                                         num_experts_per_tok=8, moe_intermediate_size=768,
                                         intermediate_size=6144, vocab_size=151936)),
    "olmoe": ("OlmoeConfig", dict(hidden_size=2048, num_attention_heads=16,
                                  num_key_value_heads=16, num_experts=64, num_experts_per_tok=8,
                                  intermediate_size=1024, vocab_size=50304)),
    "mixtral": ("MixtralConfig", dict(hidden_size=4096, num_attention_heads=32,
                                      num_key_value_heads=8, num_local_experts=8,
                                      num_experts_per_tok=2, intermediate_size=14336,
                                      vocab_size=32000)),
    # The architecture at toy size (the tests).
    "tiny_qwen3_moe": ("Qwen3MoeConfig", dict(hidden_size=64, num_attention_heads=4,
                                              num_key_value_heads=2, head_dim=16, num_experts=8,
                                              num_experts_per_tok=2, moe_intermediate_size=32,
                                              intermediate_size=96, vocab_size=256)),
}


def build(name: str, layers: int):
    import transformers

    cls, dims = MODELS[name]
    cfg = getattr(transformers, cls)(**dims, num_hidden_layers=layers,
                                     max_position_embeddings=4096)
    torch.manual_seed(0)
    stock = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in stock.parameters():
            p.normal_(std=p.shape[-1] ** -0.5 if p.dim() > 1 else 0.02)
            if p.dim() == 1:
                p.add_(1.0)  # norm weights near 1
    patched = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).to(torch.bfloat16)
    patched.load_state_dict(stock.state_dict(), assign=True)  # the same tensors
    return stock.eval(), patched.eval()


def steps(model, batches: Sequence[int], prefill: Sequence[int], generate: int = 0,
          prompt: int = 32) -> dict[str, Callable[[], None]]:
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    out: dict[str, Callable[[], None]] = {}
    for b in batches:
        ids = torch.randint(0, vocab, (b, prompt), generator=gen)
        nxt = torch.randint(0, vocab, (b, 1), generator=gen)
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(ids, past_key_values=cache, use_cache=True)

        def decode(cache=cache, nxt=nxt):
            with torch.no_grad():
                model(nxt, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # back to the prompt

        out[f"decode batch {b}"] = decode
    for n in prefill:
        ids = torch.randint(0, vocab, (1, n), generator=gen)

        def run(ids=ids):
            with torch.no_grad():
                model(ids, use_cache=False)

        out[f"prefill {n}"] = run
    if generate > 0:
        ids = torch.randint(0, vocab, (1, prompt), generator=gen)

        def gen_tokens(ids=ids):
            with torch.no_grad():
                model.generate(ids, max_new_tokens=generate, min_new_tokens=generate,
                               do_sample=False)

        out[f"generate {generate} tokens"] = gen_tokens
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokamax_cpp.bench_models",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="qwen3_moe")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--decode-batch", default="1,8", help="comma-separated (default 1,8)")
    ap.add_argument("--prefill", default="512", help="comma-separated tokens (default 512; "
                    "empty: none)")
    ap.add_argument("--generate", type=int, default=0,
                    help="also time model.generate of this many tokens after a 32-token prompt "
                    "(greedy), reported in tokens/s too")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap-ms", type=float, default=100.0)
    ap.add_argument("--no-pack", action="store_true", help="the experts read in place")
    ap.add_argument("--linear", action="store_true",
                    help="also patch nn.Linear at decode (apply_tokamax(linear=True))")
    ap.add_argument("--no-attention", action="store_true",
                    help="keep transformers' attention (apply_tokamax(attention=False))")
    ap.add_argument("--json", dest="json_path")
    a = ap.parse_args(argv)
    if a.layers < 1 or a.rounds < 1 or a.gap_ms < 0:
        ap.error("--layers and --rounds must be >= 1, --gap-ms >= 0")
    batches = [int(x) for x in a.decode_batch.split(",") if x]
    prefill = [int(x) for x in a.prefill.split(",") if x]
    from tokamax_cpp.transformers import apply_tokamax

    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    log(f"bench_models: {a.model}, {a.layers} layers, bf16; torch threads "
        f"{torch.get_num_threads()}")
    stock, patched = build(a.model, a.layers)
    apply_tokamax(patched, attention=not a.no_attention, pack_experts=not a.no_pack,
                  linear=a.linear)
    if a.generate < 0:
        ap.error("--generate must be >= 0")
    runs = {"stock": steps(stock, batches, prefill, a.generate),
            "tokamax": steps(patched, batches, prefill, a.generate)}
    names = list(runs["stock"])
    for fns in runs.values():  # warm-up
        for fn in fns.values():
            fn()
    samples = {(m, n): [] for m in runs for n in names}
    rng = random.Random(0)
    for _ in range(a.rounds):
        order = [(m, n) for m in runs for n in names]
        rng.shuffle(order)
        for m, n in order:
            time.sleep(a.gap_ms / 1e3)
            t0 = time.perf_counter()
            runs[m][n]()
            samples[(m, n)].append((time.perf_counter() - t0) * 1e3)
    rows = []
    print("| step | stock ms | tokamax ms | speedup [range] |")
    print("|---|---:|---:|---|")
    for n in names:
        s, t = samples[("stock", n)], samples[("tokamax", n)]
        ratios = [x / y for x, y in zip(s, t)]
        row = {"step": n, "stock_ms": statistics.median(s), "tokamax_ms": statistics.median(t),
               "speedup": statistics.median(ratios), "range": [min(ratios), max(ratios)],
               "stock_samples": s, "tokamax_samples": t}
        tokens = a.generate if n.startswith("generate") else 0
        if tokens:
            row["stock_tokens_per_s"] = tokens / (row["stock_ms"] / 1e3)
            row["tokamax_tokens_per_s"] = tokens / (row["tokamax_ms"] / 1e3)
        rows.append(row)
        rate = (f" ({row['stock_tokens_per_s']:.1f} -> {row['tokamax_tokens_per_s']:.1f} "
                "tokens/s)" if tokens else "")
        print(f"| {n}{rate} | {row['stock_ms']:.1f} | {row['tokamax_ms']:.1f} | "
              f"{row['speedup']:.2f} [{min(ratios):.2f}, {max(ratios):.2f}] |")
    if a.json_path:
        import transformers

        meta = {"model": a.model, "layers": a.layers, "rounds": a.rounds,
                "torch": torch.__version__, "transformers": transformers.__version__,
                "torch_threads": torch.get_num_threads(), "packed": not a.no_pack,
                "linear": a.linear, "attention": not a.no_attention}
        with open(a.json_path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
