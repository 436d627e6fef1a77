"""hsdp.topology: what hsdp-topo prints, as Python objects.

    t = hsdp.topology.discover(intra_shard=2)          # this machine
    t = hsdp.topology.from_files(hwloc_xml="dgx.xml", nvml="dgx.nvml.json", intra_shard=4)
    t.mesh      # {"world", "nodes", "ranks_per_node", "intra_shard", "inter_shard", ...}
    t.to_dict() # hsdp-topo --json's object

No MPI is started: recorded hosts get simulated ranks (one per GPU, or ranks_per_host), as
`hsdp-topo --input ...` gives them. For the gathered view of a running job, run hsdp-topo under
mpirun.
"""

import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _hsdp
from ._errors import InvalidArgumentError

__all__ = ["Topology", "discover", "from_files"]


class Topology:
    """Hosts, ranks (with their GPU, rail and CPU binding), the node level and the mesh."""

    def __init__(self, report: Dict[str, Any]):
        self._report = report

    @property
    def hosts(self) -> List[Dict[str, Any]]:
        """Per host: packages, cores, NUMA nodes, GPUs with their links, NICs."""
        return self._report.get("hosts", [])

    @property
    def level(self) -> str:
        """What a node is: "nvlink-domain", "host" or "virtual"."""
        return self._report["level"]

    @property
    def nodes(self) -> List[str]:
        """The node names, in node order (the node map)."""
        return self._report["nodes"]

    @property
    def ranks_per_node(self) -> int:
        return self._report["ranks_per_node"]

    @property
    def ranks(self) -> List[Dict[str, Any]]:
        """Per world rank: host, local rank, GPU, rail (NIC), fabric and binding."""
        return self._report["ranks"]

    @property
    def mesh(self) -> Optional[Dict[str, int]]:
        """The mesh for the factors asked for; None when they do not fit (see mesh_error)."""
        return self._report.get("mesh")

    @property
    def mesh_error(self) -> Optional[str]:
        return self._report.get("mesh_error")

    def to_dict(self) -> Dict[str, Any]:
        """hsdp-topo --json's object."""
        return dict(self._report)

    def __repr__(self) -> str:
        m = self.mesh
        mesh = (f"{m['world']} ranks = {m['nodes']} nodes x {m['ranks_per_node']}, "
                f"intra_shard {m['intra_shard']} x inter_shard {m['inter_shard']}, "
                f"replicas {m['replicas']}" if m else f"no mesh: {repr(str(self.mesh_error))[1:-1]}")
        return f"<hsdp.topology.Topology {self.level}: {mesh}>"


def _list(v: Union[None, str, Sequence[str]], what: str) -> List[str]:
    if v is None:
        return []
    if isinstance(v, (str, bytes, os.PathLike)):
        return [_fspath(v)]
    try:
        return [_fspath(x) for x in v]
    except TypeError:
        raise InvalidArgumentError(f"{what}: expected a path or a list of paths, not {v!r}") from None


def _fspath(v) -> str:
    p = os.fspath(v)
    return p.decode() if isinstance(p, bytes) else p


def _report(hwloc_xml, nvml, nccl_xml, ranks_per_host, intra_shard, inter_shard, bind) -> Topology:
    return Topology(_hsdp._topology_report(
        _list(hwloc_xml, "hwloc_xml"), _list(nvml, "nvml"), _list(nccl_xml, "nccl_xml"),
        ranks_per_host or 0, intra_shard or 0, inter_shard or 0, bind or ""))


def discover(*, intra_shard: Optional[int] = None, inter_shard: Optional[int] = None,
             ranks_per_host: Optional[int] = None, bind: Optional[str] = None) -> Topology:
    """This machine as hsdp-topo sees it (or the files HSDP_TOPO_FILE & co. name).

    Args:
        intra_shard: shard factor inside a node (default: all ranks of a node).
        inter_shard: shard factor across nodes (default 1).
        ranks_per_host: simulated ranks (default: one per GPU, 1 on a CPU-only host).
        bind: "auto" | "none" | "numa" | "core" (default: HSDP_BIND, else auto).
    """
    return _report(None, None, None, ranks_per_host, intra_shard, inter_shard, bind)


def from_files(hwloc_xml: Union[str, Sequence[str]], *, nvml: Union[None, str, Sequence[str]] = None,
               nccl_xml: Union[None, str, Sequence[str]] = None,
               intra_shard: Optional[int] = None, inter_shard: Optional[int] = None,
               ranks_per_host: Optional[int] = None, bind: Optional[str] = None) -> Topology:
    """Recorded hosts (hwloc v2 XML; with NVML snapshots and NCCL topology XML, one per host) as
    one simulated cluster, as `hsdp-topo --input A.xml --nvml A.nvml.json ...` shows it."""
    return _report(hwloc_xml, nvml, nccl_xml, ranks_per_host, intra_shard, inter_shard, bind)
