"""The ECMP model: a switch hash of the RoCEv2 5-tuple choosing a leaf's uplink.

A RoCEv2 flow is UDP to port 4791; its source port is the sender's choice, so it is the knob
that steers a flow onto a spine. The source leaf hashes (src ip, dst ip, proto 17, sport,
dport) with a seed of its own and takes ``hash % n`` among its ECMP group: the spines linked
to both leaves whose two links are up, in spine order (a real switch drops a down member). In a
2-tier fabric that is the only choice on the path; the spine has one link to the destination.

Every model hashes in two steps, a per-flow ``partial`` over everything but the source port
and a cheap ``finish`` per source port, because the planner's search and the ECMP sampling of
the benchmark evaluate one flow under thousands of source ports.
"""

from __future__ import annotations

import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from topology import TopologyError
from topology.model import Fabric

ROCE_DPORT = 4791
UDP = 17
SPORT_MIN = 49152  # the dynamic port range: what an RDMA stack picks source ports from
SPORT_MAX = 65535
IP_BASE = 0x0A000000  # 10.0.0.0/8


class UnknownHashError(TopologyError):
    """A hash model name that is not one of `HASH_MODELS`."""


class NoSourcePortError(TopologyError):
    """No source port of the dynamic range makes the hash choose the wanted spine."""


class SwitchHash(ABC):
    """A switch's hash of the 5-tuple, seeded per switch."""

    name: ClassVar[str]
    seed: int

    def switch_seed(self, switch: str) -> int:
        """The seed of one switch: the model seed mixed with the switch id (deterministic)."""
        return zlib.crc32(switch.encode(), self.seed & 0xFFFFFFFF)

    @abstractmethod
    def partial(self, switch_seed: int, src_ip: int, dst_ip: int, proto: int, dport: int) -> int:
        """The hash state over every field except the source port."""

    @abstractmethod
    def finish(self, partial: int, sport: int) -> int:
        """The 32-bit (or narrower) hash of the 5-tuple, from `partial` and the source port."""

    def hash(
        self, switch: str, src_ip: int, dst_ip: int, sport: int, dport: int = ROCE_DPORT
    ) -> int:
        """The whole hash of one 5-tuple at one switch."""
        return self.finish(
            self.partial(self.switch_seed(switch), src_ip, dst_ip, UDP, dport), sport
        )


@dataclass(frozen=True, slots=True)
class Crc32Hash(SwitchHash):
    """CRC-32 of the packed header fields, the switch seed as the initial CRC (Broadcom-like)."""

    name: ClassVar[str] = "crc32"
    seed: int = 0

    def partial(self, switch_seed: int, src_ip: int, dst_ip: int, proto: int, dport: int) -> int:
        # The source port goes last so that CRC's incremental form finishes in one call.
        return zlib.crc32(struct.pack(">IIBH", src_ip, dst_ip, proto, dport), switch_seed)

    def finish(self, partial: int, sport: int) -> int:
        return zlib.crc32(sport.to_bytes(2, "big"), partial)


@dataclass(frozen=True, slots=True)
class XorFoldHash(SwitchHash):
    """XOR of the fields folded to 16 bits: the cheap hash of older switches, poor spreading."""

    name: ClassVar[str] = "xor-fold"
    seed: int = 0

    def partial(self, switch_seed: int, src_ip: int, dst_ip: int, proto: int, dport: int) -> int:
        return (src_ip ^ dst_ip ^ proto ^ dport ^ switch_seed) & 0xFFFFFFFF

    def finish(self, partial: int, sport: int) -> int:
        word = partial ^ (sport << 16)
        return ((word >> 16) ^ word) & 0xFFFF


# The Microsoft RSS key: the usual Toeplitz key of NICs and switches.
_RSS_KEY = bytes.fromhex(
    "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa"
)
_TOEPLITZ_BYTES = 12  # src ip 4, dst ip 4, sport 2, dport 2 (RSS field order)


def _toeplitz_tables(key: bytes) -> tuple[tuple[int, ...], ...]:
    """Per input byte position, the hash contribution of each byte value (bitwise XOR sums)."""
    bits = int.from_bytes(key, "big")
    width = len(key) * 8
    windows = [(bits >> (width - 32 - i)) & 0xFFFFFFFF for i in range(_TOEPLITZ_BYTES * 8)]
    tables = []
    for position in range(_TOEPLITZ_BYTES):
        row = []
        for value in range(256):
            h = 0
            for bit in range(8):
                if value & (0x80 >> bit):
                    h ^= windows[position * 8 + bit]
            row.append(h)
        tables.append(tuple(row))
    return tuple(tables)


_TOEPLITZ = _toeplitz_tables(_RSS_KEY)


@dataclass(frozen=True, slots=True)
class ToeplitzHash(SwitchHash):
    """The Toeplitz (RSS) hash with the standard key, the switch seed XORed into the result."""

    name: ClassVar[str] = "toeplitz"
    seed: int = 0

    def partial(self, switch_seed: int, src_ip: int, dst_ip: int, proto: int, dport: int) -> int:
        del proto  # RSS hashes the UDP 4-tuple; the protocol selects the hash type instead
        t = _TOEPLITZ
        data = struct.pack(">IIH", src_ip, dst_ip, dport)
        h = switch_seed
        for position in range(8):
            h ^= t[position][data[position]]
        return h ^ t[10][data[8]] ^ t[11][data[9]]

    def finish(self, partial: int, sport: int) -> int:
        return partial ^ _TOEPLITZ[8][sport >> 8] ^ _TOEPLITZ[9][sport & 0xFF]


