"""A digest of a few frontiers, to check that a change leaves the search's results alone.

    .venv/bin/python scripts/frontier_digest.py --out /tmp/digest_before.json
    .venv/bin/python scripts/frontier_digest.py --out /tmp/digest_after.json --compare /tmp/digest_before.json

Per case, every frontier plan and every reference plan: summary, mesh, time, peak memory,
end-of-forward memory and each operator's configuration (in order, pipeline stages
included). ``--compare`` lists the cases whose plans differ, plan by plan: configurations
and labels must be equal, numbers equal to ``--rtol`` (default 1e-9: a sum taken in another
order may differ in its last bits). Exit status 1 when something differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensoropt  # noqa: E402

NUMBERS = ("time_s", "peak_memory_bytes", "memory_bytes")


def tiny_llama():
    """A two-layer ``LlamaForCausalLM`` on meta tensors with keyword inputs (the conformance
    suite's Llama, ``tests/third_party/families.py``)."""
    import torch
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attention_dropout=0.0)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    ids = torch.zeros(4, 8, dtype=torch.long, device="meta")
    return model, {"input_ids": ids, "labels": ids}


def cases() -> dict:
    """name -> zero-argument function returning a Frontier."""
    def llama():
        model, inputs = tiny_llama()
        return tensoropt.frontier(model, "cpu:2", inputs=inputs, progress=False)

    return {
        "gpt-tiny@cpu:4": lambda: tensoropt.frontier("gpt-tiny", "cpu:4", progress=False),
        "mlp-tiny@cpu:2": lambda: tensoropt.frontier("mlp-tiny", "cpu:2", progress=False),
        "bert-tiny@cpu:4": lambda: tensoropt.frontier("bert-tiny", "cpu:4", progress=False),
        "gpt2@8xA100-80GB/2d": lambda: tensoropt.frontier("gpt2", "8xA100-80GB", max_mesh_dims=2, progress=False),
        "llama-hf@cpu:2": llama,
    }


def plan_digest(p) -> dict:
    return {"label": p.label, "summary": p.summary, "mesh": p.mesh,
            "time_s": p.time_s, "peak_memory_bytes": p.peak_memory_bytes, "memory_bytes": p.memory_bytes,
            "configs": [[o.name, o.config] for o in p.ops]}


def digest(f) -> dict:
    return {"plans": [plan_digest(p) for p in f.plans],
            "reference": {k: plan_digest(p) for k, p in sorted(f.reference.items())}}


def differences(old: dict, new: dict, rtol: float) -> list[str]:
    """What differs between two case digests, one line per plan."""
    out = []

    def one(where: str, a: dict, b: dict) -> None:
        for key in ("label", "summary", "mesh", "configs"):
            if a[key] != b[key]:
                out.append(f"{where}: {key} differs ({a['summary']} -> {b['summary']})")
                return
        for key in NUMBERS:
            x, y = a[key], b[key]
            if abs(x - y) > rtol * max(abs(x), abs(y)):
                out.append(f"{where} ({a['summary']}): {key} {x!r} -> {y!r} ({(y - x) / x:+.3e})")

    if len(old["plans"]) != len(new["plans"]):
        out.append(f"{len(old['plans'])} plans -> {len(new['plans'])}")
    for i, (a, b) in enumerate(zip(old["plans"], new["plans"])):
        one(f"plan {i}", a, b)
    for name in sorted(set(old["reference"]) | set(new["reference"])):
        if name not in old["reference"] or name not in new["reference"]:
            out.append(f"reference {name!r} only on one side")
        else:
            one(f"reference {name!r}", old["reference"][name], new["reference"][name])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where to write the digest (JSON)")
    ap.add_argument("--compare", help="an earlier digest to compare with")
    ap.add_argument("--rtol", type=float, default=1e-9)
    ap.add_argument("--only", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    todo = cases()
    if args.only:
        todo = {k: v for k, v in todo.items() if k in args.only.split(",")}
    result = {}
    for name, run in todo.items():
        start = time.monotonic()
        result[name] = digest(run())
        print(f"{name}: {len(result[name]['plans'])} plans, {time.monotonic() - start:.1f} s", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    if not args.compare:
        return 0
    before = json.loads(Path(args.compare).read_text())
    bad = 0
    for name in result:
        if name not in before:
            print(f"{name}: not in {args.compare}")
            continue
        diff = differences(before[name], result[name], args.rtol)
        print(f"{name}: {'same' if not diff else f'{len(diff)} differences'}")
        for line in diff:
            print("   ", line)
        bad += bool(diff)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
