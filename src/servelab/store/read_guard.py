"""The read-only rule for queries the master runs for others (``POST /servelab/api/query``).

``servelab sql`` on a file it opens itself switches off DuckDB's external access and locks the
configuration (``analysis.db.lock_down``). The master cannot: those settings are global to its
database instance, and its writer reads every batch from a file (``read_json``). So each query
is checked before it runs, on DuckDB's own parse tree (``json_serialize_sql``):

- every statement is a SELECT (DESCRIBE, SUMMARIZE, SHOW and FROM-first queries parse as one);
- every table it names is a table or view of this database, or a CTE in scope (so no
  ``FROM 'file.csv'`` replacement scan, no other attached catalog);
- every table function is on a short list that touches no file and runs no SQL text
  (no read_csv, read_text, glob, query, ...), or is a table macro of this database;
- every scalar function is one this instance already knows (so no extension is installed or
  loaded on the way), minus the few that read settings or run serialized SQL.
"""
from __future__ import annotations

import json

import duckdb

SAFE_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "json_each", "json_tree", "summary",
    "duckdb_columns", "duckdb_constraints", "duckdb_databases", "duckdb_dependencies",
    "duckdb_functions", "duckdb_indexes", "duckdb_keywords", "duckdb_schemas", "duckdb_sequences",
    "duckdb_tables", "duckdb_types", "duckdb_views", "pragma_table_info", "pragma_version",
})
DENIED_FUNCTIONS = frozenset({"current_setting", "getvariable", "json_deserialize_sql",
                              "json_execute_serialized_sql", "query", "query_table"})
SYSTEM_CATALOGS = frozenset({"", "system", "temp"})
SHOW_LISTS = frozenset({'"tables"', '"databases"', "__show_tables_expanded"})  # SHOW TABLES ...
FIX = ("during a run the master answers read queries only: SELECT over this database's tables "
       "and views; wait for the run to end (or copy the file) for anything else")


class Refused(Exception):
    """A query the master will not run for a reader; the message names what and why."""


class Guard:
    """Checks for one connection (what it knows is read once: nothing is added during a run)."""

    def __init__(self, con: duckdb.DuckDBPyConnection):
        self.con = con
        self.catalog = con.execute("SELECT current_database()").fetchone()[0].lower()
        names = con.execute(
            "SELECT lower(table_name) FROM duckdb_tables() UNION "
            "SELECT lower(view_name) FROM duckdb_views()").fetchall()
        self.relations = {r[0] for r in names}
        funcs = con.execute("SELECT DISTINCT lower(function_name), function_type "
                            "FROM duckdb_functions()").fetchall()
        self.scalars = {n for n, t in funcs if t not in ("table", "table_macro", "pragma")}
        self.table_macros = {n for n, t in funcs if t == "table_macro"}

    def check(self, sql: str) -> None:
        if not isinstance(sql, str) or not sql.strip():
            raise Refused('"sql" must be the text of a SELECT statement')
        statements = self.con.extract_statements(sql)
        if not statements:
            raise Refused("the query holds no SQL statement")
        for st in statements:
            if st.type != duckdb.StatementType.SELECT:
                raise Refused(f"{st.type.name} statements cannot run through the master: {FIX}")
            tree = json.loads(self.con.execute("SELECT json_serialize_sql(?)",
                                               [st.query]).fetchone()[0])
            if tree.get("error"):
                raise Refused(f"the master cannot check this statement "
                              f"({tree.get('error_message')}): {FIX}")
            self._walk(tree["statements"], frozenset())

    # ---- the parse tree -------------------------------------------------------------------
    def _walk(self, node, scope: frozenset) -> None:
        if isinstance(node, list):
            for item in node:
                self._walk(item, scope)
            return
        if not isinstance(node, dict):
            return
        ctes = (node.get("cte_map") or {}).get("map") if isinstance(node.get("cte_map"), dict) \
            else None
        if ctes:
            # A CTE is visible inside the query node that defines it (its own body included,
            # for WITH RECURSIVE), never beside it: a name out of scope is a table, or refused.
            scope = scope | {str(c["key"]).lower() for c in ctes}
        kind = node.get("type")
        if kind == "BASE_TABLE":
            self._relation(node.get("catalog_name") or "", node.get("table_name") or "", scope)
        elif kind == "SHOW_REF" and node.get("table_name") not in (None, "", *SHOW_LISTS):
            self._relation("", node["table_name"], scope)
        elif kind == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            name = str(fn.get("function_name", "")).lower()
            if name not in SAFE_TABLE_FUNCTIONS and name not in self.table_macros:
                raise Refused(f"table function {name}() cannot run through the master (it reads "
                              f"files or runs SQL text): {FIX}")
            self._catalog(fn.get("catalog") or "", name)
            for key, value in node.items():
                if key != "function":
                    self._walk(value, scope)
            self._walk(fn.get("children"), scope)
            return
        elif node.get("class") == "FUNCTION":
            name = str(node.get("function_name", "")).lower()
            if name in DENIED_FUNCTIONS or name not in self.scalars:
                raise Refused(f"function {name}() cannot run through the master: {FIX}")
            self._catalog(node.get("catalog") or "", name)
        for value in node.values():
            if isinstance(value, (dict, list)):
                self._walk(value, scope)

    def _relation(self, catalog: str, name: str, scope: frozenset) -> None:
        self._catalog(catalog, name)
        low = name.lower()
        if low in scope or low in self.relations:
            return
        raise Refused(f"'{name}' is not a table or view of this database (files and other "
                      f"databases cannot be read through the master): {FIX}")

    def _catalog(self, catalog: str, name: str) -> None:
        if catalog.lower() not in SYSTEM_CATALOGS and catalog.lower() != self.catalog:
            raise Refused(f"{catalog}.{name}: only this database can be read through the master")
