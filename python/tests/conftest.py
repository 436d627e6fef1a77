"""Fixtures of the hsdp Python tests: the build tree's tools (the CLI side of every comparison),
mpirun, and checkpoints saved by train_gpt on 1, 3 and 2 x 4 ranks with their --export
safetensors (read back by the safetensors package, the independent side).

HSDP_BUILD_DIR names the build tree (default: <repo>/build); HSDP_MPIRUN the launcher (default:
<repo>/scripts/mpirun-local). ctest -L python sets both.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("HSDP_BUILD_DIR", REPO / "build"))
MPIRUN = os.environ.get("HSDP_MPIRUN", str(REPO / "scripts" / "mpirun-local"))


def tool(name: str) -> str:
    p = BUILD / "tools" / name
    if not p.exists():
        pytest.fail(f"{p} is missing: build the project first (scripts/setup)")
    return str(p)


def run_json(cmd, ok_codes=(0,)):
    """Runs a CLI with --json and returns its parsed output."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode in ok_codes, f"{cmd}: exit {r.returncode}\n{r.stderr}"
    return json.loads(r.stdout)


def train_gpt(np_: int, save_dir: Path, export: Path, extra=(), env=None, steps=2):
    cmd = [MPIRUN, "-np", str(np_)]
    e = dict(os.environ)
    if env:
        e.update(env)
        for k in env:
            cmd += ["-x", k]
    cmd += [str(BUILD / "examples" / "train_gpt"), "--preset", "tiny", "--steps", str(steps),
            "--eval-batches", "0", "--save-dir", str(save_dir), "--export", str(export),
            *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=e)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


# name -> (ranks, extra train_gpt flags, environment): a world of one, an odd world (3 ranks on
# one node, the batch of 12 split unevenly into shards of uneven units), and 2 nodes x 4 ranks
# hybrid-sharded (intra 2 x inter 2, two replicas).
LAYOUTS = {
    "np1": (1, ["--batch", "4"], None),
    "np3": (3, ["--batch", "12"], None),
    "2x4": (8, ["--batch", "16", "--intra-shard", "2", "--inter-shard", "2"],
            {"HSDP_RANKS_PER_NODE": "4"}),
}


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """{layout: (checkpoint root, exported .safetensors)} saved by train_gpt."""
    out = {}
    for name, (np_, extra, env) in LAYOUTS.items():
        d = tmp_path_factory.mktemp(f"ckpt-{name}")
        train_gpt(np_, d / "ckpt", d / "model.safetensors", extra, env)
        out[name] = (d / "ckpt", d / "model.safetensors")
    return out
