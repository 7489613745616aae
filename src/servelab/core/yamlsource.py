"""YAML parsed together with the line of every key and list item.

PyYAML's composer keeps marks on each node; walking the node tree next to the constructed data
gives a map from a field path such as ``("classes", 1, "prompt_tokens")`` to its 1-based line.
Duplicate keys, which PyYAML silently collapses, are reported here.

The reader is bounded so that a hostile or broken file fails fast with a located error instead of
exhausting memory or the stack: aliases may not refer to themselves, the document may expand
(aliases counted as copies) to at most ``MAX_NODES`` nodes (a 300-byte "billion laughs" file
expands to billions), nesting is limited to ``MAX_DEPTH`` levels (PyYAML's composer recurses), and
a value PyYAML's constructors cannot build (an impossible date, a 5,000-digit integer) is reported
at its line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import yaml

MAX_NODES = 200_000
MAX_DEPTH = 64


@dataclass
class YamlDoc:
    data: object
    lines: dict = field(default_factory=dict)      # path tuple -> line of the key or item
    duplicates: list = field(default_factory=list)  # (path, line, first_line)


class YamlSyntaxError(ValueError):
    def __init__(self, line: int, column: int, message: str):
        super().__init__(message)
        self.line, self.column = line, column


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0
        self._open: list = []        # anchors of the collections being composed
        self._expanded = 0           # nodes of the document with every alias expanded
        self._sizes: dict = {}       # id(node) -> expanded size, for nodes an alias points at

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open:
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} refers to the collection that contains "
                    "it (a recursive alias); allowed aliases of finished values",
                    event.start_mark)
            node = super().compose_node(parent, index)
            size, depth = self._size(node)
            self._count(size, event.start_mark)
            self._deeper(self._depth + depth, event.start_mark)
            return node
        self._count(1, event.start_mark)
        self._depth += 1
        self._deeper(self._depth, event.start_mark)
        anchor = getattr(event, "anchor", None)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if anchor is not None and collection:
            self._open.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None and collection:
                self._open.pop()

    def _count(self, n: int, mark) -> None:
        self._expanded += n
        if self._expanded > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"the document expands to more than {MAX_NODES:,} values (aliases "
                f"count as copies); allowed at most {MAX_NODES:,}", mark)

    def _deeper(self, depth: int, mark) -> None:
        # Aliases count at their full depth: consumers of the data (the line walk, pydantic,
        # repr) recurse through the copies.
        if depth > MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nesting deeper than {MAX_DEPTH} levels (aliases count at their "
                f"full depth); allowed at most {MAX_DEPTH}", mark)

    def _size(self, node) -> tuple[int, int]:
        """(values, depth) of ``node`` with aliases expanded; the graph has no cycles."""
        known = self._sizes.get(id(node))
        if known is not None:
            return known
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        parts = [self._size(n) for n in children]
        known = self._sizes[id(node)] = (1 + sum(p[0] for p in parts),
                                         1 + max((p[1] for p in parts), default=0))
        return known

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, OverflowError, TypeError, RecursionError) as exc:
            shown = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read the value {shown!r} "
                f"({str(exc).split(';')[0]})", node.start_mark) from None


def parse(text: str) -> YamlDoc:
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise YamlSyntaxError(line, column, f"control character #x{exc.character:04x} "
                              "(a YAML file may hold tabs, newlines and printable text; write "
                              "other characters as escapes in a double-quoted string)") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        parts = [p for p in (exc.context, exc.problem) if p]
        raise YamlSyntaxError(mark.line + 1 if mark else 1, mark.column + 1 if mark else 1,
                              "; ".join(parts) or str(exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(1, 1, str(exc)) from None
    finally:
        if loader is not None:
            loader.dispose()
    doc = YamlDoc(data)
    if node is not None:
        doc.lines[()] = node.start_mark.line + 1
        _walk(node, (), doc, set())
    return doc


def _walk(node, path: tuple, doc: YamlDoc, seen_nodes: set) -> None:
    # An aliased collection is walked once: its lines are those of the anchor, and walking each
    # copy would cost the expansion the loader just bounded.
    if id(node) in seen_nodes:
        return
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            line = key_node.start_mark.line + 1
            if key is None:
                continue
            child = path + (key,)
            if key in seen:
                doc.duplicates.append((child, line, seen[key]))
            else:
                seen[key] = line
                doc.lines[child] = line
            _walk(value_node, child, doc, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), doc, seen_nodes)


def field_message(source, doc: YamlDoc | None, path: tuple, problem: str,
                  line: int | None = None) -> str:
    """``source:line: dotted.field: problem``, the line the field's (or ``line``)."""
    if line is None:
        line = line_of(doc, path) if doc is not None else 1
    return f"{source}:{line}: {'.'.join(str(p) for p in path) or '(file)'}: {problem}"


def line_of(doc: YamlDoc, path: tuple) -> int:
    """The line of the deepest known part of ``path`` (a missing key points at its parent)."""
    for end in range(len(path), -1, -1):
        line = doc.lines.get(tuple(path[:end]))
        if line is not None:
            return line
    return 1
