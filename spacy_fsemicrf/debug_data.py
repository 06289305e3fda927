"""``python -m spacy_fsemicrf debug-data CONFIG``: the entity checks of ``spacy debug data``
for the ``fsemicrf_ner`` components of a training config.

``spacy debug data`` checks the corpora, the vocabulary and the components it knows, and its
entity checks look for a component named by spaCy's ``ner`` factory only. This command reads
the same corpora the same way (the config's ``[training]`` train and dev corpora, command-line
overrides applied, the pipeline's tokenizer) and reports, for each ``fsemicrf_ner`` component,
what its training will read: the entities it trains on and those it leaves out (wider than a
span head's ``max_width``, or not on token edges of the pipeline's tokenization), the labels
left with no entity to learn from (or with none at all), the tokens without entity annotation
(unknown to the loss), and the dev entities it cannot predict.
Exit status 1 when a check fails (no entity to train on), as ``spacy debug data``.
"""
import argparse
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Set, Tuple

from spacy import util
from spacy.cli._util import import_code, parse_config_overrides, show_validation_error
from spacy.language import Language
from spacy.schemas import ConfigSchemaTraining
from spacy.tokens import Span
from spacy.training import Example
from spacy.util import registry, resolve_dot_names
from thinc.api import Config
from wasabi import MESSAGES, Printer

from .calibration import fsemicrf_components
from .gold import example_entities, incorrect_entities, unlearned_reason
from .partial import known_tokens

# as spacy debug data: fewer examples of a label than this are too few to learn it
NEW_LABEL_THRESHOLD = 50
SHOWN = 5  # examples of each problem shown with --verbose


class CorpusReport(NamedTuple):
    """What one component's training reads of one corpus."""

    docs: int
    annotated: int  # docs with entity annotation (the others are not read)
    tokens: int  # tokens of the annotated docs (the pipeline's tokenization)
    unknown: int  # tokens of them without entity annotation, whitespace aside
    labels: Counter  # entities kept, by label
    wide: Counter  # entities left out for their width, by label
    widest: Dict[str, int]  # the widest of them, by label
    misaligned: List[str]  # texts of the entities not on token edges
    misaligned_labels: Set[str]  # their labels
    whitespace: int  # entities that start or end on a whitespace token
    crossing: int  # entities across a sentence boundary of the reference
    incorrect: int  # spans known to be wrong that training reads (each once in its doc)
    incorrect_given: int  # all spans known to be wrong
    incorrect_repeated: int  # of them, duplicates of another span of their doc (read once)


def _distinct(spans: Iterable[Span]) -> Set[Tuple[int, int, str]]:
    """The ``(start, end, label)`` of ``spans``: a span repeated in a span group is one entity
    known to be wrong for training (the component's ``_incorrect_rows``)."""
    return {(span.start, span.end, span.label_) for span in spans}


def corpus_report(
    examples: Iterable[Example], limit: Optional[int], key: Optional[str] = None,
    labels_known: Iterable[str] = (),
) -> CorpusReport:
    """Count what a component with the width limit ``limit`` (None: no limit) reads of
    ``examples``, entity by entity as its training does (:func:`~.gold.example_entities`), and
    with ``key`` (its ``incorrect_spans_key``) the entities known to be wrong it reads for
    ``labels_known`` (:func:`~.gold.incorrect_entities`), each once in its document."""
    docs = annotated = tokens = unknown = whitespace = crossing = 0
    incorrect = incorrect_given = incorrect_repeated = 0
    labels: Counter = Counter()
    wide: Counter = Counter()
    widest: Dict[str, int] = {}
    misaligned: List[str] = []
    misaligned_labels: Set[str] = set()
    labels_known = set(labels_known)
    for eg in examples:
        docs += 1
        split = example_entities(eg, limit)
        wrong = incorrect_entities(eg, key, labels_known, limit)
        incorrect += len(_distinct(wrong))
        given = eg.reference.spans[key] if key in eg.reference.spans else []
        incorrect_given += len(given)
        incorrect_repeated += len(given) - len(_distinct(given))
        if split is None and not wrong:
            continue
        annotated += 1
        ref = eg.reference
        # the tokens of the predicted doc the loss reads as unknown, as training marks them
        known = known_tokens(eg, *(split[1:] if split is not None else ()))
        tokens += len(eg.predicted)
        unknown += 0 if known is None else int((~known).sum())
        if split is None:  # spans known to be wrong only: no entity
            continue
        labels.update(ent.label_ for ent in split.kept)
        wide.update(ent.label_ for ent in split.wide)
        for ent in split.wide:
            widest[ent.label_] = max(widest.get(ent.label_, 0), len(ent))
        misaligned.extend(ent.text for ent in split.misaligned)
        misaligned_labels.update(ent.label_ for ent in split.misaligned)
        whitespace += sum(ent[0].is_space or ent[-1].is_space for ent in ref.ents)
        if ref.has_annotation("SENT_START"):
            crossing += sum(any(token.is_sent_start for token in ent[1:]) for ent in ref.ents)
    return CorpusReport(docs, annotated, tokens, unknown, labels, wide, widest, misaligned,
                        misaligned_labels, whitespace, crossing, incorrect, incorrect_given,
                        incorrect_repeated)


