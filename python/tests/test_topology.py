"""hsdp.topology against hsdp-topo --json: this machine, and recorded hosts."""

import pytest

import hsdp
from conftest import REPO, run_json, tool

FIX = REPO / "tests" / "topology" / "fixtures"


def test_discover_equals_cli():
    cli = run_json([tool("hsdp-topo"), "--json"])
    t = hsdp.topology.discover()
    assert t.to_dict() == cli
    assert t.nodes == cli["nodes"] and t.mesh == cli["mesh"] and t.level == cli["level"]


def test_discover_with_factors_equals_cli():
    cli = run_json([tool("hsdp-topo"), "--ranks-per-host", "4", "--intra-shard", "2", "--json"])
    t = hsdp.topology.discover(ranks_per_host=4, intra_shard=2)
    assert t.to_dict() == cli
    assert t.mesh["replicas"] == 2 and len(t.ranks) == 4


def test_recorded_dgx_equals_cli():
    xml, nvml, nccl = (str(FIX / f) for f in ("dgx_h100.xml", "dgx_h100.nvml.json",
                                               "dgx_h100.nccl.xml"))
    cli = run_json([tool("hsdp-topo"), "--input", xml, "--nvml", nvml, "--nccl", nccl,
                    "--intra-shard", "4", "--json"])
    t = hsdp.topology.from_files(hwloc_xml=xml, nvml=nvml, nccl_xml=nccl, intra_shard=4)
    assert t.to_dict() == cli
    assert len(t.hosts[0]["gpus"]) == 8 and t.mesh["intra_shard"] == 4


def test_recorded_cluster_of_trays_equals_cli():
    trays = [str(FIX / f"gb200_nvl72_tray{i}.xml") for i in range(3)]
    nvml = [str(FIX / f"gb200_nvl72_tray{i}.nvml.json") for i in range(3)]
    flags = []
    for x, n in zip(trays, nvml):
        flags += ["--input", x, "--nvml", n]
    cli = run_json([tool("hsdp-topo"), *flags, "--json"])
    t = hsdp.topology.from_files(hwloc_xml=trays, nvml=nvml)
    assert t.to_dict() == cli
    assert t.level == cli["level"]


def test_factors_that_do_not_fit_give_mesh_error():
    cli = run_json([tool("hsdp-topo"), "--ranks-per-host", "4", "--intra-shard", "3", "--json"],
                   ok_codes=(2,))
    t = hsdp.topology.discover(ranks_per_host=4, intra_shard=3)
    assert t.mesh is None and t.mesh_error == cli["mesh_error"] and "3" in t.mesh_error


def test_bad_files_raise_naming_them(tmp_path):
    with pytest.raises(hsdp.Error, match="nonexistent.xml"):
        hsdp.topology.from_files(hwloc_xml="/nonexistent.xml")
    bad = tmp_path / "bad.xml"
    bad.write_text("<topology><object type='Machine'")
    with pytest.raises(hsdp.InvalidArgumentError, match="bad.xml"):
        hsdp.topology.from_files(hwloc_xml=str(bad))
    with pytest.raises(hsdp.InvalidArgumentError, match="nvml"):
        hsdp.topology.from_files(hwloc_xml=[str(FIX / "dgx_h100.xml")] * 2,
                                 nvml=[str(FIX / "dgx_h100.nvml.json")])
    with pytest.raises(hsdp.InvalidArgumentError, match="sideways"):
        hsdp.topology.discover(bind="sideways")
