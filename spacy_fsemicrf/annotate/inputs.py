"""The input of ``annotate``: finding the files, splitting them into shards, reading a shard.

INPUT is a ``.spacy`` file, a ``.jsonl`` file (one JSON object a line with a ``text`` field and
an optional ``id``) or a directory searched recursively for both. A shard is a run of at most
``shard_size`` consecutive documents of one file; the plan depends only on the input and the
shard size, so a rerun finds the same shards, and each shard has a digest of the documents it
reads, so a rerun can tell which shards an edit of the input changed.

Document ids: the record's ``id`` (``.jsonl``) or ``doc.user_data["id"]`` (``.spacy``), else
``"<file>:<n>"`` with the file's path relative to INPUT and the document's 0-based position.
"""
import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy
import srsly
from spacy.attrs import ORTH
from spacy.tokens import Doc, DocBin
from spacy.vocab import Vocab

SUFFIXES = (".jsonl", ".spacy")
DEFAULT_SHARD_SIZE = 1000
_EMPTY_USER_DATA = srsly.msgpack_dumps({})


class AnnotateError(Exception):
    """A problem with the model, the input or the output directory, worded for the user."""


@dataclass(frozen=True)
class Shard:
    """Documents ``start .. start + count - 1`` of one input file."""

    index: int  # position in the output; names the shard's files
    source: str  # absolute path of the input file
    name: str  # the file's path relative to INPUT (default document ids)
    start: int
    count: int
    offset: int = 0  # .jsonl: byte offset of the first record
    line: int = 0  # .jsonl: 1-based line number of the first record
    digest: str = ""  # the shard's documents (BLAKE2b) when the run was planned

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def input_files(path: Path) -> List[Tuple[Path, str]]:
    """``(file, name relative to INPUT)`` of every input file, in a fixed (sorted) order."""
    if not path.exists():
        raise AnnotateError(f"INPUT {path} does not exist")
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise AnnotateError(f"INPUT {path} is neither a .spacy nor a .jsonl file")
        return [(path.resolve(), path.name)]
    files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise AnnotateError(f"INPUT directory {path} has no .spacy or .jsonl file")
    return [(p.resolve(), p.relative_to(path).as_posix()) for p in files]


def plan_shards(path: Path, shard_size: int) -> List[Shard]:
    """Split every input file into shards of at most ``shard_size`` documents."""
    if shard_size < 1:
        raise AnnotateError(f"the shard size must be at least 1, got {shard_size}")
    shards: List[Shard] = []
    for file, name in input_files(path):
        if file.suffix == ".jsonl":
            starts, n_records, digests = _jsonl_shard_starts(file, shard_size)
            for (offset, line), digest, first in zip(starts, digests,
                                                     range(0, n_records, shard_size)):
                count = min(shard_size, n_records - first)
                shards.append(Shard(len(shards), str(file), name, first, count, offset, line,
                                    digest))
        else:
            n_docs, digests = _spacy_shard_digests(file, shard_size)
            for digest, first in zip(digests, range(0, n_docs, shard_size)):
                count = min(shard_size, n_docs - first)
                shards.append(Shard(len(shards), str(file), name, first, count, digest=digest))
    return shards


def read_shard(
    shard: Shard, vocab: Vocab, max_length: Optional[int] = None
) -> Tuple[List[Any], List[Any]]:
    """The shard's documents (texts for .jsonl, unannotated Docs for .spacy) and their ids.

    Raises AnnotateError for an unreadable file, a line that is not a JSON object, a
    document with no text or a text longer than ``max_length`` characters (the pipeline's
    ``nlp.max_length``, which ``nlp.pipe`` refuses a text over)."""
    if shard.source.endswith(".jsonl"):
        return _read_jsonl(shard, max_length)
    return _read_spacy(shard, vocab)


def _jsonl_shard_starts(
    file: Path, shard_size: int
) -> Tuple[List[Tuple[int, int]], int, List[str]]:
    """``(byte offset, line number)`` of the first record (non-blank line) of every shard, the
    number of records and every shard's digest (of its lines, up to the next shard's first).
    Only the shards' starts are kept: a file may hold more records than the driver could keep a
    tuple of each in memory."""
    starts = []
    digests: List[str] = []
    offset = 0
    n_records = 0
    digest = hashlib.blake2b(digest_size=16)
    try:
        with file.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                if raw.strip():
                    if n_records % shard_size == 0:
                        if starts:  # the blank lines before a shard end the one before it
                            digests.append(digest.hexdigest())
                            digest = hashlib.blake2b(digest_size=16)
                        starts.append((offset, number))
                    n_records += 1
                digest.update(raw)
                offset += len(raw)
    except OSError as err:
        raise AnnotateError(f"cannot read {file}: {err}") from err
    if starts:
        digests.append(digest.hexdigest())
    return starts, n_records, digests


def _spacy_shard_digests(file: Path, shard_size: int) -> Tuple[int, List[str]]:
    """The number of documents of a .spacy file and every shard's digest of what
    :func:`_read_spacy` reads (the words, their spacing, the stored ``user_data`` that holds
    the id), from one read of the file."""
    docbin = _docbin_from_bytes(_read_bytes(file), file)
    orth = docbin.attrs.index(ORTH)
    n_docs = len(docbin.tokens)
    digests = []
    for first in range(0, n_docs, shard_size):
        digest = hashlib.blake2b(digest_size=16)
        for i in range(first, min(first + shard_size, n_docs)):
            user_data = docbin.user_data[i] if i < len(docbin.user_data) else b""
            parts = (numpy.ascontiguousarray(docbin.tokens[i][:, orth]).tobytes(),
                     numpy.ascontiguousarray(docbin.spaces[i]).tobytes(),
                     b"?" if docbin.flags[i].get("has_unknown_spaces") else b"",
                     user_data or b"")
            for part in parts:  # each with its length: the documents' bytes do not run together
                digest.update(len(part).to_bytes(8, "little"))
                digest.update(part)
        digests.append(digest.hexdigest())
    return n_docs, digests


