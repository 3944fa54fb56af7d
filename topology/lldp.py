"""The fabric from LLDP: ``lldpcli -f json show neighbors``, one file per node (RoCE, Ethernet).

lldpd writes ``{"lldp": {"interface": {...}}}``: one interface as an object keyed by its name,
several as a list of such objects, none as ``{"lldp": {}}``. Each interface names the
neighbour's chassis (the switch's system name) and port (its name when the switch sends it as
the port id, else the port description). A file named after a switch (a name the nodes' files
give as a neighbour) describes that switch's cables: those to other switches are its uplinks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from topology.fabric import FabricFacts, ImportInputError, NodePort, at_line
from topology.name_map import NO_RENAMES, NameMap

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_FILES = 65_536


@dataclass(frozen=True, slots=True)
class Neighbour:
    """What LLDP says is at the other end of a local interface."""

    interface: str
    chassis: str
    port: str


def _line_of(text: str, needle: str) -> int:
    """The line where ``needle`` first shows (1 when it does not): where to point a reader."""
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _interfaces(document: Any) -> Iterator[tuple[str, Any]]:
    lldp = document.get("lldp") if isinstance(document, dict) else None
    if not isinstance(lldp, dict):
        message = "not 'lldpcli -f json show neighbors' output (no 'lldp' object)"
        raise ValueError(message)
    interfaces = lldp.get("interface", {})
    for item in interfaces if isinstance(interfaces, list) else [interfaces]:
        if not isinstance(item, dict):
            message = "'interface' holds something that is not an object"
            raise ValueError(message)
        yield from item.items()


def _port_name(port: Any) -> str | None:
    if not isinstance(port, dict):
        return None
    ident = port.get("id")
    if isinstance(ident, dict) and ident.get("type") == "ifname" and ident.get("value"):
        return str(ident["value"])
    if port.get("descr"):
        return str(port["descr"])
    return str(ident["value"]) if isinstance(ident, dict) and ident.get("value") else None


def parse_neighbours(text: str, source: str) -> list[Neighbour]:
    """The neighbours in one file's text; `ImportInputError` naming the line of bad input."""
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise at_line(source, error.lineno, f"invalid JSON: {error.msg}") from None
    found = []
    try:
        for interface, facts in _interfaces(document):
            chassis = facts.get("chassis") if isinstance(facts, dict) else None
            names = [name for name in chassis if name != "id"] if isinstance(chassis, dict) else []
            port = _port_name(facts.get("port")) if isinstance(facts, dict) else None
            if len(names) != 1 or port is None:
                line = _line_of(text, f'"{interface}"')
                detail = f"interface {interface!r}: no neighbour chassis name and port"
                raise at_line(source, line, detail)
            found.append(Neighbour(interface, names[0], port))
    except ValueError as error:
        raise at_line(source, 1, str(error)) from None
    return found


def _read(path: Path) -> str:
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        message = f"cannot read {path}: {error.strerror or error}"
        raise ImportInputError(message) from None
    if len(data) > MAX_FILE_BYTES:
        message = f"{path}: larger than {MAX_FILE_BYTES} bytes"
        raise ImportInputError(message)
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise at_line(str(path), data.count(b"\n", 0, error.start) + 1, "not UTF-8") from None


def parse_lldp_dir(
    folder: Path,
    names: NameMap = NO_RENAMES,
    port_gbps: float = 200.0,
    uplink_gbps: float = 400.0,
) -> FabricFacts:
    """The fabric of a folder of ``<node>.json`` files. Interfaces keep their names unless
    ``names`` maps them (``ens1f0np0 mlx5_0:1``); LLDP gives no speeds, the defaults do."""
    try:
        paths = sorted(path for path in folder.iterdir() if path.suffix == ".json")
    except OSError as error:
        message = f"cannot read {folder}: {error.strerror or error}"
        raise ImportInputError(message) from None
    if not paths:
        message = f"{folder}: no <node>.json files"
        raise ImportInputError(message)
    if len(paths) > MAX_FILES:
        message = f"{folder}: more than {MAX_FILES} files"
        raise ImportInputError(message)
    reports = {names.name(path.stem): parse_neighbours(_read(path), str(path)) for path in paths}
    switches = {names.name(n.chassis) for found in reports.values() for n in found}
    facts = FabricFacts()
    for reporter, found in reports.items():
        for neighbour in found:
            switch = names.name(neighbour.chassis)
            if reporter not in switches:
                port = NodePort(reporter, names.name(neighbour.interface), switch, port_gbps)
                facts.add_port(port)
            elif switch in switches and reporter < switch:  # each uplink once, from either end
                facts.add_cable(reporter, switch, uplink_gbps)
            elif switch in switches and switch not in reports:
                facts.add_cable(reporter, switch, uplink_gbps)
    return facts
