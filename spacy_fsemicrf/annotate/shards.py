"""The output of ``annotate``: shard files written atomically, the manifest, entities.jsonl.

OUTPUT/
    manifest.json            the model and its build, the shard size and every shard with a
                             digest of its documents (checked on a rerun)
    shards/000000.spacy      the annotated documents of shard 0 (ids in doc.user_data["id"])
    shards/000000.jsonl      their entities, one JSON object a line
    entities.jsonl           every shard's entities in input order, written at the end

A shard is written to temporary files that are renamed into place, its ``.spacy`` file last:
a shard exists only complete, and a crash at any moment leaves either the whole shard or no
``.spacy`` file for it, which a rerun annotates again.
"""
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy
import srsly
from spacy.attrs import DEP, ENT_ID, ENT_KB_ID, ENT_TYPE, LEMMA, MORPH, NORM, ORTH, SPACY, TAG
from spacy.language import Language
from spacy.tokens import Doc, DocBin
from spacy.vocab import Vocab

from .inputs import AnnotateError, Shard, file_digest

MANIFEST_FORMAT = 2  # 1: a digest of each input file, in each of its shards
TMP_SUFFIX = ".tmp"
# OUTPUT's files beside its shards/ folder
MANIFEST, ENTITIES = "manifest.json", "entities.jsonl"


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp makes its files readable by their owner only; the output files get the mode a plain
# open() would give them, so that other users' downstream jobs can read them (read once, at
# import: setting the umask to read it is not thread-safe)
FILE_MODE = 0o666 & ~_process_umask()
# The token attributes whose strings DocBin.add stores: text, norm, lemma, tag, dep, entity
# type, KB id and id, morphology.
STRING_ATTRS = (ORTH, NORM, LEMMA, TAG, DEP, ENT_TYPE, ENT_KB_ID, ENT_ID, MORPH)


def shard_paths(output: Path, index: int) -> Dict[str, Path]:
    stem = output / "shards" / f"{index:06d}"
    return {"docs": stem.with_suffix(".spacy"), "entities": stem.with_suffix(".jsonl")}


def score_keys(nlp: Language) -> List[str]:
    """The ``doc.spans`` keys of the pipeline's span-writing components (``spans_key``), where
    an entity's score may be found in ``.attrs["scores"]``."""
    keys = []
    for _, pipe in nlp.pipeline:
        key = getattr(pipe, "spans_key", None)
        if isinstance(key, str) and key not in keys:
            keys.append(key)
    return keys


def entity_records(doc: Doc, doc_id: Any, keys: List[str]) -> List[Dict[str, Any]]:
    """One record per entity of ``doc.ents``: id, start/end character, label, text and score
    (the span's score in the first of ``keys`` holding it, else None)."""
    scores: Dict[tuple, float] = {}
    for key in reversed(keys):  # the first key wins
        group = doc.spans.get(key)
        values = None if group is None else group.attrs.get("scores")
        if values is None or len(values) != len(group):
            continue
        for span, score in zip(group, numpy.asarray(values).tolist()):
            scores[(span.start, span.end, span.label)] = float(score)
    return [
        {
            "id": doc_id,
            "start": ent.start_char,
            "end": ent.end_char,
            "label": ent.label_,
            "text": ent.text,
            "score": scores.get((ent.start, ent.end, ent.label)),
        }
        for ent in doc.ents
    ]


def write_shard(output: Path, index: int, docs: List[Doc], records: List[Dict[str, Any]]) -> None:
    """Write the shard's entities, then its documents, each to a temporary file renamed into
    place; on any error the temporary files are removed and nothing of the shard is left."""
    paths = shard_paths(output, index)
    docbin = shard_docbin(docs)
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    tmp_entities = tmp_docs = None
    try:
        tmp_entities = _write_tmp(paths["entities"], lines.encode("utf8"))
        tmp_docs = _write_tmp(paths["docs"], docbin.to_bytes())
        os.replace(tmp_entities, paths["entities"])
        tmp_entities = None
        os.replace(tmp_docs, paths["docs"])  # the shard exists from here on
        tmp_docs = None
    finally:
        for tmp in (tmp_entities, tmp_docs):
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)