HASH_MODELS: dict[str, Callable[..., SwitchHash]] = {
    "crc32": Crc32Hash,
    "xor-fold": XorFoldHash,
    "toeplitz": ToeplitzHash,
}


def hash_model(name: str, seed: int = 0) -> SwitchHash:
    """The named hash model with a seed; raises `UnknownHashError`."""
    model = HASH_MODELS.get(name)
    if model is None:
        error = f"unknown hash model {name!r}; known: {', '.join(HASH_MODELS)}"
        raise UnknownHashError(error)
    return model(seed=seed)


def port_ip(port: int) -> int:
    """The IPv4 address of a port (by int id): 10.0.0.0/8 in topology port order.

    A model needs only distinct, stable addresses; a deployment whose NICs have other
    addresses hashes those instead, with the same search.
    """
    return IP_BASE + 1 + port


def format_ip(address: int) -> str:
    """Dotted-quad text of an IPv4 address."""
    return ".".join(str((address >> shift) & 0xFF) for shift in (24, 16, 8, 0))


@dataclass(frozen=True, slots=True)
class Ecmp:
    """A fabric under one hash model: which spine a flow's source port lands on, and back."""

    fabric: Fabric
    model: SwitchHash
    _seeds: dict[int, int] = field(default_factory=dict, repr=False, compare=False)

    def partial(self, src: int, dst: int) -> int:
        """The hash state of a flow (port int ids) at its source leaf, source port left out."""
        leaf = self.fabric.port_leaf[src]
        seed = self._seeds.get(leaf)
        if seed is None:
            seed = self.model.switch_seed(self.fabric.leaves[leaf])
            self._seeds[leaf] = seed
        return self.model.partial(seed, port_ip(src), port_ip(dst), UDP, ROCE_DPORT)

    def group(self, src: int, dst: int, down: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """The ECMP group (spine int ids) of a flow; empty within one leaf."""
        leaf_a, leaf_b = self.fabric.port_leaf[src], self.fabric.port_leaf[dst]
        if leaf_a == leaf_b:
            return ()
        return self.fabric.usable_spines(leaf_a, leaf_b, down)

    def choose(self, src: int, dst: int, sport: int, down: frozenset[int] = frozenset()) -> int:
        """The spine the source leaf sends a flow to (-1 within one leaf, or no member up)."""
        members = self.group(src, dst, down)
        if not members:
            return -1
        return members[self.model.finish(self.partial(src, dst), sport) % len(members)]

    def sport_for(
        self,
        src: int,
        dst: int,
        spine: int,
        down: frozenset[int] = frozenset(),
        members: tuple[int, ...] | None = None,
    ) -> int:
        """The first source port of 49152..65535 that makes the hash choose ``spine``."""
        if members is None:
            members = self.group(src, dst, down)
        if spine not in members:
            error = f"spine {self.fabric.spines[spine]} is not in the ECMP group of the flow"
            raise NoSourcePortError(error)
        if len(members) == 1:
            return SPORT_MIN
        wanted, size = members.index(spine), len(members)
        partial, finish = self.partial(src, dst), self.model.finish
        for sport in range(SPORT_MIN, SPORT_MAX + 1):
            if finish(partial, sport) % size == wanted:
                return sport
        error = (
            f"no source port in {SPORT_MIN}..{SPORT_MAX} makes {self.model.name} choose "
            f"{self.fabric.spines[spine]} for {self.fabric.port_ids[src]} -> "
            f"{self.fabric.port_ids[dst]}"
        )
        raise NoSourcePortError(error)


def down_set(fabric: Fabric, down: Iterable[str]) -> frozenset[int]:
    """Link ids as the int set the hash and planner take; raises on an unknown link."""
    return frozenset(fabric.link_indices(down))


def sport_for(
    fabric: Fabric,
    model: SwitchHash,
    src: str,
    dst: str,
    spine: str,
    down: Iterable[str] = (),
) -> int:
    """A source port that makes the hash choose ``spine`` for the flow ``src -> dst``."""
    if spine not in fabric.spine_index:
        error = f"unknown spine {spine!r}"
        raise NoSourcePortError(error)
    ecmp = Ecmp(fabric, model)
    return ecmp.sport_for(
        fabric.index_of(src),
        fabric.index_of(dst),
        fabric.spine_index[spine],
        down_set(fabric, down),
    )


def choose_spine(
    fabric: Fabric, model: SwitchHash, src: str, dst: str, sport: int, down: Iterable[str] = ()
) -> str | None:
    """The spine the hash sends ``src -> dst`` with this source port to (None: same leaf)."""
    ecmp = Ecmp(fabric, model)
    source, target = fabric.index_of(src), fabric.index_of(dst)
    if fabric.port_leaf[source] == fabric.port_leaf[target]:
        return None
    links_down = down_set(fabric, down)
    spine = ecmp.choose(source, target, sport, links_down)
    if spine < 0:
        raise fabric.unreachable(source, target, down=bool(links_down))
    return fabric.spines[spine]
