"""Reusing the nodes of immutable objects in a state snapshot's capture: the cache of
:func:`engine.runtime.state_capture.capture` (its walk, :class:`~engine.runtime.state_capture._Encoder`,
uses it: ``frozen``, ``replay``, ``register``, ``record``).

Why (Nov 27 evening).  At 10,000 rules
most of the walk was the compiled rules -- ``subscriptions.compiler.Plan``, its AST, atoms and
aggregate specs, about 11 instances a rule, ~110,000 of the ~128,000 instances written -- which
nothing changes once compiled (a changed rule is a new plan).  ``capture(root, cache)`` keeps, per
object of a class declared :func:`immutable` (``Plan``), the node the walk wrote for it
(:class:`_Entry`), keyed by the object (held: its id is not reused while cached), and the next
capture with that cache writes the kept node instead of walking the object again when that is
exactly what the walk would write there:

* the node holds no buffer (else it is not kept: a buffer is a copy of a state that changes);
* no object of its subtree was met earlier in this walk (the walk would write an ``R`` node for
  it): the ids its capture numbered are checked against this walk's (``isdisjoint``, in C);
* every object outside the subtree its ``R`` nodes point to was met before it in this walk too
  (else the walk would write it inside), and is not a tuple being written (a cycle, refused);
* then only numbers can differ: its objects' node numbers (the nodes before it changed: more
  units, a rule added), those of the outside objects, and shape numbers (a class met first
  elsewhere).  Its objects are numbered in the memo as the walk would number them (one
  ``update``), its shapes registered in the order the walk would meet them (once per distinct
  list of shapes and capture), its ``u`` tuples appended; when a number changed, the node is a
  :class:`_Moved` that :meth:`Captured.finish` renumbers (a copy of the lists on the paths to
  the numbers; the JSON writers' fallback), in the writer thread.

Every object the walk reaches through a reused node is then numbered, registered and written
exactly as by a walk (``tests/engine/runtime/test_capture_cache.py`` checks the bytes against
:func:`~engine.runtime.state_codec.dumps`: an engine core across batches and rule changes,
objects shared in and out, shifted numbers and shapes, huge ints, any values).  What a walk of
an immutable object records (the ids, the outside objects) costs a little in the capture; the
survey of its node (where its ``R`` and ``C`` nodes are, its shapes) is done by the finish.  The
premise is the declaration: an object declared immutable that is changed in place would be
written as it was when cached -- declare only classes whose instances, and all they reach, are
never changed (the compiler makes a new ``Plan`` for every rule text and nothing changes one).
"""

from __future__ import annotations

from typing import Any

from engine.runtime.state_format import _path_of

__all__ = ["CaptureCache", "immutable"]


#: classes whose instances, and everything reachable from them, are never changed once made:
#: their nodes are kept by a :class:`CaptureCache` and reused (a compiled rule: the compiler
#: makes a new ``Plan`` for every rule text, nothing changes one afterwards); :func:`immutable`
_IMMUTABLE: set[str] = {"subscriptions.compiler:Plan"}


def immutable(cls: type) -> type:
    """Declare that instances of ``cls`` (an allowed class), and everything reachable from them,
    are never changed once made: a :class:`CaptureCache` reuses their nodes.  Returns ``cls``.
    A wrong declaration writes a stale subtree: declare only what is never changed in place."""
    _IMMUTABLE.add(_path_of(cls))
    return cls


class _Entry:
    """The nodes of one immutable object's subtree as a capture wrote them: its root (held, so
    its id is not reused), the node, the number of its first node (``count0``) and how many it
    numbered (``n``), the ids of those objects in number order, the tuples of its ``u`` nodes,
    the objects met before it that it points to (``outside``, held) and their numbers
    (``nums``).  Then, made by :meth:`prepare` (by :meth:`Captured.finish`, in the writer
    thread, or by the next capture if it comes first): the shapes it uses (``sig``: (class,
    attribute names, shape number) in the order first met), where its ``R`` nodes are
    (``spots``: index -> spots below; for an ``R`` node None when it points into the subtree,
    else the index in ``outside``; None when it has none) and its ``C`` nodes (``cspots``, for
    shape numbers that changed).  Never changed but by :meth:`prepare`: captures share the
    node."""

    __slots__ = (
        "count0",
        "cspots",
        "ids",
        "n",
        "node",
        "nums",
        "outside",
        "root",
        "sig",
        "source",
        "spots",
        "tuples",
    )

    def __init__(
        self,
        root: Any,
        node: list[Any],
        count0: int,
        ids: tuple[int, ...],
        tuples: tuple[tuple[Any, ...], ...],
        outside: tuple[Any, ...],
        nums: tuple[int, ...],
        source: tuple[list[list[Any]], list[type], dict[Any, Any]],
    ) -> None:
        self.root = root
        self.node = node
        self.count0 = count0
        self.n = len(ids)
        self.ids = ids
        self.tuples = tuples
        self.outside = outside
        self.nums = nums
        #: the recording capture's shapes and classes, and the cache's sigs (None: prepared)
        self.source: tuple[list[list[Any]], list[type], dict[Any, Any]] | None = source
        self.sig: tuple[tuple[type, tuple[str, ...], int], ...] = ()
        self.spots: dict[int, Any] | None = None
        self.cspots: dict[int, Any] | None = None

    def prepare(self) -> None:
        """Survey the node (:func:`_survey`) once: ``sig``, ``spots``, ``cspots``."""
        source = self.source
        if source is None:
            return
        shapes, types, sigs = source
        seen: dict[int, None] = {}
        where = {m: j for j, m in enumerate(self.nums)}
        self.spots, self.cspots = _survey(self.node, seen, self.count0, where)
        sig = tuple((types[shapes[sh][0]], tuple(shapes[sh][1]), sh) for sh in seen)
        self.sig = sigs.setdefault(sig, sig)
        self.source = None


