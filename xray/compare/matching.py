"""Which entries of two dumps match: unique anchors first, then a weighted LCS in the gaps.

Like patience diff: entries whose anchor key (group, module path, op or call index, output shapes)
occurs exactly once on each side are matched first, keeping the longest chain that is in order on
both sides. The gaps between anchors are aligned by dynamic programming on a similarity score
(op, shapes, dtypes, module-path similarity from rapidfuzz), row-vectorised with numpy and done in
overlapping windows when a gap is large, so the whole stays near-linear. Never a positional zip.

Two calls pair only if they play one role: where both read values of recorded calls that are
matched, they must share one such producer (``Roles``). De-dup makes this needed: a signature
includes dtypes, so one side may fold two calls of a module into one record (fp32: both residual
adds of a parallel-residual block) where the other keeps both (bf16 autocast); op, shape and path
cannot say which of the two the record stands for, its data edges can. Where a call's non-tensor
arguments tell it from its twins (the two strided slices of a rotary half, start 0 and start 1),
they name its role as directly, and overrule producers whose own pairing, among de-dup's records
of a key, may be the wrong twin's (``told_apart``).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np
from rapidfuzz import fuzz
from rapidfuzz.process import cdist

from ..numerics.kernel_families import kind_of, primary_shapes
from ..dump.columns import INPUT, SRC_OP
from ..ops.rebuild import is_pointwise_op
from .entry_table import MODULE, Codes, EntryTable

WINDOW = 1000  # entries per side per DP window: 1M cells, ~10 ms of numpy per window
MAX_CELLS = 2_500_000  # a gap smaller than this is aligned in one DP
CLASS_SIMILARITY = 80.0  # rapidfuzz ratio above which two module classes count as renamed twins


def op_base(op: str) -> str:
    """``aten.add_.Tensor`` and ``aten.add.Scalar`` -> ``aten.add``; module classes lower-cased;
    members of one kernel family (kernel_families.py) -> that family."""
    family = kind_of(op)
    if family is not None:
        return family
    parts = op.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "quantized") or len(parts) == 3:
        return f"{parts[0]}.{parts[1].rstrip('_')}"
    return op.lower()


class Features:
    """Integer codes of each entry's features, so score matrices are numpy comparisons.

    Codes mean only equality, within one feature, across both sides (built from two
    EntryTables by ``align_tables``). ``paths`` and ``ops`` are lists of texts (the fuzzy
    scorer's input)."""

    @classmethod
    def of_arrays(cls, **features) -> "Features":
        f = cls.__new__(cls)
        f.__dict__.update(features)
        return f


PRODUCERS = 4  # producers kept per entry (its first tensor inputs'): enough to tell roles apart
ROLE_BONUS = 2.0  # a pair that shares a producer; as much as an equal module path
ROLE_ROUNDS = 3  # alignments redone with roles at most
ARGS_BONUS = 2.0  # equal non-tensor arguments; as much as an equal module path


def told_apart(f: "Features", window: slice) -> np.ndarray:
    """Per entry of ``window``: whether a twin in it (same op and output shape) has other
    non-tensor arguments, so that the arguments themselves say which call this is."""
    op, shape, args = f.op[window], f.shape[window], f.args[window]
    if not len(op):
        return np.zeros(0, dtype=bool)
    twins = np.unique(np.stack([op, shape]), axis=1, return_inverse=True)[1].reshape(-1)
    calls = np.unique(np.stack([op, shape, args]), axis=1, return_inverse=True)[1].reshape(-1)
    kinds = np.bincount(twins[np.unique(calls, return_index=True)[1]], minlength=twins.max() + 1)
    return kinds[twins] > 1


class Roles:
    """The recorded producers of each entry's tensor inputs, by argument position, as entry
    positions of the other side.

    ``bench``: per bench entry, the target partners (from a first alignment) of the recorded calls
    its inputs came from; ``target``: per target entry, the recorded, matched calls its inputs
    came from (-1: none known at that position: an input no op made, a parameter, or one made by
    a folded call; an unmatched producer, such as a cast only one side inserts, is looked through
    to its own: ``_through_unmatched``). A pair is refused only on evidence: where both sides know
    the producers of some arguments and, over those arguments, share none, the two calls read
    other values (other roles). De-dup leaves each side knowing other arguments (the bench its
    query's producer, the target its value's): that is no evidence."""

    def __init__(self, bench: np.ndarray, target: np.ndarray, bench_terms: np.ndarray | None = None,
                 target_terms: np.ndarray | None = None) -> None:
        self.bench, self.target = bench, target
        self.bench_terms = bench if bench_terms is None else bench_terms
        self.target_terms = target if target_terms is None else target_terms
        self.wide_a, self.wide_b = _wider(bench, self.bench_terms), _wider(target, self.target_terms)

    def relation(self, ia, ib, pairwise: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(shared, refused): a matrix over bench rows ``ia`` x target rows ``ib``, or with
        ``pairwise`` one value per pair (``ia[k]``, ``ib[k]``). Producers are compared as sets
        (an add's arguments may come in either order); refusal reads only the positions both
        sides know, and every term an unmatched producer read (``*_terms``): a sum only one
        side forms (a residual the other left out) reads both roles, so the norm after it may
        play either's. Those terms are read only for the entries that have them."""
        shared, refused = _shared(self.bench[ia], self.target[ib], pairwise, 1, 1)
        wa, wb = self.wide_a[ia], self.wide_b[ib]
        if not (wa.any() or wb.any()):
            return shared, refused
        ta, tb = self.bench_terms[ia], self.target_terms[ib]
        ga, gb = ta.shape[-1] // self.bench.shape[-1], tb.shape[-1] // self.target.shape[-1]
        if pairwise:
            at = np.flatnonzero(refused & (wa | wb))
            refused[at] = _shared(ta[at], tb[at], True, ga, gb)[1]
            return shared, refused
        rows, cols = np.flatnonzero(wa), np.flatnonzero(wb)
        refused[rows] = _shared(ta[rows], tb, False, ga, gb)[1]
        refused[:, cols] = _shared(ta, tb[cols], False, ga, gb)[1]
        return shared, refused


def _wider(narrow: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """Per entry: whether its every-term producers say more than its looked-through ones."""
    t = terms.reshape(len(narrow), narrow.shape[1], terms.shape[-1] // narrow.shape[1])
    return ((t[:, :, 0] != narrow) | (t[:, :, 1:] >= 0).any(-1)).any(-1)


def _shared(a: np.ndarray, b: np.ndarray, pairwise: bool, ga: int, gb: int) -> tuple[np.ndarray, np.ndarray]:
    """(shared, refused) over rows of ``a`` x rows of ``b`` (or pairwise). Each holds argument
    positions of ``ga`` (``gb``) columns each (every term an unmatched producer read), compared
    as sets; refusal reads the positions both sides know. Columns no row knows are skipped."""
    a, pa, known_a = _known(a, ga)
    b, pb, known_b = _known(b, gb)
    if not pairwise:
        a, b, known_a, known_b = a[:, None, :], b[None, :, :], known_a[:, None, :], known_b[None, :, :]
    both = known_a & known_b  # per argument position
    shared = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), dtype=bool)
    shared_known = shared.copy()
    for k, i in enumerate(pa.tolist()):
        for m, j in enumerate(pb.tolist()):
            same = (a[..., k] >= 0) & (a[..., k] == b[..., m])
            shared |= same
            shared_known |= same & both[..., i] & both[..., j]
    return shared, both.any(-1) & ~shared_known


def _known(a: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(the columns some row knows, their argument positions, known per row and position)."""
    some = a >= 0
    known = some.reshape(*a.shape[:-1], a.shape[-1] // group, group).any(-1)
    keep = some.reshape(-1, a.shape[-1]).any(0)
    return a[..., keep], (np.arange(a.shape[-1]) // group)[keep], known


def producers(t: EntryTable) -> np.ndarray:
    """(entries x PRODUCERS): per op entry, the position of the recorded op entry whose output
    its j-th tensor input reads, -1 where none is known (a parameter, a model input, a call de-dup
    folded: its seq has no record) or past its PRODUCERS first inputs."""
    out = np.full((len(t), PRODUCERS), -1, dtype=np.int64)
    tensors = t.columns.tensors
    rows = np.flatnonzero(tensors["role"] == INPUT)
    if not len(rows) or not len(t):
        return out
    entry_of_row = np.full(len(t.columns.records), -1, dtype=np.int64)
    entry_of_row[t.row] = np.arange(len(t))
    consumer = entry_of_row[tensors["record"][rows]]
    order = np.argsort(t.seq, kind="stable")
    sorted_seq = t.seq[order]
    at = np.minimum(np.searchsorted(sorted_seq, tensors["src_seq"][rows]), len(t) - 1)
    found = (sorted_seq[at] == tensors["src_seq"][rows]) & (tensors["src_kind"][rows] == SRC_OP)
    producer = np.where(found, order[at], -1)
    keep = consumer >= 0
    consumer, producer = consumer[keep], producer[keep]
    keep = t.kind[consumer] != MODULE
    consumer, producer = consumer[keep], producer[keep]
    if not len(consumer):
        return out
    producer = np.where((producer >= 0) & (t.kind[np.maximum(producer, 0)] != MODULE), producer, -1)
    by = np.argsort(consumer, kind="stable")
    consumer, producer = consumer[by], producer[by]
    first = np.searchsorted(consumer, consumer)  # each consumer's first row
    position = np.arange(len(consumer)) - first
    keep = position < PRODUCERS
    out[consumer[keep], position[keep]] = producer[keep]
    return out


LINEAGE_HOPS = 4  # unmatched producers looked through, at most, to a matched one


def _first_known(prod: np.ndarray) -> np.ndarray:
    """Per entry, its first known producer (-1: none); index -1 reads -1."""
    known = prod >= 0
    first = np.where(known.any(-1), prod[np.arange(len(prod)), known.argmax(-1)], -1)
    return np.append(first, -1)


def _through_unmatched(prod: np.ndarray, matched: np.ndarray) -> np.ndarray:
    """``prod`` with each unmatched producer replaced by its own first known producer, up to
    LINEAGE_HOPS times, then -1 where still unmatched. A call only one side runs (a cast autocast
    inserts; a sum the other side folded into a record of its twin) passes its input's role on:
    the bf16 target's second gradient sum, kept apart while the fp32 bench folds it, still reads
    the key's gradient, not the value's. ``matched`` has one extra False at index -1."""
    first = _first_known(prod)
    out = prod.copy()
    for _ in range(LINEAGE_HOPS):
        unmatched = (out >= 0) & ~matched[out]
        if not unmatched.any():
            break
        out[unmatched] = first[out[unmatched]]
    return np.where(matched[out], out, -1)


def _every_term(prod: np.ndarray, matched: np.ndarray, pointwise: np.ndarray) -> np.ndarray:
    """(entries x PRODUCERS**2): per producer position, the producer as ``_through_unmatched``
    has it, or, where that is an unmatched pointwise op (torch's tag: each output element made
    from its terms' elements at its position), every producer it read, each looked through
    alike. A sum carries each term's role; an attention carries its query's, as the first."""
    narrow = _through_unmatched(prod, matched)
    through = np.append(narrow, np.full((1, prod.shape[1]), -1), axis=0)
    out = np.full((len(prod), prod.shape[1], prod.shape[1]), -1, dtype=np.int64)
    out[:, :, 0] = narrow
    summed = (prod >= 0) & ~matched[prod] & pointwise[prod]
    out[summed] = through[prod[summed]]
    return out.reshape(len(prod), prod.shape[1] ** 2)


def roles(prod_a: np.ndarray, prod_b: np.ndarray, pa: np.ndarray, pb: np.ndarray,
          pointwise_a: np.ndarray | None = None, pointwise_b: np.ndarray | None = None) -> Roles:
    """Roles after a first alignment (``pa[k]`` paired with ``pb[k]``); ``pointwise_*``: per
    entry, whether its op is pointwise (``_every_term``; None: no entry is)."""
    pointwise_a = np.zeros(len(prod_a), dtype=bool) if pointwise_a is None else pointwise_a
    pointwise_b = np.zeros(len(prod_b), dtype=bool) if pointwise_b is None else pointwise_b
    partner = np.full(len(prod_a) + 1, -1, dtype=np.int64)  # index -1 (no producer) reads -1
    partner[pa] = pb
    matched_a = np.zeros(len(prod_a) + 1, dtype=bool)
    matched_a[pa] = True
    matched_b = np.zeros(len(prod_b) + 1, dtype=bool)
    matched_b[pb] = True
    return Roles(partner[_through_unmatched(prod_a, matched_a)], _through_unmatched(prod_b, matched_b),
                 partner[_every_term(prod_a, matched_a, pointwise_a)], _every_term(prod_b, matched_b, pointwise_b))


def score_matrix(fa: Features, ia: slice, fb: Features, ib: slice, role: Roles | None = None) -> np.ndarray:
    """Similarity of every pair in two windows; <= 0 means the pair may not match. With
    ``role``, a pair reading other recorded values may not match, and one sharing them scores more."""
    def eq(x, y):
        return x[ia][:, None] == y[ib][None, :]

    group = eq(fa.group, fb.group)
    op_eq, base_eq, path_eq = eq(fa.op, fb.op), eq(fa.base, fb.base), eq(fa.path, fb.path)
    mod = fa.module[ia][:, None] & fb.module[ib][None, :]
    path_sim = cdist(fa.paths[ia], fb.paths[ib], scorer=fuzz.ratio, dtype=np.float32) / 100.0
    op_ok = op_eq | base_eq
    if mod.any():
        cls_sim = cdist(fa.ops[ia], fb.ops[ib], scorer=fuzz.ratio, dtype=np.float32) >= CLASS_SIMILARITY
        op_ok |= mod & (path_eq | cls_sim)
    numel_eq = eq(fa.numel, fb.numel)
    perm_eq = eq(fa.perm, fb.perm)
    # Ops pair only when their output shapes are equal or permuted: a view (8,32,16) and one
    # (2,4,16,32) hold the same count but are different tensors.
    ok = group & op_ok & (perm_eq | (mod & path_eq))
    args_eq = eq(fa.args, fb.args)
    score = (8.0 * op_eq + 4.0 * (op_ok & ~op_eq) + 4.0 * eq(fa.shape, fb.shape) + 2.0 * perm_eq
             + 1.0 * numel_eq + 1.0 * eq(fa.dtype, fb.dtype) + 2.0 * path_eq + 2.0 * path_sim
             + ARGS_BONUS * args_eq)
    if role is not None:
        shared, refused = role.relation(ia, ib)
        named = args_eq & op_eq & told_apart(fa, ia)[:, None] & told_apart(fb, ib)[None, :]
        ok &= ~refused | named
        score = score + ROLE_BONUS * shared
    return np.where(ok, score, -1.0)


def lcs_weighted(score: np.ndarray) -> list[tuple[int, int]]:
    """Maximum-weight monotone matching (pairs with score > 0), gap cost zero."""
    m, n = score.shape
    h = np.zeros((m + 1, n + 1))
    gain = np.where(score > 0, score, -np.inf)
    for i in range(1, m + 1):
        row = np.maximum(h[i - 1, 1:], h[i - 1, :-1] + gain[i - 1])
        h[i, 1:] = np.maximum.accumulate(row)
    pairs = []
    i, j = m, n
    while i > 0 and j > 0:
        if h[i, j] == h[i - 1, j]:
            i -= 1
        elif h[i, j] == h[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i -= 1
            j -= 1
    pairs.reverse()
    return pairs


def _longest_increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest chain of pairs increasing on both sides (pairs sorted by the first)."""
    tails: list[int] = []
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        p = bisect.bisect_left(tails, j)
        if p == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[p], tail_idx[p] = j, k
        prev[k] = tail_idx[p - 1] if p > 0 else -1
    chain, k = [], tail_idx[-1] if tail_idx else -1
    while k >= 0:
        chain.append(pairs[k])
        k = prev[k]
    return chain[::-1]


@dataclass
class Alignment:
    """Matched (bench_pos, target_pos) pairs, increasing on both sides."""

    pairs: list[tuple[int, int]]
    anchors: int


def align_features(fa: Features, fb: Features, keys_a: list, keys_b: list, role: Roles | None = None) -> Alignment:
    """Anchors from the keys (hashable, equal across sides when the anchor keys are), then the
    gaps by score; the entries are seen only through their features (and ``role``'s producers:
    an anchor it refuses is no anchor)."""
    anchors = _anchors(keys_a, keys_b)
    if role is not None and anchors:
        ia, ib = (np.array(x, dtype=np.int64) for x in zip(*anchors))
        refused = role.relation(ia, ib, pairwise=True)[1]
        anchors = [a for a, no in zip(anchors, refused.tolist()) if not no]
    pairs: list[tuple[int, int]] = []
    prev = (-1, -1)
    for a in anchors + [(len(keys_a), len(keys_b))]:
        pairs += _fill(fa, prev[0] + 1, a[0], fb, prev[1] + 1, a[1], role)
        if a[0] < len(keys_a):
            pairs.append(a)
        prev = a
    return Alignment(pairs, len(anchors))


def _anchors(keys_a: list[tuple], keys_b: list[tuple]) -> list[tuple[int, int]]:
    """Entries whose anchor key is unique on both sides, matched, kept in increasing order."""
    def unique(keys):
        seen: dict = {}
        for pos, k in enumerate(keys):
            seen[k] = -1 if k in seen else pos
        return {k: v for k, v in seen.items() if v >= 0}

    ua, ub = unique(keys_a), unique(keys_b)
    # Equal anchor keys already mean same group, path, shapes and op: every candidate scores > 0.
    return _longest_increasing(sorted((i, ub[k]) for k, i in ua.items() if k in ub))


def _fill(fa: Features, i0: int, i1: int, fb: Features, j0: int, j1: int,
          role: Roles | None = None) -> list[tuple[int, int]]:
    """Align bench[i0:i1] with target[j0:j1] (a gap between anchors)."""
    if i1 <= i0 or j1 <= j0:
        return []
    if (i1 - i0) * (j1 - j0) <= MAX_CELLS:
        return [(i0 + a, j0 + b) for a, b in lcs_weighted(score_matrix(fa, slice(i0, i1), fb, slice(j0, j1), role))]
    out: list[tuple[int, int]] = []
    i, j = i0, j0
    while i < i1 and j < j1:
        ie, je = min(i + WINDOW, i1), min(j + WINDOW, j1)
        local = lcs_weighted(score_matrix(fa, slice(i, ie), fb, slice(j, je), role))
        if ie == i1 and je == j1:
            out += [(i + a, j + b) for a, b in local]
            break
        # Keep the first half of the window's path; the rest is redone with more context.
        keep = [(i + a, j + b) for a, b in local if a < WINDOW // 2 and b < WINDOW // 2]
        if keep:
            out += keep
            i, j = keep[-1][0] + 1, keep[-1][1] + 1
        else:
            i, j = i + WINDOW // 2, j + WINDOW // 2
    return out


def _pointwise(t: EntryTable) -> np.ndarray:
    """Per entry, whether its op is pointwise (looked up once per op)."""
    _, first, inverse = np.unique(t.op, return_index=True, return_inverse=True)
    return np.array([is_pointwise_op(o) for o in t.op_text[first].tolist()], dtype=bool)[inverse.reshape(-1)]


def _to_closer_twins(pairs: np.ndarray, feats: list[Features], prods: tuple[np.ndarray, np.ndarray],
                     pointwise: list[np.ndarray]) -> np.ndarray:
    """``pairs`` with each pair moved, on either side, to an unmatched twin of its entry (same
    group, module path, op and shape; no matched entry between the two) that reads strictly
    more of its partner's recorded values, each counted once. Op, shape and path cannot tell a
    sum's two adds apart when one side leaves a term out (``a + b + c`` run as ``b + c``); what
    they read can, once the pair's own entry is looked through as the sum it may be
    (``_every_term``): the bench's second add reads ``b`` and ``c`` through the first, the first
    reads ``b`` alone."""
    for side in (0, 1):
        pairs = _closer_on_one_side(pairs, side, feats, prods, pointwise)
    return pairs


def _closer_on_one_side(pairs: np.ndarray, side: int, feats: list[Features], prods: tuple[np.ndarray, np.ndarray],
                        pointwise: list[np.ndarray]) -> np.ndarray:
    f, mine = feats[side], pairs[:, side]
    if not len(mine) or len(mine) == len(f.op):
        return pairs
    key = np.stack([f.group, f.path, f.op, f.shape], axis=1)
    free = np.setdiff1d(np.arange(len(f.op)), mine)
    after = np.searchsorted(mine, free)  # mine[after - 1] < free < mine[after]
    twins: dict[int, list[int]] = {}  # pair -> its entry's unmatched twins, no matched entry between
    for k in (after - 1, after):
        inside = (k >= 0) & (k < len(mine))
        twin = inside & (key[free] == key[mine[np.clip(k, 0, len(mine) - 1)]]).all(axis=1)
        for k_, u in zip(k[twin].tolist(), free[twin].tolist()):
            twins.setdefault(k_, []).append(u)
    if not twins:
        return pairs
    keep = np.setdiff1d(np.arange(len(pairs)), list(twins))
    role = roles(*prods, pairs[keep, 0], pairs[keep, 1], *pointwise)
    terms = (role.bench_terms, role.target_terms)

    def values(x: np.ndarray) -> set:  # the distinct recorded values an entry reads
        return set(x[x >= 0].tolist())

    out, taken = pairs.copy(), set()
    for k, free_twins in twins.items():
        partner = values(terms[1 - side][int(pairs[k, 1 - side])])
        most = len(values(terms[side][int(mine[k])]) & partner)
        for u in free_twins:
            n = len(values(terms[side][u]) & partner) if u not in taken else -1
            if n > most:
                out[k, side], most = u, n
        taken.add(int(out[k, side]))
    return out


def _same_structure(ta: EntryTable, tb: EntryTable) -> bool:
    """Equal anchor keys and ops, entry for entry (the same model on both sides): nothing to search."""
    if len(ta) != len(tb) or len(ta.out) != len(tb.out):
        return False
    return bool(np.array_equal(ta.group, tb.group) and np.array_equal(ta.path, tb.path)
                and np.array_equal(ta.op, tb.op) and np.array_equal(ta.n_out, tb.n_out)
                and np.array_equal(ta.ident(), tb.ident()) and np.array_equal(ta.out_shape, tb.out_shape))


def align_tables(ta: EntryTable, tb: EntryTable, codes: Codes) -> tuple[np.ndarray, np.ndarray, int]:
    """Match two tables' entries: anchors, then the gaps by score, from the arrays. Returns the
    matched (bench, target) positions as two arrays, increasing on both sides, and the number of
    anchors."""
    if _same_structure(ta, tb):
        return np.arange(len(ta), dtype=np.int32), np.arange(len(tb), dtype=np.int32), len(ta)
    keys, feats = [], []
    perm_of = codes.lut("shape", lambda v: codes.code("perm", tuple(sorted(v))), np.int64)
    numel_of = codes.lut("shape", math.prod)
    for t in (ta, tb):
        ops = t.op_text.tolist()

        def primary(values: np.ndarray) -> list[tuple]:  # a kernel family's shared outputs only
            return [primary_shapes(o, v) for o, v in zip(ops, t.per_entry(values))]

        shapes = [codes.code("shapes", s) for s in t.per_entry(t.out_shape)]
        keys.append(list(zip(t.group.tolist(), t.path.tolist(), t.ident().tolist(), shapes)))
        feats.append(Features.of_arrays(
            group=t.group, op=t.op, path=t.path,
            shape=np.array([codes.code("shapes", s) for s in primary(t.out_shape)], dtype=np.int64),
            base=np.array([codes.code("base", op_base(o)) for o in ops], dtype=np.int64),
            perm=np.array([codes.code("perms", p) for p in primary(perm_of[t.out_shape])], dtype=np.int64),
            numel=np.array([codes.code("numels", n) for n in primary(numel_of[t.out_shape])], dtype=np.int64),
            dtype=np.array([codes.code("dtypes", d) for d in primary(t.out_dtype)], dtype=np.int64),
            args=t.args, module=t.kind == MODULE, paths=t.path_text.tolist(), ops=t.op_text.tolist()))
    alignment = align_features(feats[0], feats[1], keys[0], keys[1])
    pairs = np.array(alignment.pairs, dtype=np.int64).reshape(-1, 2)
    # Roles: a pair whose calls read other recorded values (a record that stands for another call
    # of its module) sends the alignment round again, with the roles its pairs give, until every
    # pair agrees with the pairs of its producers (a round or two; a few at most).
    prod_a, prod_b = producers(ta), producers(tb)
    pointwise = [_pointwise(t) for t in (ta, tb)]
    pairs = _to_closer_twins(pairs, feats, (prod_a, prod_b), pointwise)
    for _ in range(ROLE_ROUNDS):
        role = roles(prod_a, prod_b, pairs[:, 0], pairs[:, 1], *pointwise)
        if not len(pairs) or not role.relation(pairs[:, 0], pairs[:, 1], pairwise=True)[1].any():
            break
        alignment = align_features(feats[0], feats[1], keys[0], keys[1], role)
        pairs = _to_closer_twins(np.array(alignment.pairs, dtype=np.int64).reshape(-1, 2), feats,
                                 (prod_a, prod_b), pointwise)
    return pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32), alignment.anchors
