"""``slate schema``: a declared data dictionary (``--schema FILE``) written from a site's table.

The file lists the table's feature columns in file order, each text column's categories as this
site's file holds them (sorted), and with ``--statistics`` each numeric column's mean and std.
It is a starting point: the sites edit it into the vocabulary they all declare (the union of
their categories, or a public code list), and every site then holds the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slate.errors import ConfigError

__all__ = ["add_schema_parser", "run_schema"]


def add_schema_parser(sub) -> None:
    """Add ``schema`` to the subparsers ``sub`` of the ``slate`` command."""
    p = sub.add_parser(
        "schema",
        help="write a data dictionary for --schema from a CSV file (JSON on stdout or --out)",
        description="Write the data dictionary of a CSV file, for 'slate train --schema': its "
        "feature columns in file order, their kinds, each text column's categories (this "
        "file's, sorted) and, with --statistics, each numeric column's mean and std. Edit it "
        "into the vocabulary every site declares (docs/data.md): the categories listed here "
        "are this site's, and whoever receives the file sees them.",
    )
    p.add_argument("--train", required=True, metavar="FILE", help="the CSV file to describe")
    p.add_argument("--label-column", required=True, help="the label column (name or index)")
    p.add_argument("--positive-label", required=True, help="the label value that is positive")
    p.add_argument("--out", metavar="FILE", help="write here (never overwritten); default stdout")
    p.add_argument(
        "--statistics",
        action="store_true",
        help="declare each numeric column's mean and std (population) from this file: the "
        "sites then impute and standardise with them, and sum nothing",
    )
    for flag in ("--id-column", "--drop-columns", "--feature-columns", "--categorical-columns",
                 "--na-values"):  # fmt: skip
        p.add_argument(
            flag, action="append", default=None, metavar="A,B",
            dest="id_columns" if flag == "--id-column" else None,
            help="as for 'slate train' (comma list, repeatable)",
        )  # fmt: skip
    p.add_argument("--delimiter", help="as for 'slate train'")
    p.add_argument("--encoding", default="utf-8", help="as for 'slate train'")


def run_schema(args: argparse.Namespace) -> int:
    """``slate schema --train FILE --label-column C --positive-label V [--out FILE]``."""
    from slate.cli.train_flags import comma_items
    from slate.data.dictionary import dictionary_of
    from slate.data.encoding import ColumnChoice
    from slate.data.options import TableOptions

    if args.out is not None and Path(args.out).exists():
        raise ConfigError(f"--out {args.out} exists; slate schema never overwrites a file.")
    choice = ColumnChoice(
        comma_items(args.id_columns), comma_items(args.drop_columns),
        comma_items(args.feature_columns),
    )  # fmt: skip
    options = TableOptions(
        label_column=args.label_column, positive_label=args.positive_label,
        delimiter=args.delimiter, encoding=args.encoding,
        na_values=comma_items(args.na_values),
        categorical_columns=comma_items(args.categorical_columns), choice=choice,
    )  # fmt: skip
    table = options.read(args.train)
    features = choice.features(table.columns, args.train)
    text = json.dumps(
        dictionary_of(table, args.positive_label, features, args.statistics), indent=2
    )
    if args.out is None:
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "x", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"wrote the data dictionary {args.out} ({len(features)} columns) of {args.train}",
              file=sys.stderr)  # fmt: skip
    return 0
