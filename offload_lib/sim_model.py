"""The simulator's cost model as data: every parameter's default comes from the simulator
itself (``dpa-sim model``); this module adds where each number comes from, reads YAML
overrides, and gives the closed form the mechanics test checks the simulator against.

Confidence: S = from a cited public source, D = derived from S values, E = an estimate
(an assumption until calibrated on a BlueField-3). docs/simulation.md prints this table.
"""
from __future__ import annotations

import difflib
import json
import subprocess
from pathlib import Path
from typing import Any

from offload_lib.errors import InvalidArgument

SIM_BINARY = Path(__file__).resolve().parent / "dpa-sim"

# name -> (confidence, source or derivation)
SOURCES: dict[str, tuple[str, str]] = {
    "link_gbps": ("S", "ConnectX-7 / BlueField-3: NDR 400 Gb/s per port [CX7]"),
    "link_mtu": ("S", "InfiniBand's largest MTU; config.py's mtu default"),
    "link_hdr_bytes": ("S", "IBTA packet headers: LRH 8 + BTH 12 + ICRC 4 + VCRC 2 [IBTA]"),
    "link_reth_bytes": ("S", "IBTA RETH, once per RDMA WRITE message [IBTA]"),
    "link_cable_ns": ("D", "~4.9 ns/m in fibre x 5 m"),
    "switch_latency_ns": ("S", "Quantum-2 port-to-port, published 150-330 ns [Q2]; 300 chosen"),
    "nic_tx_ns": ("D", "half of ConnectX's 'sub-600 ns' end-to-end latency [CX6]"),
    "nic_rx_ns": ("D", "half of ConnectX's 'sub-600 ns' end-to-end latency [CX6]"),
    "nic_msg_rate_m": ("S", "ConnectX-6: 215 million messages/s [CX6] (ConnectX-7 is faster)"),
    "nic_wqe_ns": ("E", "WQE fetch from DPA memory and scheduling"),
    "nic_cqe_ns": ("E", "CQE write into DPA memory"),
    "nic_atomic_ns": ("E", "responder's atomic execution"),
    "nic_ack_bytes": ("S", "IBTA ACK: LRH+BTH+AETH+ICRC+VCRC [IBTA]"),
    "nic_sq_depth": ("S", "OFFLOAD_FLEXIO_MAX_OUTSTANDING default (flexio_backend.c)"),
    "pcie_gbps": ("D", "PCIe Gen5 x16 [BF3]: 32 GT/s x 16 x 128/130 less TLP overhead ~ 56 GB/s"),
    "pcie_rtt_ns": ("S", "host DMA read latency 0.5-1 us [PCIe18]"),
    "pcie_oneway_ns": ("D", "pcie_rtt_ns / 2 (posted writes)"),
    "dpa_pass_ns": ("E", "an empty progress pass: poll, resend check, intake trylock, op loop"),
    "dpa_post_ns": ("E", "~75 instructions at ~3.2 ns: WQE segments, doorbell record, MMIO"),
    "dpa_cqe_ns": ("E", "~50 instructions per completion polled and routed"),
    "dpa_check_ns": ("E", "~30 instructions per control-word check"),
    "dpa_win_ns": ("E", "a window pointer already read this pass"),
    "dpa_ring_ns": ("S", "the ring is host memory: the first touch of a pass is a PCIe read [PCIe18]"),
    "dpa_aux_ns": ("S", "command arguments are host memory: a PCIe read [PCIe18]"),
    "dpa_mcast_chunk_ps": ("D", "one DPA thread receives 11.9 GiB/s [Khal24]: 4096 B / 11.9 GiB/s"),
    "dpa_wake_ns": ("E", "CQ event -> execution unit -> handler entry"),
    "dpa_notify_ns": ("E", "a zero-length CQE to a sibling thread"),
    "dpa_clock_ns": ("E", "reading the thread clock"),
    "dpa_idle_passes": ("S", "DPA_FLEXIO_IDLE_PASSES_BUSY (dpa_hal_flexio.c)"),
    "host_post_ns": ("E", "64-byte command stores, release, doorbell MMIO"),
    "host_notice_ns": ("E", "a host thread polling the completion ring"),
    "mcast_rq_depth": ("S", "config.py mcast_rq_depth default"),
    "mcast_event_every": ("S", "the emulator's CQ moderation (emu_internal.h)"),
    "fault_retry_ns": ("E", "RC transport retries exhausted"),
    "fault_detect_ns": ("E", "a host notices a dead peer"),
    "topo_hosts_per_leaf": ("-", "0: one switch; k: a two-level fat tree with k ranks per leaf"),
    "topo_uplinks": ("S", "spines; Quantum-2 fat tree: 32 down / 32 up per leaf is non-blocking [Q2]"),
    "spin_react_event": ("-", "1: a spinning thread reacts at the event, 0: at its next pass boundary"),
    "jitter_ns": ("-", "latency jitter per message (queue-pair order kept)"),
}

# The profile of the mechanics check: per-pass scanning costs off, so that what is left is
# the latency chain of one paced step plus per-message costs (docs/simulation.md).
MECHANICS = {"spin_react_event": 1, "dpa_check_ns": 0, "dpa_win_ns": 0, "dpa_ring_ns": 0,
             "dpa_clock_ns": 0, "dpa_aux_ns": 0}


def binary() -> Path:
    if not SIM_BINARY.exists():
        raise InvalidArgument(f"the simulator is not built ({SIM_BINARY} is missing): "
                              "rebuild the package, e.g. 'pip install -e .'")
    return SIM_BINARY