def unlearned_labels(report: CorpusReport, unlearned: Set[str]) -> List[str]:
    """The labels of ``unlearned`` (those a component has not learned when training starts)
    with no training entity in ``report`` that is kept: all left out, as too wide or off the
    pipeline's tokens, or none at all (named where the training data has entities; else no
    entity is to train on). Training never learns them, and the component says so (once)."""
    if not (report.labels or report.wide or report.misaligned):
        return []
    return sorted(unlearned - set(report.labels))


def _counts(counter: Counter) -> str:
    return ", ".join(f"'{label}' ({count})" for label, count in sorted(counter.items()))


def training_labels(nlp: Language, name: str, config: Config) -> Optional[Set[str]]:
    """The labels the component ``name`` of ``nlp`` (built from the training config, whose
    interpolated form is ``config``) starts training with: its own where it has them (sourced
    from a trained pipeline, which ``spacy train`` does not initialize again), else
    ``[initialize.components.NAME] labels`` where given, else None (those of the training
    entities, as its ``initialize`` takes them)."""
    pipe = nlp.get_pipe(name)
    if pipe.labels:
        return set(pipe.labels)
    settings = config["initialize"]["components"].get(name, {})
    given = registry.resolve({"settings": settings})["settings"].get("labels")
    return None if given is None else set(given)


