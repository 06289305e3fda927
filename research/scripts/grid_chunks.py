"""The filtered head's prediction with its span representations built a chunk at a time (what
the pipeline does on a CPU) against the whole length group in one piece, side by side in one
process.

    python research/scripts/grid_chunks.py --model training/quick-fsemicrf/model-best \
        --test corpus/test.spacy --output research/results/grid_chunks.json

Documents of 10, 35, 150 and 1,500 tokens are cut from the test set's running text and run
through the pipeline's components before ``fsemicrf_ner`` once; then ``fsemicrf_ner`` alone
annotates fresh copies of them, the two ways alternating, on one thread (thread CPU time,
median of the repeats). "One piece" sets the chunk size beyond any batch. Prints and writes
microseconds of the head per word.
"""
from inference_mode import head_times, parse_args, write

from spacy_fsemicrf.structured import heads

CHUNK = heads.PREDICT_CHUNK_ELEMENTS


def main() -> None:
    args = parse_args(__doc__, ["10:64:12000", "35:64:12000", "150:64:24000", "1500:64:48000",
                                "150:16:12000"])

    def chunk(elements: int):
        return lambda: setattr(heads, "PREDICT_CHUNK_ELEMENTS", elements)

    rows = head_times(args, {"one_piece": chunk(2**62), "chunks": chunk(CHUNK)})
    heads.PREDICT_CHUNK_ELEMENTS = CHUNK
    write(args, rows)


if __name__ == "__main__":
    main()
