"""Key-phrase boosting trees for the beam search (beam.py): each stream's phrases as a boosting tree,
and the pool that holds the tree of every slot on the device and scores, for a batch of hypotheses
at once, what every next label does to their phrase matches.

The tree is a trie over the phrases' tokens with Aho-Corasick failure arcs (as icefall's
ContextGraph and NeMo's GPU phrase boosting). A hypothesis's match is a node: the longest suffix of
what it wrote that is a prefix of one of its phrases. A phrase's token is worth the stream's bonus
per token (the first token FIRST_SHARE of it: a first piece is often a common word start such as
"▁k") plus `prior_loan` of what the model's prior takes from it (below): the search then weighs a
phrase's labels by what the audio says of them rather than by how likely the model finds their
spelling (internal language model subtraction, as in Meng et al. 2021); a node has *earned* the
bonus of its best partial match (the sum along it, or along a shorter suffix match). The context
score of a hypothesis is what it has *banked* plus what its node has earned: a label that continues
a match adds its bonus, one that breaks it falls back along failure arcs and gives back what the
match had earned, so a partial match is only a loan that keeps a started name in the beam.

A phrase is whole words: its reward is banked only when the next label starts a word (a piece with
the word-boundary mark, punctuation, or a control piece such as <EOU>; the end of the stream counts
as one) and does not continue a longer phrase, and only where the model heard it: the
log-probability the model gave the match's labels is at least the match's *need*, `evidence` per label
plus `prior_share` of the model's own prior of those labels without audio (a full match below it
forfeits its loan at once). The prior (the prediction network's internal language model,
GreedyDecoder.label_prior) is what the model expects of the labels whatever it hears: a name spelled
unlike any word it knows gets low probabilities when said too, a phrase made of likely labels gets
high ones where a sound-alike was said, and the need follows both. The reward is what the full match
earned token by token times the phrase's weight: a weight scales what a full match earns, not the
pull of each token. A full match the model heard holds that whole reward as its loan until it is
banked, so the next word is chosen by the audio (were only the bonuses lent, the first word start
after a weighted name would bank the rest, and the search would start any word at once to get it).
A phrase completed right after the same phrase, with no other word between,
banks nothing: a name cannot repeat itself on a bonus (the audio must say it twice).

Layout, for fixed shapes: a node's arcs are its Aho-Corasick transitions that lead deeper than one
token (its children and its fallbacks' children), in CSR form; the transitions into the root's
children (one token matched) are the same from every node, so they are stored once, as the root row.
Where a label has both, the deeper arc is the right one (it is the longer match).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from .tokenizer import SPACE, Tokenizer

NEG_INF = float("-inf")
FIRST_SHARE = 0.5
# A node's row in the pool: its deeper arcs (from, to), the reward of the phrase it completes (itself
# or as a suffix) and that phrase's end node, what it has earned, its depth, the log-probability its
# match's labels need to earn a reward.
ARC_FROM, ARC_TO, DONE, DONE_ID, EARNED, DEPTH, NEED = range(7)
ROW = 7


@dataclass(frozen=True)
class BoostLimits:
    """The pool's capacity per slot: `root_width` labels that start a phrase, `nodes` tree nodes,
    `arcs` deeper arcs in all and `arc_width` from one node (trees past them are refused)."""

    root_width: int
    nodes: int
    arcs: int
    arc_width: int


@dataclass(frozen=True)
class PhrasePath:
    """One phrase as the tree takes it: its tokens, the bonus of each, the reward of a full match as
    a multiple of the bonuses along it (the phrase's weight), the model's prior log-probability of
    each token (GreedyDecoder.label_prior; empty: none), and the share of the prior's loan it
    takes (its weight, where below 1)."""

    tokens: list[int]
    bonus: float
    reward: float = 1.0
    prior: tuple[float, ...] = ()
    pull: float = 1.0


class BoostingTree:
    """One stream's phrases, built on the host once: root row, node rows and CSR arcs as numpy arrays."""

    def __init__(self, phrases: list[PhrasePath], limits: BoostLimits, evidence: float = NEG_INF,
                 prior_share: float = 0.0, prior_loan: float = 0.0):
        """evidence: the log-probability per label a match needs, plus `prior_share` of its labels'
        prior; prior_loan: the share of a label's prior (negated) its loan adds to the bonus, so a
        label the model expects little without audio is pulled more. ValueError where the tree
        exceeds `limits`."""
        children, bonus, fail, ends, prior = _trie(phrases, prior_loan)
        if len(children) > limits.nodes:
            raise ValueError(f"the phrases make {len(children)} tree nodes: at most {limits.nodes}")
        if len(children[0]) > limits.root_width:
            raise ValueError(f"the phrases start with {len(children[0])} different tokens: at most {limits.root_width}")
        earned, done, done_id, depth, order = _earned(children, bonus, fail, ends)
        root = sorted(children[0].items())
        self.root_token = np.array([k for k, _ in root], dtype=np.int32)
        self.root_next = np.array([n for _, n in root], dtype=np.int32)
        self.root_value = np.array([earned[n] for _, n in root], dtype=np.float32)
        self.arc_start, self.arc_token, self.arc_next = _deep_arcs(children, fail, order)
        self.arc_value = earned[self.arc_next]
        self.earned, self.done, self.done_id, self.depth = earned, done, done_id, depth
        self.need = np.where(depth > 0, evidence * depth.clip(min=1) + prior_share * prior, NEG_INF).astype(np.float32)
        self.width = int(np.diff(self.arc_start).max(initial=0))
        if len(self.arc_token) > limits.arcs or self.width > limits.arc_width:
            raise ValueError("the phrases overlap too much to be boosted together")

    @property
    def nodes(self) -> int:
        return len(self.arc_start) - 1

    def node_rows(self) -> np.ndarray:
        """[nodes, ROW] float32: each node's row in the pool (ARC_FROM ... NEED)."""
        return np.stack([self.arc_start[:-1], self.arc_start[1:], self.done, self.done_id, self.earned,
                         self.depth, self.need], 1).astype(np.float32)


def _trie(phrases: list[PhrasePath], prior_loan: float = 0.0):
    """children per node (token -> node; node 0 the root), the bonus of the arc into each node, each
    node's failure arc (its longest proper suffix in the trie), the reward factor of each node
    that ends a phrase (the largest where phrases end at the same node), and each node's prior (the
    sum of its path's token priors)."""
    children: list[dict[int, int]] = [{}]
    bonus, prior = [0.0], [0.0]
    ends: dict[int, float] = {}
    for phrase in phrases:
        node = 0
        for depth, token in enumerate(phrase.tokens):
            if token not in children[node]:
                children[node][token] = len(children)
                children.append({})
                bonus.append(0.0)
                prior.append(prior[node] + (phrase.prior[depth] if phrase.prior else 0.0))
            node = children[node][token]
            extra = -prior_loan * phrase.pull * phrase.prior[depth] if phrase.prior else 0.0
            bonus[node] = max(bonus[node], phrase.bonus * (FIRST_SHARE if depth == 0 else 1.0) + extra)
        ends[node] = max(ends.get(node, 0.0), phrase.reward)
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
    return children, bonus, fail, ends, np.array(prior, dtype=np.float64)


def _earned(children, bonus, fail, ends):
    """What each node has earned (its path's bonus, or its best suffix match's), the reward of the
    phrase it completes (itself, else as a suffix) and that phrase's end node, its depth, and the
    breadth-first order of the nodes (failure arcs point back in it)."""
    order, queue = [0], deque([0])
    n = len(children)
    path, earned, done = (np.zeros(n, dtype=np.float32) for _ in range(3))
    done_id, depth = np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int32)
    while queue:
        node = queue.popleft()
        for child in children[node].values():
            path[child] = path[node] + bonus[child]
            depth[child] = depth[node] + 1
            earned[child] = max(path[child], earned[fail[child]])
            if child in ends:
                done[child], done_id[child] = path[child] * ends[child], child
            else:
                done[child], done_id[child] = done[fail[child]], done_id[fail[child]]
            order.append(child)
            queue.append(child)
    return earned, done, done_id, depth, order


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