def report_component(
    msg: Printer, name: str, pipe: Any, train: List[Example], dev: List[Example], verbose: bool,
    labels: Optional[Set[str]] = None, frozen: bool = False,
) -> None:
    """Print the checks of the component ``name`` on the ``train`` and ``dev`` examples;
    ``labels`` are those it trains with (:func:`training_labels`; None: those of the ``train``
    entities); ``frozen``: in ``[training] frozen_components`` (spacy train does not update
    it)."""
    limit = pipe.max_width if pipe.span_head else None
    msg.divider(f"fsemicrf_ner: {name}")
    head = pipe.model.attrs.get("arch", "?")
    msg.info(f"Head {head}: " + (f"entities of at most max_width={limit} tokens"
                                 if limit is not None else "no limit on an entity's width"))
    key = pipe.incorrect_spans_key
    found = {ent.label_ for eg in train for ent in eg.reference.ents}
    if labels is None:  # the labels the component is initialized with from the training data
        labels = found
    # update adds a label new to the component, as spaCy's ner (a frozen one is not trained)
    new = [] if frozen else sorted(found - labels)
    tr = corpus_report(train, limit, key, labels | set(new))
    dv = corpus_report(dev, limit)
    msg.text(f"{tr.docs} training docs, {tr.annotated} with entity annotation; {dv.docs} "
             f"evaluation docs, {dv.annotated} with entity annotation")
    if tr.annotated < tr.docs:
        msg.warn(f"{tr.docs - tr.annotated} training docs have no entity annotation: training "
                 f"reads nothing from them (annotate them with no entities to teach 'none here')")
    if not tr.labels:
        msg.fail("No entities to train on in the training data")
    else:
        msg.good(f"{sum(tr.labels.values())} entities to train on, {len(tr.labels)} label(s)")
        msg.text(f"Labels in train data: {_counts(tr.labels)}", show=verbose)
    if new:
        msg.warn(f"Labels in the training data that the component does not have: "
                 f"{', '.join(repr(label) for label in new)}: training adds them to it"
                 + (" (its head grows; train on examples of its other labels too, or it "
                    "forgets them)" if pipe.labels else
                    f" (they are not in [initialize.components.{name}.labels])"))
    if tr.unknown:
        msg.info(f"{tr.unknown} of {tr.tokens} tokens of the annotated training docs "
                 f"({100 * tr.unknown / tr.tokens:.1f}%) are unknown to the loss (an entity or "
                 f"none): without entity annotation, as for spaCy's ner (a whitespace token "
                 f"without it is outside any entity), or in an entity left out")
    if key is not None:
        left = tr.incorrect_given - tr.incorrect_repeated - tr.incorrect
        repeated = (f"{tr.incorrect_repeated} duplicates of another span of their doc (read "
                    f"once), " if tr.incorrect_repeated else "")
        msg.info(f"{tr.incorrect_given} training spans in doc.spans[{key!r}], entities known to "
                 f"be wrong: {tr.incorrect} read, {repeated}{left} left out (a label the "
                 f"component does not have, edges off the pipeline's tokens, or wider than "
                 f"max_width: the component could never predict them)")
    low = {label: n for label, n in tr.labels.items() if n <= NEW_LABEL_THRESHOLD}
    for label, n in sorted(low.items()):
        msg.warn(f"Low number of examples for label '{label}' ({n})")
    # the labels training starts without having learned: all where it initializes the
    # component, else those it adds (spacy train initializes no sourced or frozen component)
    unlearned = unlearned_labels(tr, set(new) | (set() if pipe.labels or frozen else labels))
    for label in unlearned:
        reason = unlearned_reason(label, "the training data", pipe.max_width,
                                  tr.widest.get(label), label in tr.misaligned_labels)
        msg.warn(reason[0].upper() + reason[1:])
    if not low and not unlearned and tr.labels:
        msg.good("Good amount of examples for all labels")
    if tr.wide:
        msg.warn(f"{sum(tr.wide.values())} training entities wider than max_width={limit} "
                 f"tokens are left out of training (their tokens unknown): {_counts(tr.wide)}; "
                 f"max_width={max(tr.widest.values())} would keep them all")
    elif limit is not None:
        msg.good(f"No training entity wider than max_width={limit}")
    for corpus, rep in (("training", tr), ("evaluation", dv)):
        if rep.misaligned:
            msg.warn(f"{len(rep.misaligned)} {corpus} entities do not start or end on a token "
                     f"edge of the pipeline's tokenization: "
                     + ("left out of training (their tokens unknown); train on the corpus's "
                        "tokens ([corpora.train] gold_preproc = true) or adjust the tokenizer"
                        if corpus == "training" else "the component cannot predict them"))
            msg.text("E.g. " + ", ".join(repr(t) for t in rep.misaligned[:SHOWN]), show=verbose)
    if not tr.misaligned and not dv.misaligned:
        msg.good("All entities start and end on token edges of the pipeline's tokenization")
    # the labels it can predict: a sourced component's own and those it trains on (a label
    # of wide training entities only is never trained on; a frozen component is not trained)
    known = " or ".join(where for where, has in (("the component's labels", pipe.labels),
                                                 ("the training data", not frozen)) if has)
    predicted = set(pipe.labels) | (set() if frozen else set(tr.labels))
    unseen = sorted((set(dv.labels) | set(dv.wide)) - predicted)
    # those named above (training data with none kept, or given labels with none) apart
    named = [label for label in unseen if label in unlearned]
    absent = [label for label in unseen if label not in unlearned]
    if absent:
        msg.warn(f"Labels in the evaluation data but not in {known}, which the component "
                 f"cannot predict: {', '.join(repr(label) for label in absent)}")
    if named:
        msg.warn(f"Labels in the evaluation data that training does not learn (named above), "
                 f"which the component cannot predict: {', '.join(map(repr, named))}")
    if dv.wide:
        msg.warn(f"{sum(dv.wide.values())} evaluation entities are wider than "
                 f"max_width={limit} tokens, which the component cannot predict: "
                 f"{_counts(dv.wide)}; max_width={max(dv.widest.values())} would let it predict "
                 f"them all")
    for corpus, rep in (("training", tr), ("evaluation", dv)):
        if rep.whitespace:
            msg.warn(f"{rep.whitespace} {corpus} entities start or end on a whitespace token; "
                     f"the component never predicts one that does (it trims them)")
        if rep.crossing:
            msg.warn(f"{rep.crossing} {corpus} entities cross a sentence boundary; with "
                     f"sentence boundaries set before it, the component predicts none that does")
    if not (tr.whitespace or dv.whitespace or tr.crossing or dv.crossing):
        msg.good("No entities starting or ending on whitespace or crossing sentence boundaries")


