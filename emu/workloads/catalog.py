"""The synthetic workloads of docs/design.md ("Workloads"), one class each; each is seeded.

Token counts scale with the model shape's ``context_tokens`` (the longest a
context may grow), so the same workload runs on the ``ci`` preset in seconds and
on ``s1`` at full size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .base import Turn, Workload


def _prompt(w: Workload, lo: float, hi: float) -> int:
    cap = w.shape.context_tokens
    return int(w.rng.integers(max(1, int(lo * cap)), max(2, int(hi * cap)) + 1))


class ZipfSessions(Workload):
    name = "zipf-sessions"
    summary = "Zipf(1.1) returns over 200 sessions (Appendix N's reuse pattern; docs/design.md)"
    defaults = {"sessions": 200, "zipf": 1.1, "turn_tokens": 16, "lanes": 4}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        n = int(p["sessions"])
        ranks = np.arange(1, n + 1, dtype=np.float64) ** -float(p["zipf"])
        prob = ranks / ranks.sum()
        order = self.rng.permutation(n)  # which session has which popularity rank
        seen: set[int] = set()
        while True:
            s = int(order[self.rng.choice(n, p=prob)])
            first = s not in seen
            seen.add(s)
            yield Turn(s, _prompt(self, 0.25, 0.5) if first else 0, int(p["turn_tokens"]))


class Cyclic(Workload):
    name = "cyclic"
    summary = "cyclic sweep: sessions visited round-robin (defeats recency)"
    defaults = {"sessions": 24, "turn_tokens": 16, "lanes": 4}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        n = int(p["sessions"])
        seen: set[int] = set()
        i = 0
        while True:
            s = i % n
            first = s not in seen
            seen.add(s)
            yield Turn(s, _prompt(self, 0.25, 0.5) if first else 0, int(p["turn_tokens"]))
            i += 1


class Flood(Workload):
    name = "flood"
    summary = "one-shot flood: a few hot sessions between a stream of sessions seen once"
    defaults = {"hot_sessions": 6, "flood_every": 2, "turn_tokens": 16, "lanes": 4}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        hot = int(p["hot_sessions"])
        every = max(1, int(p["flood_every"]))
        seen: set[int] = set()
        new_id = hot
        i = 0
        while True:
            if i % (every + 1) == every:  # a one-shot session
                yield Turn(new_id, _prompt(self, 0.25, 0.5), int(p["turn_tokens"]))
                new_id += 1
            else:
                s = int(self.rng.integers(hot))
                first = s not in seen
                seen.add(s)
                yield Turn(s, _prompt(self, 0.25, 0.5) if first else 0, int(p["turn_tokens"]))
            i += 1


class Retrieval(Workload):
    name = "retrieval"
    summary = "long-context retrieval: a needle far back in one long context per lane"
    defaults = {"lanes": 1, "needle_at": 0.08, "fill": 0.9}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        cap = self.shape.context_tokens
        s = 0
        while True:
            prompt = max(1, int(float(p["fill"]) * cap))
            yield Turn(s, prompt, max(1, cap - prompt))
            s += 1

    def needle_blocks(self, session: int) -> np.ndarray | None:
        nb = -(-self.shape.context_tokens // self.shape.block_tokens)
        b = max(1, int(float(self.params["needle_at"]) * nb))
        return np.array([b, b + 1])


class MultiTurn(Workload):
    name = "multi-turn"
    summary = "multi-turn resumption: users alternate message + reply, idle in between"
    defaults = {"sessions": 12, "message_tokens": 48, "reply_tokens": 32, "lanes": 4}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        n = int(p["sessions"])
        seen: set[int] = set()
        while True:
            for s in self.rng.permutation(n):
                s = int(s)
                first = s not in seen
                seen.add(s)
                prefill = _prompt(self, 0.1, 0.2) if first else int(p["message_tokens"])
                yield Turn(s, prefill, int(p["reply_tokens"]))


class SharedPrefix(Workload):
    name = "shared-prefix"
    summary = "shared system prompt: many sessions start from one common prefix"
    defaults = {"sessions": 48, "prefix_tokens": 256, "turn_tokens": 16, "lanes": 4, "zipf": 0.8}

    PREFIX = 0  # context id of the shared prefix

    def shared_contexts(self) -> list[tuple[int, int]]:
        return [(self.PREFIX, self.prefix_tokens())]

    def prefix_tokens(self) -> int:
        bt = self.shape.block_tokens
        want = min(int(self.params["prefix_tokens"]), self.shape.context_tokens // 2)
        return max(bt, want // bt * bt)  # whole blocks, so entries can be shared

    def turns(self) -> Iterator[Turn]:
        p = self.params
        n = int(p["sessions"])
        ranks = np.arange(1, n + 1, dtype=np.float64) ** -float(p["zipf"])
        prob = ranks / ranks.sum()
        seen: set[int] = set()
        while True:
            s = 1 + int(self.rng.choice(n, p=prob))
            first = s not in seen
            seen.add(s)
            prefill = _prompt(self, 0.05, 0.2) if first else 0
            yield Turn(s, prefill, int(p["turn_tokens"]), parent=self.PREFIX if first else None)


class Uniform(Workload):
    name = "uniform"
    summary = "adversarial: sessions and blocks read uniformly at random (no locality)"
    read_mode = "uniform"
    defaults = {"sessions": 32, "turn_tokens": 4, "lanes": 4, "read_fraction": 0.25}

    def turns(self) -> Iterator[Turn]:
        p = self.params
        n = int(p["sessions"])
        seen: set[int] = set()
        while True:
            s = int(self.rng.integers(n))
            first = s not in seen
            seen.add(s)
            yield Turn(s, _prompt(self, 0.25, 0.5) if first else 0, int(p["turn_tokens"]))


WORKLOADS: dict[str, type[Workload]] = {
    w.name: w for w in (ZipfSessions, Cyclic, Flood, Retrieval, MultiTurn, SharedPrefix, Uniform)
}