class CaptureCache:
    """The nodes of the immutable objects (:func:`immutable`) met by the last capture, reused by
    the next (see the module's docstring): keep one per state and pass it to every
    :func:`capture` of that state (:meth:`engine.core.EngineCore.capture`), one capture at a time
    (a :meth:`Captured.finish` in another thread only surveys the entries its capture made:
    :meth:`_Entry.prepare`, the same result whichever thread does it first).

    Of the last capture: ``hits``, immutable objects whose nodes were reused (``moved`` of them
    renumbered, their place in the walk having changed); ``misses``, those walked."""

    __slots__ = ("entries", "hits", "misses", "moved", "sigs")

    def __init__(self) -> None:
        self.hits = self.misses = self.moved = 0
        self.entries: dict[int, _Entry] = {}
        #: the entries' sigs, one object per value: a capture checks each once (by its id)
        self.sigs: dict[Any, Any] = {}

    def clear(self) -> None:
        self.entries = {}
        self.sigs = {}


class _Moved:
    """A reused node whose numbers changed (:meth:`_Encoder.replay`): its ``R`` nodes (``delta``
    further into its subtree, ``nums`` out of it) and shape numbers (``remap``).  Stands for the
    node in the captured tree; :meth:`node` makes it (:meth:`Captured.finish`)."""

    __slots__ = ("delta", "entry", "nums", "remap")

    def __init__(
        self, entry: _Entry, delta: int, nums: tuple[int, ...], remap: dict[int, int] | None
    ) -> None:
        self.entry = entry
        self.delta = delta
        self.nums = nums
        self.remap = remap

    def node(self) -> list[Any]:
        e = self.entry
        node = e.node
        if (self.delta or self.nums != e.nums) and e.spots is not None:
            node = _moved(node, e.spots, self.delta, self.nums)
        if self.remap is not None and e.cspots is not None:
            node = _reshaped(node, e.cspots, self.remap)
        return node


def _made(x: Any) -> Any:
    """The JSON writers' fallback: a :class:`_Moved`'s node."""
    if type(x) is _Moved:
        return x.node()
    raise TypeError(f"{type(x).__name__} in the captured nodes")


def _survey(
    node: list[Any], shapes: dict[int, None], c0: int, where: dict[int, int]
) -> tuple[dict[int, Any] | None, dict[int, Any] | None]:
    """Where the ``R`` nodes and the ``C`` nodes of ``node`` are: (index -> the same below; for an
    ``R`` node None when it points to node ``c0`` or later, else ``where`` of its number; None
    when there is none), (index -> the same below, 1 -> True in a ``C`` node; None when there is
    none); the shape numbers of the ``C`` nodes are added to ``shapes`` in the order of the walk.
    ``node`` holds no leaf node (its subtree has no buffer)."""
    tag = node[0]
    if tag == "u" or tag == "f" or tag == "s":
        return None, None
    spots: dict[int, Any] = {}
    cspots: dict[int, Any] = {}
    if tag == "C":
        cspots[1] = True
        if node[1] not in shapes:
            shapes[node[1]] = None
    for k in range(2 if tag == "C" else 1, len(node)):
        v = node[k]
        if type(v) is _Moved:  # one reused inside this one (whose node is its own list)
            v = node[k] = v.node()
        if type(v) is list:
            if v[0] == "R":
                spots[k] = None if v[1] >= c0 else where[v[1]]
            else:
                sub, csub = _survey(v, shapes, c0, where)
                if sub is not None:
                    spots[k] = sub
                if csub is not None:
                    cspots[k] = csub
    return spots or None, cspots or None


def _reshaped(node: list[Any], cspots: dict[int, Any], remap: dict[int, int]) -> list[Any]:
    """A copy of ``node`` with the shape numbers of the ``C`` nodes at ``cspots`` (:func:`_survey`)
    mapped by ``remap``; the lists on no path to one are shared, not copied."""
    out = list(node)
    for k, sub in cspots.items():
        if sub is True:
            out[1] = remap.get(node[1], node[1])
        else:
            out[k] = _reshaped(node[k], sub, remap)
    return out


def _moved(node: list[Any], spots: dict[int, Any], delta: int, nums: tuple[int, ...]) -> list[Any]:
    """A copy of ``node`` with the ``R`` nodes at ``spots`` (:func:`_survey`) renumbered: those
    into the subtree ``delta`` further, the others to ``nums``; the lists on no path to one are
    shared, not copied."""
    out = list(node)
    for k, sub in spots.items():
        if sub is None:
            out[k] = ["R", node[k][1] + delta]
        elif type(sub) is int:
            out[k] = ["R", nums[sub]]
        else:
            out[k] = _moved(node[k], sub, delta, nums)
    return out
