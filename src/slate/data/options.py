"""How a user's table is read and turned into features: :class:`TableOptions`, built once.

``slate train`` builds it from the run's flags (:meth:`TableOptions.from_config`); ``slate
predict`` rebuilds it from what ``model.json`` saved (:meth:`TableOptions.from_saved`). Every
later stage takes these options, never the whole run config.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slate.data.dictionary import DataDictionary, label_flags, read_dictionary
from slate.data.encoding import CategoryLimits, ColumnChoice
from slate.errors import ConfigError

__all__ = ["TableOptions"]


@dataclass(frozen=True)
class TableOptions:
    """The CSV flags: what the label is, how cells are read, and which columns are features.

    Attributes:
        label_column, positive_label: the label column (name or 0-based index) and the label
            value that is positive.
        delimiter, encoding, na_values, categorical_columns: how cells are read
            (:func:`slate.data.readers.delimited.read_table`).
        missing: ``impute`` (missing cells are filled) or ``error`` (they are refused).
        choice: the ID, dropped and feature columns.
        standardize: whether numeric columns are z-scored after encoding.
        limits: how many one-hot columns a text column may get (``--max-categories``,
            ``--min-frequency``).
        dictionary: the declared data dictionary (``--schema``,
            :mod:`slate.data.dictionary`): the label, the text columns and their categories;
            every table read is checked against it. ``None`` without ``--schema``.
    """

    label_column: str | int | None
    positive_label: str | None
    delimiter: str | None = None
    encoding: str = "utf-8"
    na_values: tuple[str, ...] = ()
    categorical_columns: tuple[str, ...] = ()
    missing: str = "impute"
    choice: ColumnChoice = field(default_factory=ColumnChoice)
    standardize: bool = True
    limits: CategoryLimits = field(default_factory=CategoryLimits)
    dictionary: DataDictionary | None = None

    @classmethod
    def from_config(cls, config: Any) -> TableOptions:
        """The options of a :class:`~slate.data.spec.DataSpec` (or of the
        :class:`~slate.config.TrainConfig` it is built from), checked: the label is named, and
        no column is named by two column flags. With ``--schema FILE`` the file is read and
        checked here; its label fills the label flags left out, and its text columns are read as
        text."""
        path = getattr(config, "schema", None)
        dictionary = read_dictionary(path) if path else None
        label_column, positive_label = config.label_column, config.positive_label
        categorical = tuple(config.categorical_columns)
        if dictionary is not None:
            label_column, positive_label = label_flags(dictionary, label_column, positive_label)
            categorical += tuple(c for c in dictionary.text_columns if c not in categorical)
        if label_column is None or positive_label is None:
            raise ConfigError("--dataset csv needs --label-column C and --positive-label V.")
        choice = ColumnChoice(
            tuple(config.id_columns), tuple(config.drop_columns), tuple(config.feature_columns)
        )
        _check_choice(choice, label_column)
        return cls(
            label_column=label_column,
            positive_label=positive_label,
            delimiter=config.delimiter,
            encoding=config.encoding,
            na_values=tuple(config.na_values),
            categorical_columns=categorical,
            missing=config.missing,
            choice=choice,
            standardize=True if config.standardize is None else bool(config.standardize),
            limits=_limits(config),
            dictionary=dictionary,
        )

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> TableOptions:
        """The reading options stored in ``model.json``'s ``input`` section."""
        return cls(
            label_column=saved.get("label_column"),
            positive_label=saved.get("positive_label"),
            delimiter=saved.get("delimiter"),
            encoding=saved.get("encoding", "utf-8"),
            na_values=tuple(saved.get("na_values") or ()),
            categorical_columns=tuple(saved.get("categorical_columns") or ()),
            missing=saved.get("missing", "impute"),
        )

    def read(self, path: str, labels: str = "required", empty_ok: bool = False) -> Any:
        """Read ``path`` as a :class:`~slate.data.readers.table.RawTable` with these options;
        ``labels`` is ``required``, ``single_class_ok`` or ``optional``; ``empty_ok`` accepts a
        header without data rows. With a dictionary the table is checked against it (its
        warnings about values encoded as ``<other>`` in the table's notes)."""
        from slate.data.readers.delimited import read_table

        table = read_table(path, **self._cells(labels), empty_ok=empty_ok)
        return table if self.dictionary is None else self.dictionary.check_table(table)

    def read_chunks(
        self,
        path: str,
        labels: str = "optional",
        numeric_columns: tuple[str, ...] | list[str] = (),
        keep_going: bool = False,
    ) -> Iterator[Any]:
        """``path`` one block of rows at a time (:func:`read_table_chunks`), for scoring files
        of any size; a header without rows gives one chunk of 0 rows. ``numeric_columns`` (a
        model's) are numbers in every chunk, their bad cells listed in the chunk's
        ``bad_cells``; with ``keep_going`` so are rows with the wrong number of cells."""
        from slate.data.readers.chunks import read_table_chunks

        return read_table_chunks(
            path, **self._cells(labels), numeric_columns=tuple(numeric_columns),
            keep_going=keep_going,
        )  # fmt: skip

    def _cells(self, labels: str) -> dict[str, Any]:
        """The reader's arguments for these options."""
        return {
            "label_column": self.label_column,
            "positive_label": self.positive_label,
            "delimiter": self.delimiter,
            "encoding": self.encoding,
            "na_values": self.na_values,
            "categorical_columns": self.categorical_columns,
            "labels": labels,
            "missing": "error" if self.missing == "error" else "allow",
        }


def _check_choice(choice: ColumnChoice, label_column: str | int) -> None:
    """A column is a feature or not, and the label is neither."""
    clash = (set(choice.id_columns) | set(choice.drop_columns)) & set(choice.feature_columns)
    if clash:
        raise ConfigError(
            f"Columns {sorted(clash)} are named by --feature-columns and also by --id-column or "
            "--drop-columns; a column is either a feature or not."
        )
    if label_column in (*choice.id_columns, *choice.drop_columns, *choice.feature_columns):
        raise ConfigError(
            f"The label column {label_column!r} cannot also be an ID, dropped or a feature."
        )


def _limits(config: Any) -> CategoryLimits:
    """``--max-categories`` (0 or None: no limit; else at least 2: a value and ``<other>``) and
    ``--min-frequency`` (at least 1)."""
    most = getattr(config, "max_categories", None) or None
    least = int(getattr(config, "min_frequency", 1))
    if most is not None and most < 2:
        raise ConfigError(
            f"--max-categories must be at least 2 (one value and <other>), or 0 for no limit; "
            f"got {most}."
        )
    if least < 1:
        raise ConfigError(f"--min-frequency must be at least 1 row, got {least}.")
    return CategoryLimits(most, least)
