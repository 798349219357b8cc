"""Key-phrase boosting for greedy RNN-T decoding (shallow fusion): each stream's phrases as a
boosting tree, the pool that holds the tree of every slot on the device, and the per-step choice
the greedy pass (greedy.py) makes with it, in gathers over the whole batch.

The tree is a trie over the phrases' tokens with Aho-Corasick failure arcs (as icefall's
ContextGraph and NeMo's GPU phrase boosting). A stream's state is a node: the longest suffix of
what it emitted that is a prefix of one of its phrases. Each token of a phrase is worth the base
bonus times the phrase's weight (a prefix shared by several phrases: the largest), its first token
FIRST_SHARE of that (a first piece is often a common word start such as "▁k"; the pieces after it
tell the phrase: measured in scripts/phrase_eval.py). A node has *earned* the bonus of its best
partial match (the sum along it, or along a shorter suffix match).
A label that continues a match earns its bonus; one that breaks it gives back what the match had
earned (the state falls back along failure arcs, to a shorter match or the root). One greedy step
ranks labels by log-probability + (earned after the label - earned before): the second term is
the same for all labels, so a label's bonus is what the node it leads to has earned, 0 for any
label that leads back to the root. Blank gets no bonus, and boosting never turns the model's
blank into a label (NeMo's greedy fusion): it only chooses which label, where the model emits one.

A phrase is whole words: once one is complete, its bonus is kept only if the next label starts a
word (a piece with the word-boundary mark, punctuation, or a control piece such as <EOU>); a
label that would glue more letters onto its last word gives it back. So a complete node adds
its phrase's bonus (`done`) to every word-starting label, and the best such label joins the
candidates beside the model's own and the tree's.

Layout, for fixed shapes: a node's arcs are its Aho-Corasick transitions that lead deeper than
one token (its children and its fallbacks' children), in CSR form; the transitions into the root's
children (one token matched) are the same from every node, so they are stored once, as the root
row. A transition to a node deeper than one token ranks at least as high as the root arc of the
same label (that root child is a suffix of it, and `earned` takes the best along suffixes), so
the best score over both rows is the right one, and where both match, the deeper arc wins.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from .tokenizer import SPACE, Tokenizer

NEG_INF = float("-inf")
FIRST_SHARE = 0.5


@dataclass(frozen=True)
class BoostLimits:
    """The pool's capacity per slot: `root_width` labels that start a phrase, `nodes` tree nodes,
    `arcs` deeper arcs in all and `arc_width` from one node (trees past them are refused)."""

    root_width: int
    nodes: int
    arcs: int
    arc_width: int


class BoostingTree:
    """One stream's phrases, built on the host once: root row and CSR arcs as numpy arrays."""

    def __init__(self, phrases: list[tuple[list[int], float]], limits: BoostLimits):
        """phrases: (tokens, bonus per token) each. ValueError where the tree exceeds `limits`."""
        children, bonus, fail, ends = _trie(phrases)
        earned, done, order = _earned(children, bonus, fail, ends)
        if len(children) > limits.nodes:
            raise ValueError(f"the phrases make {len(children)} tree nodes: at most {limits.nodes}")
        if len(children[0]) > limits.root_width:
            raise ValueError(f"the phrases start with {len(children[0])} different tokens: at most {limits.root_width}")
        root = sorted(children[0].items())
        self.root_token = np.array([k for k, _ in root], dtype=np.int32)
        self.root_next = np.array([n for _, n in root], dtype=np.int32)
        self.root_value = np.array([earned[n] for _, n in root], dtype=np.float32)
        self.arc_start, self.arc_token, self.arc_next = _deep_arcs(children, fail, order)
        self.arc_value = earned[self.arc_next]
        self.done = done
        self.width = int(np.diff(self.arc_start).max(initial=0))
        if len(self.arc_token) > limits.arcs or self.width > limits.arc_width:
            raise ValueError("the phrases overlap too much to be boosted together")

    @property
    def nodes(self) -> int:
        return len(self.arc_start) - 1


def _trie(phrases: list[tuple[list[int], float]]):
    """children per node (token -> node; node 0 the root), the bonus of the arc into each node, each
    node's failure arc (its longest proper suffix in the trie), and the nodes that end a phrase."""
    children: list[dict[int, int]] = [{}]
    bonus = [0.0]
    ends = set()
    for tokens, value in phrases:
        node = 0
        for depth, token in enumerate(tokens):
            if token not in children[node]:
                children[node][token] = len(children)
                children.append({})
                bonus.append(0.0)
            node = children[node][token]
            bonus[node] = max(bonus[node], value * (FIRST_SHARE if depth == 0 else 1.0))
        ends.add(node)
    fail = [0] * len(children)
    queue = deque(children[0].values())
    while queue:
        node = queue.popleft()
        for token, child in children[node].items():
            back = fail[node]
            while back and token not in children[back]:
                back = fail[back]
            fail[child] = children[back].get(token, 0)
            queue.append(child)
    return children, bonus, fail, ends


