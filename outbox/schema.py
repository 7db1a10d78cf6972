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

from outbox.errors import OutboxError
from outbox.models import OutboxTables


class SchemaMismatch(OutboxError):
    """An existing table lacks a column that cannot be added without a migration."""

    def __init__(self, table: str, column: str) -> None:
        self.table = table
        self.column = column
        super().__init__(f"table {table!r} lacks the NOT NULL column {column!r}: "
                         "migrate it by hand")


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
                conn.execute(text(f"ALTER TABLE {prep.format_table(table)} "
                                  f"ADD COLUMN {prep.format_column(column)} {kind}"))
                report.added_columns.append(f"{table.name}.{column.name}")
        indexes = {ix["name"] for ix in inspector.get_indexes(table.name, schema=table.schema)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(engine)
                report.created_indexes.append(str(index.name))
    return report
