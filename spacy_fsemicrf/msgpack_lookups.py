"""srsly's msgpack encoders and decoders, looked up once instead of at every call.

srsly reads its catalogue registries of msgpack encoders and decoders on every
``msgpack_dumps`` and ``msgpack_loads``. With ``entry_points = True`` each read scans every
entry point of the environment, and even without, it copies and filters catalogue's global
registry of every function spaCy and Thinc register: about 0.25 ms a call, against 0.2 us for
msgpack itself. A document costs several calls each way: ``DocBin.add`` three (its user data,
its span groups, each group), and ``nlp.pipe(n_process=N)`` sends every document from its
worker to the parent as ``Doc.to_bytes``, read back there with ``Doc.from_bytes``. For short
documents that is as much time as annotating them.

Making, training or running an ``fsemicrf_ner`` component applies it
(``spacy_fsemicrf/component.py``), so the processes ``n_process`` forks have it too; a process
without the component is left as it is. The encoders and decoders stay the same ones; a
function registered later (anywhere in catalogue) is seen at the next call.
"""
from typing import Any, Callable, Dict, Optional, Tuple

import catalogue


def remember_msgpack_lookups(registries: Optional[Tuple[Any, ...]] = None) -> None:
    """Register the msgpack encoders and decoders that come from package entry points
    directly, and let the registries remember their contents until catalogue's global
    registry grows. ``registries``: catalogue registries to treat instead of srsly's two."""
    if registries is None:
        from srsly.msgpack import msgpack_decoders, msgpack_encoders

        registries = (msgpack_encoders, msgpack_decoders)
    for registry in registries:
        if registry.entry_points:
            for name, func in registry.get_entry_points().items():
                registry.register(name, func=func)
            registry.entry_points = False
        if not getattr(registry.get_all, "remembers", False):
            registry.get_all = _remembered(registry.get_all)


def _remembered(get_all: Callable[[], Dict[str, Any]]) -> Callable[[], Dict[str, Any]]:
    """``get_all`` of a catalogue registry, read again only after a new registration anywhere
    (catalogue's global registry then has more entries)."""
    memo: Dict[str, Any] = {}

    def remembered_get_all() -> Dict[str, Any]:
        size = len(catalogue.REGISTRY)
        if memo.get("size") != size:
            memo["value"], memo["size"] = get_all(), size
        return dict(memo["value"])

    remembered_get_all.remembers = True  # type: ignore[attr-defined]
    return remembered_get_all
