"""train_gpt --init-from reads what HF's save_pretrained writes for GPT-2 (names under
"transformer.", the tied head absent): a GPT2LMHeadModel of train_gpt's tiny shape, saved by
transformers, loaded by train_gpt on 2 ranks with --steps 0 and exported again: every tensor of
the export equals HF's, bit for bit, read back by the safetensors package (the independent
reader). A file whose names fit neither way is refused naming the tensor."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel

from models import gpt2_config

BUILD = Path(os.environ["HSDP_BUILD_DIR"])
MPIRUN = os.environ.get("HSDP_MPIRUN", str(Path(__file__).resolve().parents[3] / "scripts" /
                                           "mpirun-local"))


def train_gpt(*args):
    cmd = [MPIRUN, "-np", "2", str(BUILD / "examples" / "train_gpt"), "--preset", "tiny",
           "--steps", "0", "--eval-batches", "0", "--sample", "0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def main() -> int:
    torch.manual_seed(5)
    hf = GPT2LMHeadModel(gpt2_config(layers=4, d=128, heads=4, context=64))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)                                   # model.safetensors, config.json
        theirs = load_file(os.path.join(d, "model.safetensors"))
        r = train_gpt("--init-from", os.path.join(d, "model.safetensors"),
                      "--export", os.path.join(d, "out.safetensors"))
        if r.returncode != 0:
            print(f"FAIL: train_gpt exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            return 1
        ours = load_file(os.path.join(d, "out.safetensors"))
        # The model's parameters (buffers such as the attention mask left out; the tied head
        # is named once, as transformer.wte.weight), by train_gpt's names.
        params = {n for n, _ in hf.named_parameters()}
        want = {k[len("transformer."):]: v for k, v in theirs.items()
                if k in params and k.startswith("transformer.")}
        bad = sorted(set(want) ^ set(ours))
        bad += [k for k in want if k in ours and not torch.equal(ours[k], want[k])]
        print(f"{len(ours)} tensors exported, {len(want)} in HF's file; differing: {bad[:5]}")
        # A file of other names: strict loading names the first parameter it lacks.
        save_file({"model.wte.weight": theirs["transformer.wte.weight"]},
                  os.path.join(d, "other.safetensors"))
        r2 = train_gpt("--init-from", os.path.join(d, "other.safetensors"))
        refused = r2.returncode == 2 and "no tensor 'wte.weight'" in r2.stdout + r2.stderr
        print("other names:", "refused" if refused else f"exit {r2.returncode}: {r2.stderr[-500:]}")
    ok = not bad and refused
    print(f"{1 if ok else 0} passed, {0 if ok else 1} failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
