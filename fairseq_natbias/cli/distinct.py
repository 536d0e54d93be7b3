"""natbias-distinct: lexical diversity of generated text, distinct-n D_1..D_4
(unique n-grams / n-grams over all texts) and their mean D (Kobayashi et al.,
2023, eqs. 5 and 6)::

    natbias-distinct generate-test.txt          # fairseq-generate output: D- lines
    natbias-distinct hypotheses.txt             # plain text, one text a line
"""

from fairseq_natbias.analysis import distinct
from fairseq_natbias.analysis.generate_output import parse_generate_output, read_text_lines
from fairseq_natbias.cli.common import add_tokenize_argument, parser_for, run_tool

PROG = "natbias-distinct"


def build_parser():
    parser = parser_for(PROG, __doc__)
    parser.add_argument("texts", help="fairseq-generate output or a plain text file")
    add_tokenize_argument(parser)
    parser.add_argument("--max-n", type=int, default=distinct.MAX_N, help="largest n (default 4)")
    return parser


def read_texts(path):
    lines = read_text_lines(path, "fairseq-generate's output or a plain text file")
    generated = parse_generate_output(lines)
    if generated:
        return [s.detokenized if s.detokenized is not None else s.hypothesis
                for _, s in sorted(generated.items()) if s.hypothesis is not None]
    return lines


def run(args):
    scores = distinct.text_diversity(read_texts(args.texts), args.tokenize, args.max_n)
    for name, value in scores.items():
        print(f"{name}\t{value:.4f}")
    return scores


def main(argv=None):
    run_tool(PROG, build_parser, run, argv)


if __name__ == "__main__":
    main()
