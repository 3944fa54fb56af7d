"""The fabric from LLDP: ``lldpcli -f json show neighbors``, one file per node (RoCE, Ethernet).

lldpd writes ``{"lldp": {"interface": {...}}}``: one interface as an object keyed by its name,
several as a list of such objects, none as ``{"lldp": {}}``. Each interface names the
neighbour's chassis (the switch's system name) and port (its name when the switch sends it as
the port id, else the port description).

Files of switches may sit beside the nodes' (a switch OS that runs lldpd): their cables to
other switches are the uplinks. A system is a switch when LLDP says it bridges or routes
(capability Bridge or Router enabled, as switches advertise); a system nothing says that of
is a switch when it has no file of its own (what the nodes see), else a node.
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
    # Whether the neighbour bridges or routes; None when it advertises no capabilities.
    forwards: bool | None = None


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


def _forwards(chassis: Any) -> bool | None:
    capabilities = chassis.get("capability") if isinstance(chassis, dict) else None
    if isinstance(capabilities, dict):
        capabilities = [capabilities]
    if not isinstance(capabilities, list) or not capabilities:
        return None
    return any(
        isinstance(each, dict) and each.get("type") in ("Bridge", "Router") and each.get("enabled")
        for each in capabilities
    )


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
            if not isinstance(chassis, dict):
                chassis = {}
            names = [name for name in chassis if name != "id"]
            port = _port_name(facts.get("port")) if isinstance(facts, dict) else None
            if len(names) != 1 or port is None:
                line = _line_of(text, f'"{interface}"')
                detail = f"interface {interface!r}: no neighbour chassis name and port"
                raise at_line(source, line, detail)
            found.append(Neighbour(interface, names[0], port, _forwards(chassis[names[0]])))
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
    """The fabric of a folder of ``<node>.json`` files (every file but hidden ones is read,
    its name less ``.json`` being the system's). Interfaces keep their names unless
    ``names`` maps them (``ens1f0np0 mlx5_0:1``); LLDP gives no speeds, the defaults do."""
    try:
        paths = sorted(
            path for path in folder.iterdir() if not path.name.startswith(".") and path.is_file()
        )
    except OSError as error:
        message = f"cannot read {folder}: {error.strerror or error}"
        raise ImportInputError(message) from None
    if not paths:
        message = f"{folder}: no files (one per node: <node>.json)"
        raise ImportInputError(message)
    if len(paths) > MAX_FILES:
        message = f"{folder}: more than {MAX_FILES} files"
        raise ImportInputError(message)
    reports = {
        names.name(path.name.removesuffix(".json")): parse_neighbours(_read(path), str(path))
        for path in paths
    }
    said: dict[str, bool] = {}
    for found in reports.values():
        for neighbour in found:
            if neighbour.forwards is not None:
                name = names.name(neighbour.chassis)
                said[name] = said.get(name, False) or neighbour.forwards
    seen = {names.name(n.chassis) for found in reports.values() for n in found}
    switches = {name for name in seen if said.get(name, name not in reports)}
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
