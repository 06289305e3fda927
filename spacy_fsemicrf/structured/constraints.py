"""Declarative constraints on a decoded segmentation: plain data, parsing, and compiled form.

Kinds (the dict form is how they appear in a config or in ``doc.user_data``):

====================  =====================================================================
``at_most``           ``{"kind": "at_most", "label": "ORG", "n": 1, "scope": "doc"}``: at
                      most ``n`` entities of the label per document (or per sentence)
``exactly``           the same with exactly ``n``
``at_least``          the same with at least ``n``
``excludes``          ``{"kind": "excludes", "label": "X", "other": "Y", "scope": "doc"}``:
                      never an X and a Y in the same document (or sentence)
``requires``          ``{"kind": "requires", "label": "X", "other": "Y", "scope": "doc"}``:
                      an X needs a Y in the same document (or sentence)
``forbid_labels``     ``{"kind": "forbid_labels", "labels": ["ORG"], "start": 3, "end": 5}``:
                      no entity of these labels (all labels when ``labels`` is left out)
                      covers a token of ``start..end - 1`` (the whole document when
                      ``start`` / ``end`` are left out)
``force_span``        ``{"kind": "force_span", "start": 0, "end": 2, "label": "PER"}``: tokens
                      ``start..end - 1`` are one entity of the label
====================  =====================================================================

Token offsets are spaCy's (``end`` exclusive). An entity belongs to the sentence of its first
token; ``scope = "sentence"`` applies the constraint to every sentence, the ones without any
entity included (the spaCy component takes the sentences from the document: one without
sentence boundaries is one sentence). The "count" kinds (the first five) compile to a small
deterministic automaton over entity labels (:class:`Automaton`): a state is a tuple of counters
and flags, so an exact search over (position, state) enforces them with no relaxation. The last
two are enforced by removing the items (nodes, segments, tags) that contradict them.
"""
import operator
from dataclasses import MISSING, asdict, dataclass, fields
from functools import lru_cache
from typing import (
    Callable, ClassVar, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union)

import numpy

SCOPES = ("doc", "sentence")
MAX_STATES = 512
"""The most states a compiled constraint set may have: the exact search costs grow with the
square of the state count."""


