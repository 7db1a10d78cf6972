"""Schema management: create the outbox tables, or bring older ones up to date.

`ensure_schema(engine, tables)` creates missing tables and adds what later versions added
to existing ones: nullable columns (`ALTER TABLE ... ADD COLUMN`) and indexes. It never
drops, renames or retypes anything (other jobs, such as reconciliation, read these tables),
and refuses, with `SchemaMismatch`, a missing column it cannot add safely (NOT NULL).
Running it again changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import OperationalError

from outbox.errors import OutboxError
from outbox.models import OutboxTables


class SchemaMismatch(OutboxError):
    """An existing table lacks a column that cannot be added without a migration."""

    def __init__(self, table: str, column: str) -> None:
        self.table = table
        self.column = column
        super().__init__(
            f"table {table!r} lacks the NOT NULL column {column!r}: migrate it by hand"
        )


class TablesMissing(OutboxError):
    """The database lacks outbox tables (or columns a later version added): create them."""

    FIX = (
        "create them with `reliable worker resend --ensure-schema`, "
        "`outbox.ensure_schema(engine, tables)` or `tables.create_all(engine)`"
    )

    def __init__(self, where: str, missing: list[str]) -> None:
        self.where = where
        self.missing = missing
        super().__init__(f"outbox tables missing in {where}: {', '.join(missing)}; {self.FIX}")


def missing_schema(engine: Engine, tables: OutboxTables) -> list[str]:
    """The outbox tables (`name`) and columns (`name.column`) the database lacks."""
    inspector = inspect(engine)
    missing: list[str] = []
    for table in tables.metadata.sorted_tables:
        if not inspector.has_table(table.name, schema=table.schema):
            missing.append(table.name)
            continue
        present = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
        missing.extend(f"{table.name}.{c.name}" for c in table.columns if c.name not in present)
    return missing


def require_tables(engine: Engine, tables: OutboxTables, *, unreachable_ok: bool = False) -> None:
    """Raise `TablesMissing` (one line naming the fix) when the outbox tables are not all
    there. A database that cannot be reached raises its `OperationalError`, or, with
    `unreachable_ok`, passes (a guard started while its database is down retries later)."""
    try:
        missing = missing_schema(engine, tables)
    except OperationalError:
        if unreachable_ok:
            return
        raise
    if missing:
        where = engine.url.render_as_string(hide_password=True)
        raise TablesMissing(where, missing)


@dataclass
class SchemaReport:
    created_tables: list[str] = field(default_factory=list)
    added_columns: list[str] = field(default_factory=list)  # "table.column"
    created_indexes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created_tables or self.added_columns or self.created_indexes)


def ensure_schema(engine: Engine, tables: OutboxTables) -> SchemaReport:
    """Create or complete the outbox tables on `engine`; report what was changed."""
    report = SchemaReport()
    inspector = inspect(engine)
    prep = engine.dialect.identifier_preparer
    for table in tables.metadata.sorted_tables:
        if not inspector.has_table(table.name, schema=table.schema):
            table.create(engine)
            report.created_tables.append(table.name)
            continue
        present = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
        missing = [c for c in table.columns if c.name not in present]
        for column in missing:
            if not column.nullable:
                raise SchemaMismatch(table.name, column.name)
        with engine.begin() as conn:
            for column in missing:
                kind = column.type.compile(dialect=engine.dialect)
                conn.execute(
                    text(
                        f"ALTER TABLE {prep.format_table(table)} "
                        f"ADD COLUMN {prep.format_column(column)} {kind}"
                    )
                )
                report.added_columns.append(f"{table.name}.{column.name}")
        indexes = {ix["name"] for ix in inspector.get_indexes(table.name, schema=table.schema)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(engine)
                report.created_indexes.append(str(index.name))
    return report