@dataclass
class Matches:
    """Hypotheses' phrase matches, one entry per hypothesis: the tree node, the reward banked, the
    end node of the phrase banked last (-1: a word outside the phrases came since), and the model's
    log-probability of the labels of the open match (its acoustic evidence)."""

    node: torch.Tensor  # long
    banked: torch.Tensor  # float32
    last: torch.Tensor  # long
    heard: torch.Tensor  # float32


@dataclass
class Expansion:
    """What each next label does to a batch of hypotheses' matches ([n, labels] each): the context
    score after it, and the matches it leads to."""

    after: torch.Tensor
    node: torch.Tensor
    banked: torch.Tensor
    last: torch.Tensor
    heard: torch.Tensor


class BoostPool:
    """The boosting trees of every slot on the device: what the beam search gathers from. Written
    only at a stream's first step (`load`), by the decode stage; ids are held as float32 beside the
    bonuses (exact below 2**24), so one gather brings a row."""

    def __init__(self, rows: int, limits: BoostLimits, device, starts: np.ndarray):
        """starts: `word_starts` of the model's labels (blank last)."""
        self.limits, self.device = limits, device
        self.starts = torch.from_numpy(starts).to(device)
        self.blank = len(starts) - 1
        self.root = torch.zeros(rows, limits.root_width, 3, device=device)  # token, next node, earned
        self.root[..., 0] = self.blank  # an empty entry: blank's column, which no label reads
        self.nodes = torch.zeros(rows * (limits.nodes + 1), ROW, device=device)
        # token, next node, earned; the last slot's reads of a full arc width stay inside the table
        self.arcs = torch.zeros(rows * limits.arcs + limits.arc_width, 3, device=device)
        self.widths = np.zeros((rows, 2), dtype=np.int64)  # host: root labels, most arcs of a node

    @staticmethod
    def slot_bytes(limits: BoostLimits) -> int:
        """Device memory of one slot's tables: its root arcs, nodes and deeper arcs."""
        return 4 * (3 * limits.root_width + ROW * (limits.nodes + 1) + 3 * limits.arcs)

    def load(self, slot: int, tree: BoostingTree | None) -> None:
        """The stream starting at `slot` boosts `tree` (None: nothing)."""
        self.root[slot] = 0
        self.root[slot, :, 0] = self.blank
        self.widths[slot] = 0
        if tree is None:
            return
        r, n, a = len(tree.root_token), self.limits.nodes + 1, self.limits.arcs
        self._put(self.root[slot, :r], np.stack([tree.root_token, tree.root_next, tree.root_value], 1))
        self._put(self.nodes[slot * n : slot * n + tree.nodes], tree.node_rows())
        m = len(tree.arc_token)
        self._put(self.arcs[slot * a : slot * a + m], np.stack([tree.arc_token, tree.arc_next, tree.arc_value], 1))
        self.widths[slot] = (r, tree.width)

    def has_phrases(self, slots: list[int]) -> np.ndarray:
        """[len(slots)] bool: the slots whose stream boosts phrases."""
        return self.widths[slots, 0] > 0

    def expand(self, slots: torch.Tensor, matches: Matches, logp: torch.Tensor,
               widths: tuple[int, int] | None = None) -> Expansion:
        """Every label's effect on hypotheses of the streams at `slots` (one entry per hypothesis)
        with `matches`, the model's log-probabilities of the labels `logp` [n, labels]; `widths`
        (root, arcs) read per row (None: the pool's full widths, fixed shapes)."""
        root_width, arc_width = widths or (self.limits.root_width, self.limits.arc_width)
        n, labels = len(slots), len(self.starts)
        base = slots * (self.limits.nodes + 1)
        info = self.nodes[base + matches.node]
        value = torch.zeros(n, labels, device=slots.device)
        node = torch.zeros(n, labels, dtype=torch.long, device=slots.device)
        root = self.root[slots, :root_width]
        self._scatter(value, node, root)
        if arc_width:
            at = info[:, ARC_FROM : ARC_FROM + 1].long() + torch.arange(arc_width, device=slots.device)
            arcs = self.arcs[(slots * self.limits.arcs).unsqueeze(1) + at]
            arcs[..., 0].masked_fill_(at >= info[:, ARC_TO : ARC_TO + 1], self.blank)
            self._scatter(value, node, arcs)  # after the root arcs: the deeper match wins
        reached = self.nodes[base.unsqueeze(1) + node]  # [n, labels, ROW]
        depth = reached[..., DEPTH]
        deeper = depth == info[:, DEPTH : DEPTH + 1] + 1
        heard = torch.where(deeper, matches.heard.unsqueeze(1) + logp, torch.where(depth > 0, logp * depth, 0.0))
        complete = (reached[..., DONE_ID].long() == node) & (node > 0)
        last = matches.last.unsqueeze(1)
        # a phrase completed with labels the model heard holds its whole reward from then on (its
        # weight's share too), so the word that follows it is chosen by the audio, not rushed to bank
        # the reward; one the model did not hear forfeits its loan at once (else a hypothesis would
        # hold it by writing nothing more); a repeat right after itself holds no more than it earned
        unheard = heard < reached[..., NEED]
        value = torch.where(complete & unheard, 0.0, value)
        value = torch.where(complete & ~unheard & (node != last), reached[..., DONE], value)
        done, done_id = info[:, DONE : DONE + 1], info[:, DONE_ID : DONE_ID + 1].long()
        bank = self.starts & (done > 0) & (done_id != last) & ~deeper & self._heard(matches, info).unsqueeze(1)
        banked = matches.banked.unsqueeze(1) + torch.where(bank, done, 0.0)
        outside = self.starts & (node == 0)  # a word outside the phrases
        last = torch.where(bank, done_id, torch.where(outside, -1, last))
        return Expansion(banked + value, node, banked, last, heard)

    def final(self, slots: torch.Tensor, matches: Matches) -> torch.Tensor:
        """[n] hypotheses' context score as it would be at the end of their stream: what they banked
        and the phrase they complete (the end counts as a word start), without the loan of a
        partial match."""
        info = self.nodes[slots * (self.limits.nodes + 1) + matches.node]
        bank = (info[:, DONE] > 0) & (info[:, DONE_ID].long() != matches.last) & self._heard(matches, info)
        return matches.banked + torch.where(bank, info[:, DONE], 0.0)

    def _heard(self, matches: Matches, info: torch.Tensor) -> torch.Tensor:
        """[n] whether the open match's labels are likely enough to earn its reward."""
        return matches.heard >= info[:, NEED]

    def _scatter(self, value: torch.Tensor, node: torch.Tensor, arcs: torch.Tensor) -> None:
        token = arcs[..., 0].long()
        value.scatter_(1, token, arcs[..., 2])
        node.scatter_(1, token, arcs[..., 1].long())

    def _put(self, target: torch.Tensor, rows: np.ndarray) -> None:
        target.copy_(torch.from_numpy(rows.astype(np.float32)), non_blocking=True)