def _check_label(name: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty label name, got {value!r}")


def _whole(value) -> Optional[int]:
    """``value`` as a Python int when it is an integer (a NumPy one too: offsets often come
    from arrays), not a bool; else None."""
    if isinstance(value, (bool, numpy.bool_)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _check_count(owner: "Constraint") -> None:
    value = owner.n
    whole = _whole(value)
    if whole is None or whole < 0:
        raise ValueError(f"n must be a non-negative integer, got {value!r}")
    object.__setattr__(owner, "n", whole)


def _check_scope(value) -> None:
    if value not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {value!r}")


def _check_offset(owner: "Constraint", name: str, optional: bool) -> None:
    value = getattr(owner, name)
    if value is None and optional:
        return
    whole = _whole(value)
    if whole is None or whole < 0:
        raise ValueError(f"{name} must be a non-negative token offset, got {value!r}")
    object.__setattr__(owner, name, whole)  # a plain int, which the config's JSON can hold


class Constraint:
    """Base of the constraint kinds: ``kind`` names it in the dict form."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> Dict:
        """The dict form (what :func:`parse_constraints` reads back)."""
        out = {"kind": self.kind}
        out.update({k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()})
        return out

    def label_names(self) -> Tuple[str, ...]:
        """The labels the constraint names (checked against the component's labels)."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name in ("label", "other"))


@dataclass(frozen=True)
class _Count(Constraint):
    label: str
    n: int
    scope: str = "doc"

    def __post_init__(self) -> None:
        _check_label("label", self.label)
        _check_count(self)
        _check_scope(self.scope)


@dataclass(frozen=True)
class AtMost(_Count):
    """At most ``n`` entities of ``label`` per document (or per sentence)."""

    kind: ClassVar[str] = "at_most"


@dataclass(frozen=True)
class Exactly(_Count):
    """Exactly ``n`` entities of ``label`` per document (or per sentence)."""

    kind: ClassVar[str] = "exactly"


@dataclass(frozen=True)
class AtLeast(_Count):
    """At least ``n`` entities of ``label`` per document (or per sentence)."""

    kind: ClassVar[str] = "at_least"


@dataclass(frozen=True)
class _Pair(Constraint):
    label: str
    other: str
    scope: str = "doc"

    def __post_init__(self) -> None:
        _check_label("label", self.label)
        _check_label("other", self.other)
        _check_scope(self.scope)
        if self.label == self.other:
            raise ValueError(f"{self.kind} needs two different labels, got {self.label!r} twice")


@dataclass(frozen=True)
class Excludes(_Pair):
    """Never an entity of ``label`` and one of ``other`` in the same document (or sentence)."""

    kind: ClassVar[str] = "excludes"


@dataclass(frozen=True)
class Requires(_Pair):
    """An entity of ``label`` needs one of ``other`` in the same document (or sentence)."""

    kind: ClassVar[str] = "requires"


@dataclass(frozen=True)
class ForbidLabels(Constraint):
    """No entity of ``labels`` (of any label when None) covers a token of ``start..end - 1``
    (``None`` bounds: the document's start or end)."""

    labels: Optional[Tuple[str, ...]] = None
    start: Optional[int] = None
    end: Optional[int] = None
    kind: ClassVar[str] = "forbid_labels"

    def __post_init__(self) -> None:
        if self.labels is not None:
            if isinstance(self.labels, str) or not isinstance(self.labels, (list, tuple)):
                raise ValueError(f"labels must be a list of label names, got {self.labels!r}")
            object.__setattr__(self, "labels", tuple(self.labels))
            if not self.labels:
                raise ValueError("labels must name at least one label (leave it out for all)")
            for label in self.labels:
                _check_label("labels", label)
        _check_offset(self, "start", optional=True)
        _check_offset(self, "end", optional=True)
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end must be after start, got start={self.start}, end={self.end}")

    def label_names(self) -> Tuple[str, ...]:
        return self.labels or ()


@dataclass(frozen=True)
class ForceSpan(Constraint):
    """Tokens ``start..end - 1`` are one entity of ``label``."""

    start: int
    end: int
    label: str
    kind: ClassVar[str] = "force_span"

    def __post_init__(self) -> None:
        _check_offset(self, "start", optional=False)
        _check_offset(self, "end", optional=False)
        if self.end <= self.start:
            raise ValueError(f"end must be after start, got start={self.start}, end={self.end}")
        _check_label("label", self.label)


KINDS = {
    cls.kind: cls
    for cls in (AtMost, Exactly, AtLeast, Excludes, Requires, ForbidLabels, ForceSpan)
}


def parse_constraint(item: Union[Dict, Constraint]) -> Constraint:
    """One constraint from its dict form (a :class:`Constraint` passes through).

    Raises ``ValueError`` naming the problem: an unknown kind, a missing or unknown key, a value
    of the wrong type or range."""
    if isinstance(item, Constraint):
        return item
    if not isinstance(item, dict):
        raise ValueError(f"a constraint is a dict with a 'kind', got {item!r}")
    data = dict(item)
    kind = data.pop("kind", None)
    # (a kind that is not a string may be unhashable: no dict lookup for it)
    if not isinstance(kind, str) or kind not in KINDS:
        raise ValueError(f"unknown constraint kind {kind!r}; expected one of {sorted(KINDS)}")
    cls = KINDS[kind]
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names, key=repr)  # (keys of a dict in Python need not be str)
    if unknown:
        raise ValueError(f"{kind}: unknown key(s) {unknown}; expected {sorted(names)}")
    missing = sorted(f.name for f in fields(cls) if f.name not in data
                     and f.default is MISSING and f.default_factory is MISSING)
    if missing:
        raise ValueError(f"{kind}: missing key(s) {missing}; expected {sorted(names)}")
    return cls(**data)


def parse_constraints(items: Optional[Iterable[Union[Dict, Constraint]]]) -> Tuple[Constraint, ...]:
    """Constraints from a list of dicts (as in a config or ``doc.user_data``); None gives ()."""
    if items is None:
        return ()
    if isinstance(items, (dict, Constraint, str)) or not hasattr(items, "__iter__"):
        raise ValueError("constraints must be a list of constraints")
    return tuple(parse_constraint(item) for item in items)


def constraints_to_dicts(constraints: Iterable[Constraint]) -> List[Dict]:
    """The dict forms, in order (JSON- and config-serialisable)."""
    return [c.to_dict() for c in constraints]


# ----------------------------------------------------------------------------- automaton


class _Component:
    """One count-type constraint as a small automaton over entity label ids (0: no entity).

    ``step`` gives the next state or -1 (violated for good); ``accept`` says whether a scope
    may end in a state; ``drops`` are the labels whose entities the constraint may want fewer
    of (in the filtered head, nodes of these labels may be left off a path)."""

    drops: Tuple[int, ...]

    def __init__(self, scope: str) -> None:
        self.sentence = scope == "sentence"

    def step(self, state: int, label: int) -> int:
        raise NotImplementedError

    def accept(self, state: int) -> bool:
        return True


class _Counter(_Component):
    """Entities of ``label``: at least ``lo`` and at most ``hi`` (None: unbounded). The count
    saturates at ``lo`` when there is no upper bound."""

    def __init__(self, label: int, lo: int, hi: Optional[int], scope: str) -> None:
        super().__init__(scope)
        self.label, self.lo, self.hi = label, lo, hi
        self.cap = hi if hi is not None else lo
        self.drops = (label,) if hi is not None else ()

    def step(self, state: int, label: int) -> int:
        if label != self.label:
            return state
        if state < self.cap:
            return state + 1
        return -1 if self.hi is not None else state

    def accept(self, state: int) -> bool:
        return state >= self.lo


class _Excludes(_Component):
    """States: 0 neither seen, 1 ``a`` seen, 2 ``b`` seen."""

    def __init__(self, a: int, b: int, scope: str) -> None:
        super().__init__(scope)
        self.a, self.b = a, b
        self.drops = (a, b)

    def step(self, state: int, label: int) -> int:
        if label == self.a:
            return 1 if state != 2 else -1
        if label == self.b:
            return 2 if state != 1 else -1
        return state


class _Requires(_Component):
    """States: 0 nothing, 1 an ``a`` waiting for a ``b``, 2 a ``b`` seen (satisfied)."""

    def __init__(self, a: int, b: int, scope: str) -> None:
        super().__init__(scope)
        self.a, self.b = a, b
        self.drops = (a,)

    def step(self, state: int, label: int) -> int:
        if label == self.b:
            return 2
        if label == self.a and state == 0:
            return 1
        return state

    def accept(self, state: int) -> bool:
        return state != 1


@dataclass(frozen=True, eq=False)
class Automaton:
    """The product of the count-type constraints, over ``n_symbols`` entity label ids.

    State 0 is the initial one; ``-1`` marks a violated state. ``delta[c, q]``: after an
    entity of label ``c`` (``c = 0``: a null item, which changes nothing). ``move[x, q]``:
    after crossing ``x`` sentence starts (``x`` capped at 2): each sentence-scope part must
    accept, and with ``x = 2`` also accept a sentence with no entity, and then restarts.
    ``combined[c, x] = move[x] o delta[c]``. ``final[q]``: the document may end in ``q`` (its
    sentence-scope parts are checked by the last move). ``droppable[c]``: a constraint may
    want fewer entities of label ``c``.
    """

    n_states: int
    delta: numpy.ndarray
    move: numpy.ndarray
    combined: numpy.ndarray
    final: numpy.ndarray
    droppable: numpy.ndarray

    @property
    def trivial(self) -> bool:
        return self.n_states == 1 and bool(self.final[0])

    def run(self, items: Iterable[Tuple[int, int]], sentence: numpy.ndarray) -> bool:
        """Whether a path satisfies the constraints: ``items`` are ``(start, label)`` of its
        entities in order, ``sentence`` the sentence index of each position (see
        :func:`sentence_index`)."""
        state, where = 0, 0
        for start, label in items:
            state = self._cross(state, where, start, sentence)
            if state < 0:
                return False
            state, where = int(self.delta[label, state]), start
            if state < 0:
                return False
        state = self._cross(state, where, len(sentence) - 1, sentence)
        return state >= 0 and bool(self.final[state])

    def _cross(self, state: int, a: int, b: int, sentence: numpy.ndarray) -> int:
        return int(self.move[min(2, int(sentence[b] - sentence[a])), state])


def _build_automaton(components: List[_Component], n_symbols: int) -> Automaton:
    sentence_parts = [i for i, c in enumerate(components) if c.sentence]
    empty_ok = all(components[i].accept(0) for i in sentence_parts)

    def step(state: Tuple[int, ...], label: int) -> Optional[Tuple[int, ...]]:
        out = tuple(c.step(q, label) for c, q in zip(components, state))
        return None if min(out, default=0) < 0 else out

    def cross(state: Tuple[int, ...], x: int) -> Optional[Tuple[int, ...]]:
        if x == 0:
            return state
        if not all(components[i].accept(state[i]) for i in sentence_parts):
            return None
        if x > 1 and not empty_ok:
            return None
        return tuple(0 if c.sentence else q for c, q in zip(components, state))

    start = tuple(0 for _ in components)
    ids: Dict[Tuple[int, ...], int] = {start: 0}
    queue = [start]
    while queue:  # depth-first (pop from the end) over the reachable states
        state = queue.pop()
        successors = [step(state, c) for c in range(n_symbols)] + [cross(state, x) for x in (1, 2)]
        for nxt in successors:
            if nxt is not None and nxt not in ids:
                ids[nxt] = len(ids)
                if len(ids) > MAX_STATES:
                    raise ValueError(
                        f"these constraints need more than {MAX_STATES} search states; "
                        "use fewer count constraints or smaller counts"
                    )
                queue.append(nxt)
    S = len(ids)
    states = sorted(ids, key=ids.get)

    def table(fn, args) -> numpy.ndarray:
        out = numpy.full((len(args), S), -1, dtype=numpy.int64)
        for i, arg in enumerate(args):
            for q, state in enumerate(states):
                nxt = fn(state, arg)
                out[i, q] = -1 if nxt is None else ids[nxt]
        return out

    delta = table(step, range(n_symbols))
    move = table(cross, (0, 1, 2))
    # combined[c, x, q] = move[x, delta[c, q]], keeping -1
    after = delta.clip(min=0)
    combined = numpy.where(delta[:, None, :] >= 0, move[:, after].transpose(1, 0, 2), -1)
    final = numpy.array(
        [all(c.accept(q) for c, q in zip(components, s) if not c.sentence) for s in states]
    )
    droppable = numpy.zeros(n_symbols, dtype=bool)
    for c in components:  # label ids from 1: the null symbol 0 is never droppable
        droppable[list(c.drops)] = True
    return Automaton(S, delta, move, combined, final, droppable)


@lru_cache(maxsize=None)
def no_constraints() -> Automaton:
    """The automaton of no constraint: one state, always accepting, one symbol."""
    return _build_automaton([], 1)


# ----------------------------------------------------------------------------- compiled set


class Forbid(NamedTuple):
    """Label ids (None: every entity label) that may not cover tokens ``start..end``
    (inclusive; ``end`` None: to the document's end)."""

    start: int
    end: Optional[int]
    labels: Optional[Tuple[int, ...]]


class Force(NamedTuple):
    """Tokens ``start..end`` (inclusive) must be one entity of label id ``label``."""

    start: int
    end: int
    label: int


@dataclass(frozen=True, eq=False)
class ConstraintProgram:
    """A constraint set resolved against a label set: the automaton of its count-type
    constraints, its forbidden ranges and its forced spans (label ids are 1-based indices into
    the labels, 0 being null)."""

    constraints: Tuple[Constraint, ...]
    automaton: Automaton
    forbids: Tuple[Forbid, ...]
    forces: Tuple[Force, ...]

    @property
    def empty(self) -> bool:
        return not self.constraints


def compile_constraints(
    constraints: Iterable[Union[Dict, Constraint]], labels: Sequence[str]
) -> ConstraintProgram:
    """Resolve constraints against the component's ``labels`` (label id ``i + 1`` is
    ``labels[i]``). Raises ``ValueError`` for an unknown label or too many search states."""
    return _compile(parse_constraints(constraints), tuple(labels))


@lru_cache(maxsize=256)
def _compile(constraints: Tuple[Constraint, ...], labels: Tuple[str, ...]) -> ConstraintProgram:
    ids = {name: i + 1 for i, name in enumerate(labels)}
    for c in constraints:
        for name in c.label_names():
            if name not in ids:
                raise ValueError(f"{c.kind}: unknown label {name!r}; the labels are {list(labels)}")
    components: List[_Component] = []
    forbids, forces = [], []
    for c in constraints:
        if isinstance(c, AtMost):
            components.append(_Counter(ids[c.label], 0, c.n, c.scope))
        elif isinstance(c, Exactly):
            components.append(_Counter(ids[c.label], c.n, c.n, c.scope))
        elif isinstance(c, AtLeast):
            components.append(_Counter(ids[c.label], c.n, None, c.scope))
        elif isinstance(c, Excludes):
            components.append(_Excludes(ids[c.label], ids[c.other], c.scope))
        elif isinstance(c, Requires):
            components.append(_Requires(ids[c.label], ids[c.other], c.scope))
        elif isinstance(c, ForbidLabels):
            which = None if c.labels is None else tuple(sorted(ids[x] for x in c.labels))
            end = None if c.end is None else c.end - 1
            forbids.append(Forbid(c.start or 0, end, which))
        elif isinstance(c, ForceSpan):
            forces.append(Force(c.start, c.end - 1, ids[c.label]))
    automaton = _build_automaton(components, len(labels) + 1)
    return ConstraintProgram(constraints, automaton, tuple(forbids), tuple(sorted(set(forces))))


class DocConstraints(NamedTuple):
    """What a head needs to decode one document under constraints: the compiled program, the
    document's sentence starts (token offsets; empty: one sentence) and the tokens where no
    entity may start unless a forced span does (the spaCy component passes the whitespace
    tokens, which it trims from entities after decoding: the constraints then count the
    entities it writes). An unconstrained best path whose entities, trimmed of these tokens,
    obey the constraints is kept as it is."""

    program: ConstraintProgram
    sentence_starts: Tuple[int, ...] = ()
    closed_starts: Tuple[int, ...] = ()


def sentence_index(length: int, sentence_starts: Sequence[int] = ()) -> numpy.ndarray:
    """``[length + 1]``: the sentence of each token, and at ``length`` the number of sentences
    (a virtual sentence after the last). Token 0 always starts a sentence."""
    marks = numpy.zeros(length + 1, dtype=numpy.int64)
    starts = numpy.asarray([s for s in sentence_starts if 0 < s < length], dtype=numpy.int64)
    marks[numpy.unique(starts)] = 1
    if length:
        marks[length] = 1
    return numpy.cumsum(marks)


def padded_sentence_index(
    length: int, size: int, sentence_starts: Sequence[int] = ()
) -> numpy.ndarray:
    """:func:`sentence_index` over positions ``0..size`` (``size >= length``), constant past
    the document's end: a row of a padded batch."""
    index = sentence_index(length, sentence_starts)
    return numpy.concatenate([index, numpy.full(size - length, index[-1])])


def trim_span(start: int, end: int, is_space: Callable[[int], bool]) -> Optional[Tuple[int, int]]:
    """Tokens ``start..end`` (inclusive) without the tokens ``is_space`` says are whitespace at
    their edges; None when they are all whitespace. (The spaCy component writes its entities
    so.)"""
    while start <= end and is_space(start):
        start += 1
    while end >= start and is_space(end):
        end -= 1
    return (start, end) if start <= end else None


def _trimmed(
    spans: Iterable[Tuple[int, int, int]], spaces: Set[int], forced: Set[Tuple[int, int, int]]
) -> List[Tuple[int, int, int]]:
    """``spans`` without the tokens ``spaces`` at their edges (those of them only left out),
    forced spans as they are."""
    out = []
    for start, end, label in spans:
        edges = (start, end) if (start, end, label) in forced else trim_span(
            start, end, spaces.__contains__)
        if edges is not None:
            out.append((*edges, label))
    return out


def satisfies(
    program: ConstraintProgram,
    spans: Iterable[Tuple[int, int, int]],
    length: int,
    sentence_starts: Sequence[int] = (),
    spaces: Sequence[int] = (),
) -> bool:
    """Whether entities ``(start, end inclusive, label id)`` (non-overlapping) satisfy every
    constraint of ``program`` in a document of ``length`` tokens, once trimmed of the tokens
    ``spaces`` at their edges (one of them only is no entity; a forced span stays as it is),
    as the spaCy component writes them."""
    spans = sorted(_trimmed(spans, set(spaces), set(program.forces)) if spaces else spans)
    for f in program.forbids:
        end = length - 1 if f.end is None else f.end
        for s, e, label in spans:
            if s <= end and e >= f.start and (f.labels is None or label in f.labels):
                return False
    present = set(spans)
    if any(tuple(f) not in present for f in program.forces):
        return False
    sentence = sentence_index(length, sentence_starts)
    return program.automaton.run(((s, label) for s, _, label in spans), sentence)