def shard_docbin(docs: List[Doc]) -> DocBin:
    """``DocBin(store_user_data=True, docs=docs)``, built a column at a time: ``DocBin.add``
    reads nine strings of every token through a Token object each, a third of the time it
    takes to annotate a short document; here each distinct value of a string column is looked
    up once."""
    docbin = DocBin(store_user_data=True)
    columns = [docbin.attrs.index(attr) for attr in STRING_ATTRS]
    hashes: Set[int] = set()
    for doc in docs:
        array = doc.to_array(docbin.attrs).reshape(len(doc), len(docbin.attrs))
        docbin.tokens.append(array)
        docbin.spaces.append(doc.to_array(SPACY).reshape(-1, 1).astype(bool))
        docbin.flags.append({"has_unknown_spaces": doc.has_unknown_spaces})
        hashes.update(numpy.unique(array[:, columns]).tolist())
        docbin.cats.append(doc.cats)
        docbin.user_data.append(srsly.msgpack_dumps(doc.user_data))
        docbin.span_groups.append(doc.spans.to_bytes())
        for group in doc.spans.values():
            for span in group:
                docbin.strings.add(span.label_)
                if span.kb_id in doc.vocab.strings:
                    docbin.strings.add(span.kb_id_)
                if span.id in doc.vocab.strings:
                    docbin.strings.add(span.id_)
    if docs:
        strings = docs[0].vocab.strings
        docbin.strings.update(strings[h] if h else "" for h in hashes)
    return docbin


def _mkstemp(final: Path) -> Tuple[int, str]:
    """A temporary file beside ``final`` (to be renamed into place), with :data:`FILE_MODE`."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=TMP_SUFFIX)
    os.fchmod(fd, FILE_MODE)
    return fd, tmp


def _write_tmp(final: Path, data: bytes) -> str:
    fd, tmp = _mkstemp(final)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def finished_shards(output: Path, shards: Iterable[Shard]) -> Set[int]:
    """Indices of the shards whose ``.spacy`` and entity files both exist."""
    return {
        shard.index
        for shard in shards
        if all(p.exists() for p in shard_paths(output, shard.index).values())
    }


def remove_temporary(output: Path) -> int:
    """Remove the temporary files left by a run killed while writing (the shards', the
    manifest's, the merged entities'); their number."""
    removed = 0
    left = list((output / "shards").glob(f".*{TMP_SUFFIX}"))
    for name in (MANIFEST, ENTITIES):
        left.extend(output.glob(f".{name}.*{TMP_SUFFIX}"))
    for tmp in left:
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def prepare_output(
    output: Path, model: str, shard_size: int, shards: List[Shard], update: bool = False,
    build: Optional[str] = None,
) -> List[int]:
    """Create OUTPUT with its manifest, or check that an existing one was written for the same
    model, input and shard size (a rerun must find the same shards). ``build`` tells builds of
    the model apart (:func:`.engine.model_build`): one that differs from the manifest's is
    refused, one unknown to either is not compared.

    With ``update``, an input that changed since that run is accepted: the files of the shards
    whose documents changed (and of shards the input no longer has) are removed, so that the
    run annotates them again, and the manifest is rewritten. Returns those shards' indices."""
    manifest = {
        "format": MANIFEST_FORMAT,
        "model": model,
        "shard_size": shard_size,
        "shards": [shard.to_dict() for shard in shards],
        "model_build": build,
    }
    path = output / MANIFEST
    for folder in (output, output / "shards"):
        if folder.exists() and not folder.is_dir():
            raise AnnotateError(f"OUTPUT {output} must be a directory: {folder} is a file")
    try:
        (output / "shards").mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a parent that is a file, no permission, a read-only file system
        raise AnnotateError(f"cannot create OUTPUT {output}: {err}") from err
    changed: List[int] = []
    if path.exists():
        previous = _read_manifest(path)
        for field in ("model", "shard_size"):
            if previous.get(field) != manifest[field]:
                raise AnnotateError(
                    f"OUTPUT {output} holds a run with another {field.replace('_', ' ')}; "
                    f"annotate into a new OUTPUT directory, or rerun with the same model, input "
                    f"and shard size"
                )
        if None not in (previous.get("model_build"), build) and previous["model_build"] != build:
            raise AnnotateError(
                f"OUTPUT {output} holds a run with another build of the model {model} (its "
                f"files or its package version differ); annotate into a new OUTPUT directory, "
                f"or rerun with the build it was annotated with"
            )
        old, new = previous.get("shards", []), manifest["shards"]
        earlier = previous.get("format") != MANIFEST_FORMAT or any("digest" not in s for s in old)
        changed = _changed_shards(old, new, earlier)
        if not changed and not earlier:  # (an earlier manifest is rewritten in this format)
            return []
        if changed and not update:
            raise AnnotateError(
                f"OUTPUT {output} holds a run with another input ({len(changed)} of {len(new)} "
                f"shards differ); rerun with --update to annotate those and keep the others, "
                f"or annotate into a new OUTPUT directory"
            )
        try:  # before the new manifest: a crash in between leaves the old one, and the same diff
            for index in changed:
                paths = shard_paths(output, index)
                for file in (paths["docs"], paths["entities"]):  # .spacy first: it marks a shard
                    file.unlink(missing_ok=True)
            if changed:
                (output / ENTITIES).unlink(missing_ok=True)
        except OSError as err:
            raise AnnotateError(f"cannot update OUTPUT {output}: {err}") from err
    try:
        _replace(path, json.dumps(manifest, indent=1).encode("utf8"))
    except OSError as err:
        raise AnnotateError(f"cannot write into OUTPUT {output}: {err}") from err
    return [i for i in changed if i < len(shards)]