def file_digest(file: Path) -> str:
    """The digest (BLAKE2b) of a whole file, as each shard of a manifest of format 1 held."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        raise AnnotateError(f"cannot read {file}: {err}") from err
    return digest.hexdigest()


def _read_bytes(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as err:
        raise AnnotateError(f"cannot read {file}: {err}") from err


def _read_jsonl(shard: Shard, max_length: Optional[int] = None) -> Tuple[List[str], List[Any]]:
    texts: List[str] = []
    ids: List[Any] = []
    try:
        with open(shard.source, "rb") as f:
            f.seek(shard.offset)
            number = shard.line - 1
            while len(texts) < shard.count:
                raw = f.readline()
                number += 1
                if not raw:
                    raise AnnotateError(f"{shard.name} ended before line {number}: it changed "
                                        f"since the run started")
                if not raw.strip():
                    continue
                where = f"{shard.name}:{number}"
                try:
                    record = json.loads(raw)
                except UnicodeDecodeError as err:
                    raise AnnotateError(f"{where}: not UTF-8 (byte {raw[err.start]:#04x} at "
                                        f"column {err.start + 1})") from err
                except ValueError as err:
                    raise AnnotateError(f"{where}: not valid JSON ({err})") from err
                if not isinstance(record, dict):
                    raise AnnotateError(f"{where}: expected a JSON object with a 'text' field")
                text = record.get("text")
                if not isinstance(text, str) or not text.strip():
                    raise AnnotateError(f"{where}: the document has no text (its 'text' field "
                                        f"must be a non-empty string)")
                if max_length is not None and len(text) > max_length:
                    raise AnnotateError(f"{where}: the document has {len(text)} characters, more "
                                        f"than the pipeline's nlp.max_length ({max_length}): "
                                        f"split it")
                doc_id = record.get("id", f"{shard.name}:{shard.start + len(ids)}")
                try:  # JSON escapes may make a lone surrogate, which no UTF-8 output can hold
                    text.encode("utf8")
                    if isinstance(doc_id, str):
                        doc_id.encode("utf8")
                    else:  # the shard stores it with msgpack, whose integers have 64 bits,
                        srsly.msgpack_dumps(doc_id)
                        # and entities.jsonl in strict JSON (Python's json reads NaN too)
                        json.dumps(doc_id, allow_nan=False)
                except UnicodeEncodeError as err:
                    raise AnnotateError(f"{where}: not valid Unicode ({err})") from err
                except OverflowError as err:
                    raise AnnotateError(f"{where}: the 'id' holds an integer out of the 64-bit "
                                        f"range the output can store: give it as a string") from err
                except ValueError as err:
                    raise AnnotateError(f"{where}: the 'id' holds NaN or Infinity, which the "
                                        f"output's JSON cannot: give it as a string") from err
                texts.append(text)
                ids.append(doc_id)
    except OSError as err:
        raise AnnotateError(f"cannot read {shard.source}: {err}") from err
    return texts, ids


def _read_spacy(shard: Shard, vocab: Vocab) -> Tuple[List[Doc], List[Any]]:
    docbin = _load_docbin(shard.source, *_stamp(Path(shard.source)))
    # Only the words and their spacing are kept: entities already on the doc (gold ones, say)
    # would be kept by the entity recognizers and hide their predictions. The docs are built
    # from the stored token columns, as DocBin.get_docs does, without restoring the other
    # annotations (nor making a lexeme of every string of the file, for every shard).
    for string in docbin.strings:
        vocab.strings.add(string)
    orth = docbin.attrs.index(ORTH)
    docs: List[Doc] = []
    ids: List[Any] = []
    for i in range(shard.start, shard.start + shard.count):
        unknown_spaces = docbin.flags[i].get("has_unknown_spaces")
        words = docbin.tokens[i][:, orth]
        doc = Doc(vocab, words=words, spaces=None if unknown_spaces else docbin.spaces[i])
        if not doc.text.strip():
            raise AnnotateError(f"{shard.name}: document {i} has no text")
        docs.append(doc)
        ids.append(_user_data(docbin, i).get("id", f"{shard.name}:{i}"))
    return docs, ids


def _user_data(docbin: DocBin, i: int) -> Dict[Any, Any]:
    """Document ``i``'s stored ``user_data`` (an empty one is not decoded: srsly's msgpack
    calls cost about 0.2 ms each, as much as annotating a short document)."""
    data = docbin.user_data[i] if i < len(docbin.user_data) else None
    if not data or data == _EMPTY_USER_DATA:
        return {}
    return srsly.msgpack_loads(data, use_list=False)


def _stamp(file: Path) -> Tuple[int, int]:
    """Size and modification time: a file that changes is loaded again."""
    try:
        stat = file.stat()
    except OSError as err:
        raise AnnotateError(f"cannot read {file}: {err}") from err
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=1)
def _load_docbin(path: str, size: int, mtime_ns: int) -> DocBin:
    """The DocBin of a .spacy file, kept for the next shard of the same file (a worker usually
    gets several in a row)."""
    return _docbin_from_bytes(_read_bytes(Path(path)), path)


def _docbin_from_bytes(data: bytes, path: Union[str, Path]) -> DocBin:
    try:
        return DocBin(store_user_data=True).from_bytes(data)
    except Exception as err:  # zlib and msgpack errors alike mean an unreadable file
        raise AnnotateError(f"cannot read {path} as a .spacy file: {err}") from err
