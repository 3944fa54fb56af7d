"""The fabric correlator: slow connections of several jobs over one link become one finding.

A connection that is slow while neither of its ports is (no port shared by two slow
connections) points at its path. Paths of several connections, of one or more jobs, that
cross one leaf-spine link point at that link; when the paths are unknown (no route plan),
they can only point at the leaf they share.

A connection whose path just changed (a reroute) votes for nothing for a while: its slowness
was measured on samples of its old path, and its new path would be blamed for it. The change
is known from the plan (when the worker learnt it), or seen here when a slow path's spine
changes; a connection first found slow just after its plan moved it is held back as well.

Slow paths of one leaf pair cross two links and the spine between them, all equally
suspect. When such a tie lasts, the jobs' other paths break it: one over a tied link that
fell (slower than it was on its path, though not among the slow paths) backs that link, one
as fast as it was clears it. The spine is named only when they leave the tie, and not when
paths through it over other links stayed as fast as they were.

A link is named ``link_down`` (dark) when the paths over it fell below
``DetectorParams.dark_link_share`` of their own past throughput, else ``link_degraded``. A
dark link carries nothing: flows still hashed onto it until the fabric's routing converges
crawl on retransmissions after timeouts, at a small fraction of their speed; a degraded link
(fewer lanes, a lower rate, errors the link layer corrects) still carries a share of it. The
class follows the paths over the named link: a degraded link that goes dark (or comes back
to a share) is named again in its new class once the paths have said so for a few checks.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

from schemas.files import Topology
from schemas.messages import Diagnosis, DiagnosisClass
from streams.core.clock import TickClock
from streams.core.findings import FindingBook, SuspectScore
from streams.core.params import DetectorParams
from streams.core.slowpath import SlowPath, path_of, path_row
from streams.core.stats import median_of

RESOLVE_AFTER_CHECKS = 8
MIN_PATHS = 2
# Checks a tie must last before the switch the tied links share is named: two tied links
# are the two ends of one leaf pair's paths (either link, or the spine between them), and
# paths of other leaf pairs over the faulty link often come a few seconds later.
TIE_PATIENCE = 40
# A link singled out of a tie by other paths' evidence, not by the slow paths alone.
TIE_BROKEN_SCORE = 0.8
# A connection's throughput is the median of its last few reports: after its path changed,
# its samples describe the old path for about that long.
REROUTE_SETTLE_NS = 5_000_000_000
# The classes of the correlator's findings: a fabric link (or switch) that slows the paths
# over it, or a link that went dark (named only for a link, never for a switch).
DEGRADED: DiagnosisClass = "link_degraded"
DARK: DiagnosisClass = "link_down"
FABRIC_CLASSES: tuple[DiagnosisClass, ...] = (DEGRADED, DARK)
# Checks in a row the paths over a named link must say it is in the other class before it is
# named again in that class: paths near the dark share do not flip it back and forth.
CLASS_CHANGE_CHECKS = 4


class FabricCorrelator:
    """Votes of slow paths per fabric link; names the link (or switch) several paths share."""

    def __init__(self, topology: Topology | None, params: DetectorParams | None = None) -> None:
        self.book = FindingBook()
        self._dark_share = (params or DetectorParams()).dark_link_share
        self._leaf_of: dict[str, str] = {}
        self._link_of: dict[frozenset[str], str] = {}
        self._ends: dict[str, frozenset[str]] = {}
        self._spines_of: dict[str, list[str]] = defaultdict(list)
        if topology is not None:
            for node in topology.nodes:
                for port in node.ports:
                    self._leaf_of[f"{node.id}/{port.id}"] = port.leaf
            tiers = {switch.id: switch.tier for switch in topology.switches}
            for link in topology.links:
                self._link_of[frozenset((link.a, link.b))] = link.id
                self._ends[link.id] = frozenset((link.a, link.b))
                leaf, spine = (link.a, link.b) if tiers.get(link.a) == 1 else (link.b, link.a)
                self._spines_of[leaf].append(spine)
        self.quiet: dict[str, int] = {}
        self.tie_checks = 0
        # (job, flow) of each current slow path -> (its spine, event time it took that spine)
        self.vias: dict[tuple[str, str], tuple[str | None, int]] = {}
        # A named link -> checks in a row its paths said it is in the other class.
        self.contrary: dict[str, int] = {}

    def open_keys(self) -> list[str]:
        """The links and switches named now, in either class."""
        return [key for cls in FABRIC_CLASSES for key in self.book.open_keys(None, cls)]

    def class_of(self, key: str) -> DiagnosisClass | None:
        """The class a link or switch is named in now; None when it is not named."""
        return next((cls for cls in FABRIC_CLASSES if self.book.is_open(None, cls, key)), None)

    def _class_for(self, paths: list[SlowPath]) -> DiagnosisClass:
        """Dark when the paths over a link fell (their median) below the dark share of their
        own past; a path that does not say how far it fell counts as degraded."""
        fell = [1.0 if p.fell_to is None else p.fell_to for p in paths]
        return DARK if fell and median_of(fell) < self._dark_share else DEGRADED

    @property
    def knows_paths(self) -> bool:
        """Whether a topology was given, so that slow paths can be correlated at all."""
        return bool(self._link_of)

    def _candidates(self, path: SlowPath) -> set[str]:
        src, dst = self._leaf_of.get(path.src_port), self._leaf_of.get(path.dst_port)
        if src is None or dst is None or src == dst:
            return set()
        spines = [path.via] if path.via else self._spines_of.get(src, [])
        links = set()
        for spine in spines:
            for leaf in (src, dst):
                link = self._link_of.get(frozenset((leaf, spine)))
                if link is not None:
                    links.add(link)
        return links

    def check(
        self,
        now_ns: int,
        slow_paths: Iterable[SlowPath],
        seen: Iterable[tuple[SlowPath, bool]] = (),
    ) -> list[Diagnosis]:
        """Fire for the link most slow paths cross; resolve links no path points at anymore.

        ``seen``: the jobs' other paths, each with whether it fell (slower than it was on
        that path); read only to break a lasting tie.
        """
        votes: Counter[str] = Counter()
        jobs: dict[str, set[str]] = defaultdict(set)
        voters: dict[str, list[SlowPath]] = defaultdict(list)
        exact = True
        current = {(p.job, p.flow): p for p in slow_paths}
        vias: dict[tuple[str, str], tuple[str | None, int]] = {}
        for flow, path in current.items():
            known = self.vias.get(flow)
            if known is None:
                vias[flow] = (path.via, -REROUTE_SETTLE_NS)  # first seen slow: counts at once
            elif known[0] != path.via:
                vias[flow] = (path.via, now_ns)  # moved: its samples are of the old path
            else:
                vias[flow] = known
        self.vias = vias
        open_keys = self.open_keys()
        named: set[str] = set()
        over: dict[str, list[SlowPath]] = defaultdict(list)  # named link -> settled paths on it
        # Each leaf with an uplink named -> that link.
        leaves = {
            end: key
            for key in open_keys
            for end in self._ends.get(key, ())
            if end in self._spines_of
        }
        settled = []
        for flow, path in current.items():
            if now_ns - vias[flow][1] >= REROUTE_SETTLE_NS and (
                path.moved_ns is None or now_ns - path.moved_ns >= REROUTE_SETTLE_NS
            ):
                settled.append(path)
                continue
            # Moved off a named link (or squeezed beside it) just now: it votes for nothing,
            # and the named link it was slow for stays named meanwhile.
            ends = (self._leaf_of.get(path.src_port), self._leaf_of.get(path.dst_port))
            candidates = self._candidates(path)
            held = [key for key in open_keys if key in candidates]
            held += [leaves[end] for end in ends if end in leaves]
            named.update(held)
        squeezed = self._squeezed(leaves, open_keys, settled)
        for path in settled:
            candidates = self._candidates(path)
            # Explained by a link already named (a switch named for a tie is not proof).
            naming = next((key for key in open_keys if key in candidates), None)
            if naming is not None and path.via is not None:
                over[naming].append(path)  # over it for sure: how far it fell is the link's
            if naming is None and squeezed:
                ends = (self._leaf_of.get(path.src_port), self._leaf_of.get(path.dst_port))
                naming = next((squeezed[end] for end in ends if end in squeezed), None)
            if naming is not None:
                # Explained by what is already named: it votes for nothing else.
                named.add(naming)
                continue
            exact = exact and path.via is not None
            for link in candidates:
                votes[link] += 1
                jobs[link].add(path.job)
                voters[link].append(path)
        out: list[Diagnosis] = []
        if votes:
            best, count = votes.most_common(1)[0]
            tied = [link for link, n in votes.items() if n == count]
            still_open = [link for link in tied if self.class_of(link) is not None]
            if still_open:
                named.add(still_open[0])  # the evidence still fits the link already named
            elif count >= MIN_PATHS and not _one_port_on_all(voters[best]):
                suspect: SuspectScore | None
                if len(tied) == 1:
                    suspect = SuspectScore("link", best, 0.92 if exact else 0.7)
                    self.tie_checks = 0
                else:
                    # More paths usually break a tie soon: when it lasts, the other paths
                    # break it, or else the shared switch is named.
                    self.tie_checks += 1
                    suspect = None
                    if self.tie_checks >= TIE_PATIENCE:
                        suspect = self._break_tie(now_ns, tied, current, seen)
                        if suspect is not None and suspect.type == "link":
                            best = suspect.id
                if suspect is not None:
                    named.add(suspect.id)
                    evidence = {"slow_paths": count, "jobs": sorted(jobs[best])[:32]}
                    cls = DEGRADED
                    if suspect.type == "link":
                        cls = self._class_for(voters[best])
                        evidence["fell_to"] = _fell_to(voters[best])
                    fired = self.book.fire(
                        None, cls, suspect.id, now_ns, now_ns, (suspect,), evidence
                    )
                    if fired is not None:
                        out.append(fired)
                        if suspect.type == "link":
                            out.extend(self._supersede(suspect.id, now_ns))
        out.extend(self._reclass(now_ns, over))
        for key in self.open_keys():
            if key in named:
                self.quiet[key] = 0
                continue
            self.quiet[key] = self.quiet.get(key, 0) + 1
            if self.quiet[key] >= RESOLVE_AFTER_CHECKS:
                del self.quiet[key]
                self.contrary.pop(key, None)
                named_as = self.class_of(key)
                if named_as and (resolved := self.book.resolve(None, named_as, key, now_ns)):
                    out.append(resolved)
        return out

    def _reclass(self, now_ns: int, over: dict[str, list[SlowPath]]) -> list[Diagnosis]:
        """Name a link again in the other class once the paths over it said so for
        `CLASS_CHANGE_CHECKS` checks in a row (a degraded link went dark, or came back to a
        share); its finding in the old class resolves. Only a link's own paths count: those
        squeezed beside it say nothing of how far it fell."""
        out: list[Diagnosis] = []
        for key, paths in over.items():
            cls = self.class_of(key)
            if cls is None or key not in self._ends or len(paths) < MIN_PATHS:
                continue
            if self._class_for(paths) == cls:
                self.contrary.pop(key, None)
                continue
            self.contrary[key] = self.contrary.get(key, 0) + 1
            if self.contrary[key] < CLASS_CHANGE_CHECKS:
                continue
            del self.contrary[key]
            before = self.book.finding(None, cls, key)
            if before is None:
                continue
            evidence = {**before.evidence, "slow_paths": len(paths), "fell_to": _fell_to(paths)}
            new = DARK if cls == DEGRADED else DEGRADED
            if resolved := self.book.resolve(None, cls, key, now_ns):
                out.append(resolved)
            fired = self.book.fire(None, new, key, now_ns, now_ns, before.suspects, evidence)
            if fired is not None:
                out.append(fired)
        return out

    def _uplink(self, path: SlowPath, leaf: str) -> str | None:
        """The path's link between ``leaf`` (one of its ends) and its spine; None when its
        spine is unknown or ``leaf`` is not one of its ends."""
        ends = (self._leaf_of.get(path.src_port), self._leaf_of.get(path.dst_port))
        if path.via is None or leaf not in ends:
            return None
        return self._link_of.get(frozenset((leaf, path.via)))

    def _squeezed(
        self, leaves: dict[str, str], open_keys: list[str], paths: list[SlowPath]
    ) -> dict[str, str]:
        """Of ``leaves`` (a leaf with an uplink named -> that link), those whose slow paths
        the named uplink explains.

        A leaf with an uplink named (degraded, or down) squeezes its traffic onto its other
        uplinks, which a reroute around it loads further: paths over all of them are slower
        for a known cause, no new fault. A second faulty uplink stands out among them (twice
        the paths a finding needs, and twice those of any other uplink); a few paths, or
        paths spread over several uplinks, are the squeeze. A leaf left with one uplink by
        one that went dark is squeezed whatever its paths say.
        """
        squeezed: dict[str, str] = {}
        for leaf, key in leaves.items():
            others = [
                spine
                for spine in self._spines_of.get(leaf, ())
                if self._link_of.get(frozenset((leaf, spine))) not in open_keys
            ]
            if len(others) <= 1 and self.class_of(key) == DARK:
                # The leaf's one uplink left takes all the traffic of the one that went dark:
                # nothing to hold it against (a degraded uplink still carries its share).
                squeezed[leaf] = key
                continue
            over: Counter[str] = Counter()
            for path in paths:
                link = self._uplink(path, leaf)
                if link is not None and link not in open_keys:
                    over[link] += 1
            ranked = over.most_common(2)
            top = ranked[0][1] if ranked else 0
            second = ranked[1][1] if len(ranked) > 1 else 0
            if top < 2 * MIN_PATHS or top < 2 * second:
                squeezed[leaf] = key
        return squeezed

    def _supersede(self, link: str, now_ns: int) -> list[Diagnosis]:
        """Resolve a switch named for a tie once more paths single out one of its links."""
        ends = next((pair for pair, name in self._link_of.items() if name == link), frozenset())
        out = []
        for key in self.book.open_keys(None, DEGRADED):
            if key in ends and (resolved := self.book.resolve(None, DEGRADED, key, now_ns)):
                self.quiet.pop(key, None)
                out.append(resolved)
        return out

    def _break_tie(
        self,
        now_ns: int,
        tied: list[str],
        current: dict[tuple[str, str], SlowPath],
        seen: Iterable[tuple[SlowPath, bool]],
    ) -> SuspectScore | None:
        """The tied link other paths single out, else the switch the tied links share.

        A degraded link slows every path over it, not only those slow enough to vote (slow
        against their job's other connections, in a job not slow nearly everywhere): each
        other path over a tied link that fell backs it, each that stayed as fast as it was
        clears it. The link with the most net backing wins, if alone; else the switch,
        unless the paths through it over none of the tied links mostly stayed as fast.
        """
        switch = self._shared_switch(tied)
        backing: Counter[str] = Counter({link: 0 for link in tied})
        through = 0  # paths through the switch over other links: fell (+) or as fast (-)
        for path, fell in seen:
            if (path.job, path.flow) in current or path.via is None:
                continue  # voting already, or over a spine not known
            if path.moved_ns is not None and now_ns - path.moved_ns < REROUTE_SETTLE_NS:
                continue  # its samples may still be its old path's
            links = self._candidates(path)
            over = links.intersection(tied)
            for link in over:
                backing[link] += 1 if fell else -1
            if not over and switch is not None and any(switch.id in self._ends[n] for n in links):
                through += 1 if fell else -1
        (first, top), (_, second) = backing.most_common(2)
        if top > second:
            return SuspectScore("link", first, TIE_BROKEN_SCORE)
        return switch if through >= 0 else None

    def _shared_switch(self, links: list[str]) -> SuspectScore | None:
        ends: Counter[str] = Counter()
        for link in links:
            ends.update(self._ends.get(link, ()))
        if not ends:
            return None
        switch, count = ends.most_common(1)[0]
        return SuspectScore("switch", switch, 0.6) if count == len(links) else None


def _fell_to(paths: list[SlowPath]) -> float | None:
    """The median of how far these paths fell (None: none of them says)."""
    known = [p.fell_to for p in paths if p.fell_to is not None]
    return round(median_of(known), 2) if known else None


def _one_port_on_all(paths: list[SlowPath]) -> bool:
    """Whether one NIC port lies on every one of these slow paths: that port explains them
    (a degraded port slows what it sends and what it receives), not the link or switch they
    share. A fabric finding needs slow paths from several distinct endpoints."""
    common: set[str] | None = None
    for path in paths:
        ends = {path.src_port, path.dst_port}
        common = ends if common is None else common & ends
        if not common:
            return False
    return bool(common)


class FabricHub:
    """The correlator where the jobs live on several workers: each job's latest slow paths.

    Workers send a job's slow paths when they change; the hub correlates the union on its
    own clock, as the single-process engine does with its jobs' current paths.
    """

    def __init__(
        self, topology: Topology | None, tick_ns: int, params: DetectorParams | None = None
    ) -> None:
        self.correlator = FabricCorrelator(topology, params)
        self.paths: dict[str, list[SlowPath]] = {}
        self.clock = TickClock(tick_ns)

    def update(self, job: str, paths: list[SlowPath]) -> None:
        """A job's current slow paths (an empty list: none any more)."""
        if paths:
            self.paths[job] = paths
        else:
            self.paths.pop(job, None)

    def advance(self, now_ns: int) -> list[Diagnosis]:
        """Move the hub's clock forward; correlate once per tick, as the engine does."""
        if not self.clock.advance(now_ns):
            return []
        # Only slow paths reach the hub: a lasting tie names the shared switch, no other
        # paths break it here.
        return self.correlator.check(now_ns, [p for ps in self.paths.values() for p in ps])

    def state(self) -> dict[str, Any]:
        """The hub's paths and the correlator's open findings, as plain data."""
        return {
            "paths": {job: [path_row(p) for p in paths] for job, paths in self.paths.items()},
            "findings": self.correlator.book.state(),
            "quiet": self.correlator.quiet,
            "tie_checks": self.correlator.tie_checks,
            "contrary": self.correlator.contrary,
            "vias": [
                [job, flow, via, since]
                for (job, flow), (via, since) in self.correlator.vias.items()
            ],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Take the state of a snapshot (one taken before paths said how far they fell has
        five fields a path: not known, as degraded)."""
        self.paths = {
            job: [path_of(job, row) for row in paths] for job, paths in state["paths"].items()
        }
        self.correlator.book.restore(state["findings"])
        self.correlator.quiet = dict(state["quiet"])
        self.correlator.tie_checks = int(state["tie_checks"])
        self.correlator.contrary = {str(k): int(n) for k, n in state.get("contrary", {}).items()}
        self.correlator.vias = {
            (job, flow): (via, int(since)) for job, flow, via, since in state.get("vias", ())
        }