def _layout(shard: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in shard.items() if k != "digest"}


def _changed_shards(
    old: List[Dict[str, Any]], new: List[Dict[str, Any]], earlier: bool
) -> List[int]:
    """The indices of the shards of the manifests' lists ``old`` and ``new`` whose documents
    differ (and of the shards only one of them has). Where a shard starts in its file (moved
    by an edit before it) is not what it reads. An ``earlier`` manifest (format 1) holds in each
    shard its whole file's digest (or none, in the first ones): a shard is the same there if it
    has the same place in a file whose content is the same."""
    files: Dict[str, str] = {}

    def same(before: Dict[str, Any], now: Dict[str, Any]) -> bool:
        if not earlier:
            return _read(before) == _read(now)
        if _layout(before) != _layout(now):
            return False
        if "digest" not in before:  # nothing more to compare
            return True
        if now["source"] not in files:
            files[now["source"]] = file_digest(Path(now["source"]))
        return before["digest"] == files[now["source"]]

    return [i for i in range(max(len(old), len(new)))
            if i >= len(old) or i >= len(new) or not same(old[i], new[i])]


def _read(shard: Dict[str, Any]) -> Dict[str, Any]:
    """What a shard's annotation depends on: its documents, their ids, its place in OUTPUT."""
    return {k: v for k, v in shard.items() if k not in ("offset", "line")}


def _read_manifest(path: Path) -> Dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf8"))
    except (OSError, ValueError) as err:
        raise AnnotateError(f"cannot read {path}: {err}") from err


def merge_entities(output: Path, shards: List[Shard]) -> Path:
    """Concatenate the shards' entity files, in input order, into OUTPUT/entities.jsonl."""
    final = output / ENTITIES
    fd, tmp = _mkstemp(final)
    try:
        with os.fdopen(fd, "wb") as out:
            for shard in shards:
                out.write(shard_paths(output, shard.index)["entities"].read_bytes())
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    return final


def _replace(final: Path, data: bytes) -> None:
    tmp = _write_tmp(final, data)
    os.replace(tmp, final)


def read_output(output: Union[str, Path], vocab: Vocab) -> List[Doc]:
    """Every annotated document of OUTPUT, in input order (ids in ``doc.user_data["id"]``)."""
    output = Path(output)
    manifest = _read_manifest(output / MANIFEST)
    docs: List[Doc] = []
    for shard in manifest["shards"]:
        path = shard_paths(output, shard["index"])["docs"]
        if not path.exists():
            raise AnnotateError(f"{path} is missing: the run has not finished; rerun it")
        docs.extend(DocBin().from_disk(path).get_docs(vocab))
    return docs


def read_entities(output: Union[str, Path]) -> List[Dict[str, Any]]:
    """The records of OUTPUT/entities.jsonl (written when the run has annotated every shard)."""
    path = Path(output) / ENTITIES
    if not path.exists():  # said as read_output says it, not as a bare FileNotFoundError
        _read_manifest(Path(output) / MANIFEST)  # no run at all: that is said instead
        raise AnnotateError(f"{path} is missing: the run has not finished; rerun it")
    with path.open(encoding="utf8") as f:
        return [json.loads(line) for line in f if line.strip()]