def defaults() -> dict[str, int]:
    """Every parameter's default, as the simulator has it."""
    out = subprocess.run([str(binary()), "model"], capture_output=True, text=True, check=True)
    return {k: int(v["default"]) for k, v in json.loads(out.stdout).items()}


def units() -> dict[str, str]:
    out = subprocess.run([str(binary()), "model"], capture_output=True, text=True, check=True)
    return {k: v["unit"] for k, v in json.loads(out.stdout).items()}


def load_overrides(path: str | None, known: dict[str, int]) -> dict[str, int]:
    """A YAML file of ``name: value`` (names as ``dpa-offload sim model`` prints them)."""
    if not path:
        return {}
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise InvalidArgument(f"--model {path}: {e.strerror}") from e
    if not isinstance(data, dict):
        raise InvalidArgument(f"--model {path}: want a mapping of parameter: value")
    out = {}
    for key, value in data.items():
        if key not in known:
            hint = difflib.get_close_matches(str(key), list(known), n=1)
            raise InvalidArgument(f"--model {path}: unknown parameter {key!r}" +
                                  (f" (did you mean {hint[0]!r}?)" if hint else "") +
                                  "; 'dpa-offload sim model' lists them")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgument(f"--model {path}: {key} wants a non-negative integer, got {value!r}")
        out[key] = value
    return out


def _wire_ns(m: dict[str, int], nbytes: int) -> float:
    pkts = max(1, -(-nbytes // m["link_mtu"]))
    wire = nbytes + pkts * m["link_hdr_bytes"] + m["link_reth_bytes"]
    return max(wire * 8 / m["link_gbps"], 1000 / m["nic_msg_rate_m"])


def pairwise_closed_form_s(m: dict[str, int], n: int, block: int) -> float:
    """Predicted time of the paced pairwise all-to-all (one DPA thread, a2a_window 1, chunk
    >= block, one switch): (n-1) steps of latency + block / bandwidth plus per-message costs.

    One step: the write's completion wakes the spinning thread; its pass polls it, posts
    the done signal and the next write; the write is fetched over PCIe, serialised, crosses
    the fabric (L1), lands (PCIe write) and is acknowledged (L1 back). Each peer also costs
    four control words (its signature and its ready: a body and a seq write each), posted
    and polled by the thread. Start: the doorbell, the parked thread's wake, the signature
    round; end: the last done signal and the host's notice."""
    l1 = m["nic_tx_ns"] + 2 * m["link_cable_ns"] + m["switch_latency_ns"] + m["nic_rx_ns"]
    fetch = m["dpa_post_ns"] + m["nic_wqe_ns"] + m["pcie_rtt_ns"]
    step = (m["dpa_pass_ns"] + m["dpa_cqe_ns"] + m["dpa_post_ns"] + fetch + _wire_ns(m, block) +
            2 * l1 + m["pcie_oneway_ns"] + _wire_ns(m, m["nic_ack_bytes"]) + m["nic_cqe_ns"])
    ctrl = 4 * (m["dpa_post_ns"] + m["dpa_cqe_ns"])
    start = (m["host_post_ns"] + m["pcie_oneway_ns"] + m["dpa_wake_ns"] + m["dpa_pass_ns"] + fetch +
             _wire_ns(m, 32) + l1 + m["pcie_oneway_ns"])
    self_block = (m["dpa_pass_ns"] + fetch + m["pcie_oneway_ns"] + block * 8 / m["pcie_gbps"] +
                  m["nic_cqe_ns"] + m["dpa_cqe_ns"])
    end = (m["dpa_pass_ns"] + fetch + _wire_ns(m, 8) + l1 + m["pcie_oneway_ns"] +
           m["dpa_pass_ns"] + m["pcie_oneway_ns"] + m["host_notice_ns"])
    return (start + self_block + (n - 1) * step + n * ctrl + end) / 1e9


def ring_allgather_closed_form_s(m: dict[str, int], n: int, block: int) -> float:
    """A ring all-gather of `block` bytes per rank on the same model (the firmware has none:
    this is the comparison the multicast all-gather is judged against). n-1 steps; in each
    a rank writes the block it holds to its successor and signals it, and the successor's
    pass that sees the signal forwards the block. The signal follows the write on the same
    queue pair without waiting for it (in order), so a step is one pass, two posts, one
    WQE fetch, the block's and the signal's wire time, the fabric and the landing: an
    optimistic ring (no contention, no completion polling). Every rank injects
    (n-1) x block, against multicast's one."""
    l1 = m["nic_tx_ns"] + 2 * m["link_cable_ns"] + m["switch_latency_ns"] + m["nic_rx_ns"]
    step = (m["dpa_pass_ns"] + m["dpa_check_ns"] + 2 * m["dpa_post_ns"] + m["nic_wqe_ns"] +
            m["pcie_rtt_ns"] + _wire_ns(m, block) + _wire_ns(m, 8) + l1 + m["pcie_oneway_ns"])
    start = m["host_post_ns"] + m["pcie_oneway_ns"] + m["dpa_wake_ns"] + m["dpa_pass_ns"]
    end = m["dpa_pass_ns"] + m["pcie_oneway_ns"] + m["host_notice_ns"]
    return (start + (n - 1) * step + end) / 1e9


def markdown_table(values: dict[str, int] | None = None) -> str:
    values = values or defaults()
    unit = units()
    lines = ["| Parameter | Value | Unit | Conf. | Source or derivation |", "|---|---|---|---|---|"]
    for name, v in values.items():
        conf, src = SOURCES.get(name, ("?", "?"))
        lines.append(f"| `{name}` | {v} | {unit.get(name, '')} | {conf} | {src} |")
    return "\n".join(lines)
