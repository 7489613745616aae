"""YAML parsed together with the line of every key and list item.

PyYAML's composer keeps marks on each node; walking the node tree next to the constructed data
gives a map from a field path such as ``("classes", 1, "prompt_tokens")`` to its 1-based line.
Duplicate keys, which PyYAML silently collapses, are reported here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import yaml


@dataclass
class YamlDoc:
    data: object
    lines: dict = field(default_factory=dict)      # path tuple -> line of the key or item
    duplicates: list = field(default_factory=list)  # (path, line, first_line)


class YamlSyntaxError(ValueError):
    def __init__(self, line: int, column: int, message: str):
        super().__init__(message)
        self.line, self.column = line, column


def parse(text: str) -> YamlDoc:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        parts = [p for p in (exc.context, exc.problem) if p]
        raise YamlSyntaxError(mark.line + 1 if mark else 1, mark.column + 1 if mark else 1,
                              "; ".join(parts) or str(exc)) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(1, 1, str(exc)) from None
    finally:
        loader.dispose()
    doc = YamlDoc(data)
    if node is not None:
        doc.lines[()] = node.start_mark.line + 1
        _walk(node, (), doc)
    return doc


def _walk(node, path: tuple, doc: YamlDoc) -> None:
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
            _walk(value_node, child, doc)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), doc)


def line_of(doc: YamlDoc, path: tuple) -> int:
    """The line of the deepest known part of ``path`` (a missing key points at its parent)."""
    for end in range(len(path), -1, -1):
        line = doc.lines.get(tuple(path[:end]))
        if line is not None:
            return line
    return 1