def load_training(config_path: Path, overrides: Dict[str, Any]):
    """``(nlp, train examples, dev examples)`` of a training config, as ``spacy debug data``
    reads them (the pipeline is built, not initialized)."""
    with show_validation_error(config_path):
        cfg = util.load_config(config_path, overrides=overrides)
        nlp: Language = util.load_model_from_config(cfg)
        config = nlp.config.interpolate()
        T = registry.resolve(config["training"], schema=ConfigSchemaTraining)
    names = [T["train_corpus"], T["dev_corpus"]]
    try:
        readers = resolve_dot_names(config, names)
    except KeyError as err:  # (spaCy's debug data stops with the bare KeyError)
        raise ValueError(f"the config has no section [{err.args[0]}] for the corpora "
                         f"{' and '.join(names)} of [training]") from err
    corpora = []
    for name, reader in zip(names, readers):
        try:
            corpora.append(list(reader(nlp)))
        except (OSError, ValueError) as err:  # (spaCy's E1014 is a ValueError)
            raise ValueError(f"cannot read the corpus {name}: {err}") from err
    return nlp, corpora[0], corpora[1]


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m spacy_fsemicrf debug-data CONFIG [--code PATH] [--verbose] [--no-format]
    [--section.key value ...]``; exit status 1 when a check fails."""
    parser = argparse.ArgumentParser(
        prog="python -m spacy_fsemicrf debug-data",
        description="The entity checks of spacy debug data for the fsemicrf_ner components of "
        "a training config: what their training reads of the config's corpora.",
        epilog="Config overrides as for spacy train, e.g. --paths.train corpus/train.spacy.",
    )
    parser.add_argument("config", type=Path, help="the training config (.cfg)")
    parser.add_argument("--code", type=Path, default=None,
                        help="Python file with the config's custom registered functions")
    parser.add_argument("--verbose", "-V", action="store_true", help="show more detail")
    parser.add_argument("--no-format", "-NF", action="store_true",
                        help="plain output, without colours or symbols")
    args, extra = parser.parse_known_args(argv)
    if not args.config.is_file():
        parser.error(f"no such config file: {args.config}")
    try:
        overrides = parse_config_overrides(list(extra))
    except SystemExit:  # spaCy's parser says why, then exits
        parser.error(f"cannot read the config overrides {' '.join(extra)}")
    import_code(args.code)
    try:
        nlp, train, dev = load_training(args.config, overrides)
    except ValueError as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    msg = Printer(pretty=not args.no_format)
    names = fsemicrf_components(nlp)
    if not names:
        msg.fail(f"The config's pipeline has no fsemicrf_ner component (its components: "
                 f"{', '.join(nlp.pipe_names) or 'none'})")
    config = nlp.config.interpolate()
    frozen = config["training"].get("frozen_components", [])
    for name in names:
        report_component(msg, name, nlp.get_pipe(name), train, dev, args.verbose,
                         training_labels(nlp, name, config), name in frozen)
    counts = msg.counts
    msg.divider("Summary")
    msg.text(f"{counts[MESSAGES.GOOD]} checks passed, {counts[MESSAGES.WARN]} warnings, "
             f"{counts[MESSAGES.FAIL]} errors")
    return 1 if counts[MESSAGES.FAIL] else 0
