"""hsdp.plan against hsdp-plan --json: the same numbers for the same configuration."""

import pytest

import hsdp
from conftest import REPO, run_json, tool

UNITS_FILE = str(REPO / "docs" / "units-gpt2-small.txt")

# (keyword arguments, the same configuration as hsdp-plan flags)
CASES = [
    (dict(params=7.5e9, nodes=2, gpus_per_node=8, intra_shard=8, inter_shard=1, mode="zero3"),
     ["--params", "7.5e9", "--nodes", "2", "--gpus-per-node", "8", "--intra-shard", "8",
      "--inter-shard", "1", "--mode", "zero3"]),
    (dict(params="1.3e9", units=7, nodes=4, gpus_per_node=8, intra_shard=8, inter_shard=2,
          mode="zero3", hpz=True, param_dtype="bf16", offload="cpu"),
     ["--params", "1.3e9", "--units", "7", "--nodes", "4", "--gpus-per-node", "8",
      "--intra-shard", "8", "--inter-shard", "2", "--mode", "zero3", "--hpz", "--offload", "cpu"]),
    (dict(layers=UNITS_FILE, nodes=3, gpus_per_node=4, intra_shard=2, mode="zero2",
          param_dtype="fp32", mem_budget="2GiB"),
     ["--layers", UNITS_FILE, "--nodes", "3", "--gpus-per-node", "4", "--intra-shard", "2",
      "--mode", "zero2", "--param-dtype", "fp32", "--mem-budget", "2GiB"]),
    (dict(params=1_000_000_007, nodes=4, gpus_per_node=8, inter_shard=4, param_dtype="fp32",
          inter_param_wire="int8", inter_grad_wire="int4", replica_wire="bf16", quant_block=512),
     ["--params", "1000000007", "--nodes", "4", "--gpus-per-node", "8", "--inter-shard", "4",
      "--param-dtype", "fp32", "--inter-param-wire", "int8", "--inter-grad-wire", "int4",
      "--replica-wire", "bf16", "--quant-block", "512"]),
    (dict(params=125e6, nodes=1, gpus_per_node=3, mode="none"),
     ["--params", "125e6", "--nodes", "1", "--gpus-per-node", "3", "--mode", "none"]),
]


@pytest.mark.parametrize("kwargs,flags", CASES)
def test_plan_equals_cli_json(kwargs, flags):
    cli = run_json([tool("hsdp-plan"), *flags, "--json"])
    p = hsdp.plan(**kwargs)
    assert p.to_dict() == cli
    # The attributes are the same numbers.
    assert p.per_gpu_bytes == cli["per_gpu_bytes"]
    assert p.cross_node_bytes_per_step == cli["cross_node_bytes_per_step"]
    assert (p.intra_shard, p.inter_shard, p.replicas, p.world) == (
        cli["intra_shard"], cli["inter_shard"], cli["replicas"], cli["world"])
    assert p.label == cli["label"]
    assert sum(p.units) == cli["total_params"]
    if "mem_budget" in kwargs:
        assert p.fits == cli["fits"]
    else:
        assert p.fits is None


def test_auto_equals_cli_json():
    cli = run_json([tool("hsdp-plan"), "--params", "7.5e9", "--units", "32", "--nodes", "2",
                    "--gpus-per-node", "8", "--auto", "--mem-budget", "40G", "--json"])
    a = hsdp.plan(params=7.5e9, units=32, nodes=2, gpus_per_node=8, auto=True, mem_budget="40G")
    assert a.to_dict() == cli
    assert a.considered == cli["considered"]
    assert [f.label for f in a.fits] == [f["label"] for f in cli["fits"]]
    # The auto-chosen factors: the first that fits.
    assert (a.best.intra_shard, a.best.inter_shard, a.best.mode) == (
        cli["fits"][0]["intra_shard"], cli["fits"][0]["inter_shard"], cli["fits"][0]["mode"])


def test_auto_nothing_fits():
    cli = run_json([tool("hsdp-plan"), "--params", "7.5e9", "--nodes", "1", "--gpus-per-node",
                    "2", "--auto", "--mem-budget", "1G", "--json"], ok_codes=(1,))
    a = hsdp.plan(params=7.5e9, nodes=1, gpus_per_node=2, auto=True, mem_budget="1G")
    assert a.to_dict() == cli and a.fits == [] and a.best is None


@pytest.mark.parametrize("kwargs,needle", [
    (dict(params=1e9, layers=UNITS_FILE, nodes=1, gpus_per_node=8), "exactly one of"),
    (dict(nodes=1, gpus_per_node=8), "exactly one of"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, intra_shard=3), "3"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, mode="zero4"), "zero4"),
    (dict(params=-5, nodes=2, gpus_per_node=8), "-5"),
    (dict(params="lots", nodes=2, gpus_per_node=8), "lots"),
    (dict(params=1e9, nodes=0, gpus_per_node=8), "nodes 0"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, param_dtype="fp8"), "fp8"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, inter_param_wire="int3"), "int3"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, auto=True), "mem_budget"),
    (dict(params=1e9, nodes=2, gpus_per_node=8, mem_budget="80 parsecs"), "80 parsecs"),
])
def test_bad_input_is_a_value_error_naming_it(kwargs, needle):
    with pytest.raises(hsdp.InvalidArgumentError) as e:
        hsdp.plan(**kwargs)
    assert isinstance(e.value, ValueError) and isinstance(e.value, hsdp.Error)
    assert needle in str(e.value)


def test_missing_layers_file_is_not_found():
    with pytest.raises(hsdp.NotFoundError, match="/nonexistent/units.txt"):
        hsdp.plan(layers="/nonexistent/units.txt", nodes=2, gpus_per_node=8)


def test_help_reads_well():
    doc = hsdp.plan.__doc__
    assert "hsdp-plan" in doc and "intra_shard" in doc and "mem_budget" in doc
