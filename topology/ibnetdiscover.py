"""The fabric from ``ibnetdiscover``'s topology file (InfiniBand).

The file is a list of records, one per node the subnet manager's discovery reached::

    switchguid=0x200000(200000)
    Switch  36 "S-0000000000200000"   # "leaf-0-3" base port 0 lid 4 lmc 0
    [1]     "H-0000000000100000"[1](100001)   # "node-000 mlx5_3" lid 9 4xNDR
    [33]    "S-0000000000200031"[5]           # "spine-1" lid 2 4xNDR

    caguid=0x100000
    Ca      1 "H-0000000000100000"            # "node-000 mlx5_3"
    [1](100001)  "S-0000000000200000"[1]      # lid 9 lmc 0 "leaf-0-3" lid 4 4xNDR

Every cable shows on both of its ends; each is taken once. An HCA is named the way rdma-core
names it, ``"<host> <device>"``: node ``<host>``, port ``<device>:<port number>``. A switch is
its NodeDescription, or the host name in an NVIDIA one (``MF0;leaf-07:MQM9700/U1``). Speeds
come from the link's width and rate (``4xNDR`` is 4 lanes of 100 Gb/s) when the line gives
them, else from the defaults. Router records are not part of a leaf-spine fabric: their
cables are left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from topology.fabric import FabricFacts, NodePort, at_line
from topology.name_map import NO_RENAMES, NameMap

# Gb/s per lane, by the rate ibnetdiscover prints (IBTA signalling rates).
LANE_GBPS = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0625,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}

_RECORD = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([^"]*)"\s*(?:#\s*"([^"]*)")?')
_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?(?:\([0-9a-fA-F]+\))?\s*"([^"]*)"\[(\d+)\]'
    r"(?:\[ext \d+\])?(?:\([0-9a-fA-F]+\))?\s*(.*)$"
)
_SPEED = re.compile(r"\b(\d+)x(" + "|".join(sorted(LANE_GBPS, key=len, reverse=True)) + r")\b")
_MELLANOX = re.compile(r"^MF0;([^:;/\s]+):")
_HEADER = re.compile(r"^[A-Za-z_]+=\S*")  # vendid=, devid=, sysimgguid=, switchguid=, caguid=
_SECTION = re.compile(r"^(Non-Chassis Nodes|Chassis\b.*|ChassisGUID\b.*)$")


@dataclass(frozen=True, slots=True)
class Defaults:
    """Speeds for lines that do not give theirs, and the GPUs of a node."""

    port_gbps: float = 200.0
    uplink_gbps: float = 400.0


@dataclass(slots=True)
class _Record:
    kind: str
    ident: str
    description: str
    line: int
    ports: list[tuple[int, str, int, float | None, int]] = field(default_factory=list)


def _guid(ident: str) -> int | None:
    """The GUID in a record id (``S-0000000000200000``), when it has one."""
    _, _, digits = ident.partition("-")
    try:
        return int(digits, 16)
    except ValueError:
        return None


def _switch_name(description: str) -> str:
    """NVIDIA switches describe themselves as ``MF0;<host name>:<model>/<unit>``: the host
    name is the switch's name (a ``/`` would read as a node/port id)."""
    match = _MELLANOX.match(description)
    return match.group(1) if match else description


def _speed(comment: str) -> float | None:
    match = _SPEED.search(comment)
    return int(match.group(1)) * LANE_GBPS[match.group(2)] if match else None


def _records(text: str, source: str) -> list[_Record]:
    records: list[_Record] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or _HEADER.match(line) or _SECTION.match(line):
            continue
        record = _RECORD.match(line)
        if record:
            kind, _, ident, description = record.groups()
            if ident in seen:
                raise at_line(source, number, f"{kind} {ident!r} listed twice")
            seen.add(ident)
            records.append(_Record(kind, ident, description or "", number))
            continue
        port = _PORT.match(line)
        if port is None:
            raise at_line(source, number, f"not an ibnetdiscover line: {line[:80]!r}")
        if not records:
            raise at_line(source, number, "a port line before any Switch or Ca record")
        local, remote, remote_port, comment = port.groups()
        records[-1].ports.append((int(local), remote, int(remote_port), _speed(comment), number))
    if not records:
        raise at_line(source, 1, "no Switch or Ca record: not an ibnetdiscover topology file")
    return records


def _hca_name(description: str, names: NameMap, guid: int | None) -> tuple[str, str] | None:
    host, _, device = names.name(description, guid).rpartition(" ")
    if not host or not device or " " in host:
        return None
    return names.name(host), device


def parse_ibnetdiscover(
    text: str, source: str, names: NameMap = NO_RENAMES, defaults: Defaults = Defaults()
) -> FabricFacts:
    """The fabric of an ibnetdiscover file; `ImportInputError` naming the line of bad input."""
    records = _records(text, source)
    by_id = {record.ident: record for record in records}
    switch_names: dict[str, str] = {}
    for record in records:
        if record.kind == "Switch":
            name = names.name(_switch_name(record.description or record.ident), _guid(record.ident))
            if not name or any(character.isspace() for character in name):
                detail = f"switch {record.ident} is named {name!r}: give it a name with --map"
                raise at_line(source, record.line, detail)
            switch_names[record.ident] = name
    facts = FabricFacts()
    for name in switch_names.values():
        facts.add_switch(name)
    done: set[tuple[str, int]] = set()
    for record in records:
        for local, remote, remote_port, gbps, number in record.ports:
            if (record.ident, local) in done:
                continue
            done.update({(record.ident, local), (remote, remote_port)})
            other = by_id.get(remote)
            if other is None:
                raise at_line(source, number, f"cable to {remote!r}, which has no record")
            ends = {record.kind: (record, local), other.kind: (other, remote_port)}
            if "Rt" in ends:
                continue
            if record.kind == other.kind == "Switch":
                speed = gbps or defaults.uplink_gbps
                facts.add_cable(switch_names[record.ident], switch_names[remote], speed)
            elif record.kind == other.kind == "Ca":
                raise at_line(source, number, "an HCA cabled straight to an HCA")
            else:
                hca, hca_port = ends["Ca"]
                switch, _ = ends["Switch"]
                named = _hca_name(hca.description, names, _guid(hca.ident))
                if named is None:
                    detail = (
                        f"HCA {hca.ident} is named {hca.description!r}, not '<host> <device>': "
                        "set its node description or give it a name with --map"
                    )
                    raise at_line(source, hca.line, detail)
                host, device = named
                port = NodePort(
                    host,
                    f"{device}:{hca_port}",
                    switch_names[switch.ident],
                    gbps or defaults.port_gbps,
                )
                facts.add_port(port)
    return facts