def _earned(children, bonus, fail, ends) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """What each node has earned (its path's bonus, or its best suffix match's), what it keeps if
    a word starts next (the bonus of the phrase it completes, itself or as a suffix), and the
    breadth-first order of the nodes (failure arcs point back in it)."""
    order, queue = [0], deque([0])
    path = np.zeros(len(children), dtype=np.float32)
    earned = np.zeros(len(children), dtype=np.float32)
    done = np.zeros(len(children), dtype=np.float32)
    while queue:
        node = queue.popleft()
        for child in children[node].values():
            path[child] = path[node] + bonus[child]
            earned[child] = max(path[child], earned[fail[child]])
            done[child] = path[child] if child in ends else done[fail[child]]
            order.append(child)
            queue.append(child)
    return earned, done, order


def _deep_arcs(children, fail, order) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every node's transitions to nodes deeper than one token, sorted by token, in CSR form."""
    deep: list[dict[int, int]] = [{} for _ in children]
    for node in order[1:]:  # a fallback is shallower: its arcs are known by then
        deep[node] = {**deep[fail[node]], **children[node]}
    start = np.zeros(len(children) + 1, dtype=np.int32)
    start[1:] = np.cumsum([len(arcs) for arcs in deep])
    flat = [(k, n) for arcs in deep for k, n in sorted(arcs.items())]
    token = np.array([k for k, _ in flat], dtype=np.int32)
    nxt = np.array([n for _, n in flat], dtype=np.int32)
    return start, token, nxt


def word_starts(tokenizer: Tokenizer | None, labels: int) -> np.ndarray:
    """[labels] bool: the labels that start a word (the word-boundary mark, no letter, digit or
    apostrophe, or a control piece); blank (the last label) and, without a tokenizer, every
    label: False. An apostrophe glues letters on ("metformin" + "'s")."""
    starts = np.zeros(labels, dtype=bool)
    if tokenizer is not None:
        for i in range(tokenizer.vocab_size):
            piece = tokenizer.piece(i)
            starts[i] = (i in tokenizer.special_ids or piece.startswith(SPACE)
                         or not any(ch.isalnum() or ch == "'" for ch in piece))
    return starts


class BoostPool:
    """The boosting trees of every slot, on the device, and each slot's node: what the greedy pass
    gathers from. Written only at a stream's first step (`load`), by the decode stage. Ids are held
    as float32 beside the bonuses (exact below 2**24), so one gather brings a row's candidates.
    On the CPU the root rows are also held dense, a bonus and a next node per label (HostBoostRows)."""

    def __init__(self, rows: int, limits: BoostLimits, device, starts: np.ndarray):
        """starts: `word_starts` of the model's labels."""
        self.limits, self.device = limits, device
        self.starts = torch.from_numpy(starts.astype(np.float32)).to(device)  # 1 where a word starts
        self.start_mask = torch.where(self.starts > 0, 0.0, NEG_INF)  # to pick the best such label
        self.node = torch.zeros(rows, dtype=torch.long, device=device)
        self.root = torch.zeros(rows, limits.root_width, 3, device=device)  # token, next node, bonus
        self.root[..., 2] = NEG_INF
        self.nodes = torch.zeros(rows * (limits.nodes + 1), 3, device=device)  # arcs from, to; done
        # token, next node, bonus; the last slot's reads of a full arc width stay inside the table
        self.arcs = torch.zeros(rows * limits.arcs + limits.arc_width, 3, device=device)
        self.widths = np.zeros((rows, 2), dtype=np.int64)  # host: root labels, most arcs of a node
        self.root_bonus = self.root_next = None  # on the CPU: each slot's root arcs per label (bonus -inf: none)
        if device.type == "cpu":
            self.root_bonus = np.full((rows, len(starts)), NEG_INF, np.float32)
            self.root_next = np.zeros((rows, len(starts)), np.int64)

    @staticmethod
    def slot_bytes(limits: BoostLimits) -> int:
        """Device memory of one slot's tables: its node, root arcs, nodes and deeper arcs."""
        return 8 + 3 * 4 * (limits.root_width + limits.nodes + 1 + limits.arcs)

    def load(self, slot: int, tree: BoostingTree | None) -> None:
        """The stream starting at `slot` boosts `tree` (None: nothing), from the root."""
        self.node[slot] = 0
        self.root[slot, :, 2] = NEG_INF
        self.widths[slot] = 0
        if self.root_bonus is not None:
            self.root_bonus[slot] = NEG_INF
        if tree is None:
            return
        r, n, a = len(tree.root_token), self.limits.nodes + 1, self.limits.arcs
        self._put(self.root[slot, :r], tree.root_token, tree.root_next, tree.root_value)
        self._put(self.nodes[slot * n : slot * n + tree.nodes], tree.arc_start[:-1], tree.arc_start[1:], tree.done)
        m = len(tree.arc_token)
        self._put(self.arcs[slot * a : slot * a + m], tree.arc_token, tree.arc_next, tree.arc_value)
        self.widths[slot] = (r, tree.width)
        if self.root_bonus is not None:
            self.root_bonus[slot, tree.root_token], self.root_next[slot, tree.root_token] = tree.root_value, tree.root_next

    def rows(self, slots: torch.Tensor, host_slots: list[int] | None = None) -> "BoostRows | None":
        """The boosting of a batch at `slots`: with `host_slots` (eager) only as wide as their trees
        need, None where none has phrases, on the CPU chosen in numpy (HostBoostRows); without, at
        the pool's full widths (fixed shapes)."""
        if host_slots is None:
            return BoostRows(self, slots, self.limits.root_width, self.limits.arc_width)
        host = np.asarray(host_slots, dtype=np.int64)
        widths = self.widths[host]
        if not widths[:, 0].any():
            return None
        if self.root_bonus is not None:
            return HostBoostRows(self, slots, host)
        root_width, arc_width = widths.max(0).tolist()
        return BoostRows(self, slots, root_width, arc_width)

    def _put(self, target: torch.Tensor, *columns: np.ndarray) -> None:
        target.copy_(torch.from_numpy(np.stack(columns, 1).astype(np.float32)), non_blocking=True)


class BoostRows:
    """The boosting of one greedy pass's rows: their root rows gathered once, their nodes carried
    through the pass (`node`, written back with `save`), their deeper arcs gathered at each label.
    The candidates of a row, in this order (where scores tie, the first wins): its node's deeper
    arcs, the root arcs, the model's label, the best word-starting label."""

    def __init__(self, pool: BoostPool, slots: torch.Tensor, root_width: int, arc_width: int):
        self.pool, self.slots = pool, slots
        self.node = pool.node[slots]
        tail = torch.zeros(len(slots), 2, 3, device=slots.device)  # the last two candidates lead to the root
        self.root = torch.cat((pool.root[slots, :root_width], tail), 1)
        self.node_base = slots * (pool.limits.nodes + 1)
        self.arc_base = (slots * pool.limits.arcs).unsqueeze(1)
        self.offsets = torch.arange(arc_width, device=slots.device)

    def choose(self, logits: torch.Tensor, label: torch.Tensor, rows: torch.Tensor | None = None):
        """logits [n, V+1] at the frame where each row emits `label` (the model's argmax, not blank),
        of the pass's rows `rows` (None: all) -> (the label boosting chooses, the node it leads to)."""
        node, node_base, arc_base, root = self.node, self.node_base, self.arc_base, self.root
        if rows is not None:
            node, node_base, arc_base, root = node[rows], node_base[rows], arc_base[rows], root[rows]
        info = self.pool.nodes[node_base + node]  # [n, 3]: its arcs from, to; what it keeps if a word starts
        tree = torch.cat((self._arcs(info, arc_base), root), 1)
        width = tree.size(1) - 2  # the tree's own candidates
        word = (logits + self.pool.start_mask).argmax(1, keepdim=True)
        token = torch.cat((tree[:, :width, 0].long(), label.unsqueeze(1), word), 1)
        scores = logits.gather(1, token) + (tree[..., 2] + info[:, 2:] * self.pool.starts[token])
        best, at = scores.max(1)
        choice = torch.where(best > scores[:, width], at, width).unsqueeze(1)  # ties: the model's own label
        return token.gather(1, choice).squeeze(1), tree[..., 1].gather(1, choice).squeeze(1).long()

    def step(self, logits: torch.Tensor, label: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """choose() for the pass's rows `rows` that emit a label (an eager pass), their nodes moved on."""
        label, self.node[rows] = self.choose(logits, label, rows)
        return label

    def _arcs(self, info: torch.Tensor, arc_base: torch.Tensor) -> torch.Tensor:
        """[n, arc width, 3] the rows' nodes' deeper arcs (bonus -inf past a node's own)."""
        at = info[:, :1].long() + self.offsets
        arcs = self.pool.arcs[arc_base + at]
        arcs[..., 2].masked_fill_(at >= info[:, 1:2], NEG_INF)
        return arcs

    def save(self) -> None:
        """The rows' nodes back into the pool."""
        self.pool.node[self.slots] = self.node


class HostBoostRows(BoostRows):
    """BoostRows for an eager pass on the CPU, where reading a tensor costs no sync: the same choice
    in numpy, in fewer operations. The root arcs come from the pool's dense root rows (the model's
    logits plus each row's root bonuses, one argmax), so where every row is at the root, a call is a
    dozen numpy operations, and where no label changes, the labels are returned as they came; a
    node's deeper arcs and a complete phrase's word-starting label are read only where a row is
    past the root. The same candidates, float32 sums and order of ties as the torch version, so the
    same labels (measured: scripts/phrase_eval.py --cost-only)."""

    def __init__(self, pool: BoostPool, slots: torch.Tensor, host_slots: np.ndarray):
        self.pool, self.slots, self.slot = pool, slots, host_slots
        self.node = pool.node.numpy()[host_slots]
        self.past_root = bool(self.node.any())
        self.value = pool.root_bonus[host_slots]  # [B, V+1] each row's root bonus per label (-inf: none)

    def choose(self, logits: torch.Tensor, label: torch.Tensor, rows: torch.Tensor | None = None):
        rows = np.arange(len(self.slot)) if rows is None else rows.numpy()
        found = self._choose(logits.float().numpy(), label, rows)
        if found is None:
            return label, torch.zeros_like(label)
        return torch.from_numpy(found[0]), torch.from_numpy(found[1])

    def step(self, logits: torch.Tensor, label: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        rows = rows.numpy()
        found = self._choose(logits.float().numpy(), label, rows)
        if found is None:
            return label
        label, self.node[rows] = found
        self.past_root = bool(self.node.any())
        return torch.from_numpy(label)

    def save(self) -> None:
        self.pool.node.numpy()[self.slot] = self.node

    def _choose(self, logits: np.ndarray, label: torch.Tensor, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """[n, V+1] logits, the model's labels (each its row's argmax) and the pass's rows -> (labels,
        nodes); None where every row keeps its label at the root (a row without phrases always does:
        its bonuses are -inf)."""
        if self.past_root and (node := self.node[rows]).any():
            return self._past_root(logits, label.numpy(), rows, node)
        scores = logits + self.value[rows]
        take = scores.max(1) > logits.max(1)  # ties: the model's own label
        if not take.any():
            return None
        at = scores.argmax(1)
        return np.where(take, at, label.numpy()), np.where(take, self.pool.root_next[self.slot[rows], at], 0)

    def _past_root(self, logits, own, rows, node):
        """_choose where some row is past the root: its deeper arcs, and the rows that completed a
        phrase, their bonus on every word-starting label."""
        pool, n, slot = self.pool, np.arange(len(rows)), self.slot[rows]
        first, end, done = pool.nodes.numpy()[slot * (pool.limits.nodes + 1) + node].T
        value, own_score, word = self.value[rows], logits[n, own], None
        if done.any():
            starts = pool.starts.numpy()
            value = value + done[:, None] * starts
            own_score = own_score + done * starts[own]
            word = (logits + pool.start_mask.numpy()).argmax(1)
        scores = logits + value
        at = scores.argmax(1)
        best, token, nxt = scores[n, at], at, pool.root_next[slot, at]
        deep = self._deep(logits, slot, first, end, done)
        if deep is not None:  # the first best: a deeper arc where it ties with the root's
            use = deep[0] >= best
            best, token, nxt = (np.where(use, d, r) for d, r in zip(deep, (best, token, nxt)))
        take = best > own_score
        if word is not None:
            word_score = logits[n, word] + done * pool.starts.numpy()[word]
            to_word = (word_score > best) & (word_score > own_score)
            take, own = take & ~to_word, np.where(to_word, word, own)
        return np.where(take, token, own), np.where(take, nxt, 0)

    def _deep(self, logits, slot, first, end, done):
        """(score, token, next node) of each row's best deeper arc (-inf where none); None: no row has one."""
        width = int((end - first).max())
        if not width:
            return None
        n = np.arange(len(slot))
        at = first.astype(np.int64)[:, None] + np.arange(width)
        arcs = self.pool.arcs.numpy()[(slot * self.pool.limits.arcs)[:, None] + at]
        token, value = arcs[..., 0].astype(np.int64), arcs[..., 2]
        value[at >= end[:, None]] = NEG_INF
        if done.any():
            value = value + done[:, None] * self.pool.starts.numpy()[token]
        scores = logits[n[:, None], token] + value
        k = scores.argmax(1)
        return scores[n, k], token[n, k], arcs[n, k, 1].astype(np.int64)
