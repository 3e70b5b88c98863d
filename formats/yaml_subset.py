"""The YAML subset model configs use (taming-transformers' ``vqgan.yaml``).

PyYAML is not a dependency, so :func:`load_yaml` uses it when installed and
:func:`parse_simple_yaml` otherwise; both resolve plain scalars alike and raise
``ValueError`` for text they cannot read.
"""
from __future__ import annotations

import json
import re


def load_yaml(text: str):
    """``yaml.safe_load`` when PyYAML is installed (it is not a dependency), else
    :func:`parse_simple_yaml`."""
    try:
        import yaml
    except ImportError:
        return parse_simple_yaml(text)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:  # one error type for both parsers
        raise ValueError(str(err)) from err


# YAML 1.1 plain scalars as PyYAML's safe loader resolves them (so both parsers agree)
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {v: v.lower() in ("yes", "true", "on") for v in
         "yes Yes YES no No NO true True TRUE false False FALSE on On ON off Off OFF".split()}
_INT = re.compile(r"[-+]?(0|[1-9][0-9_]*)")  # decimal only (no octal, hex or sexagesimal)
_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?|\.[0-9][0-9_]*([eE][-+][0-9]+)?")
_SPECIAL_FLOATS = {f"{sign}.{inf}": float(f"{sign or '+'}inf")
                   for sign in ("", "+", "-") for inf in ("inf", "Inf", "INF")}
_SPECIAL_FLOATS.update({f".{nan}": float("nan") for nan in ("nan", "NaN", "NAN")})


def _scalar(s: str):
    s = s.strip()
    if s[:1] in ("'", '"'):
        if len(s) < 2 or s[-1] != s[0]:
            raise ValueError(f"unterminated string {s!r}")
        return s[1:-1].replace("''", "'") if s[0] == "'" else json.loads(s)  # yaml's escapes ~ json's
    if s[:1] in ("[", "{"):
        return _flow(s)
    if s[:1] in ("&", "*", "!", "|", ">", "%", "@", "`"):
        raise ValueError(f"unsupported yaml feature in {s!r}")
    if _NULL.fullmatch(s):
        return None
    if s in _BOOL:
        return _BOOL[s]
    if _INT.fullmatch(s):
        return int(s.replace("_", ""))
    if _FLOAT.fullmatch(s):
        return float(s.replace("_", ""))
    if s in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[s]
    return s


def _split_top(s: str) -> list[str]:
    """Split a flow collection's body at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, None, 0
    for i, c in enumerate(s):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"" and (i == 0 or s[i - 1] in " [{,"):
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    return [p.strip() for p in parts if p.strip()]


def _flow(s: str):
    close = {"[": "]", "{": "}"}[s[0]]
    if not s.endswith(close):
        raise ValueError(f"unterminated flow collection {s!r}")
    items = _split_top(s[1:-1])
    if close == "]":
        return [_scalar(p) for p in items]
    return {key: _scalar(value or "") for key, value in map(_key_value, items)}


def _key_value(s: str) -> tuple:
    """``key: value`` -> ``(key, value text or None)``."""
    m = re.match(r"""("[^"]*"|'[^']*'|[^'"{}\[\],:#][^:#]*?)\s*:(?:\s+(.*))?$""", s)
    if not m:
        raise ValueError(f"expected 'key: value', got {s!r}")
    return _scalar(m.group(1)), m.group(2)


def _strip_comment(line: str) -> str:
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"" and (i == 0 or line[i - 1] in " \t[{,"):  # a quote opens only a quoted scalar
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_simple_yaml(text: str):
    """A small yaml reader for config files such as ``vqgan.yaml``: nested block
    mappings and sequences, flow lists and mappings of scalars, quoted and plain
    scalars (resolved as PyYAML's safe loader does), comments.  Anchors, tags and
    multi-line scalars raise ``ValueError``."""
    lines = []
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if line.strip() in ("", "---"):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise ValueError("tabs in indentation")
        lines.append([len(line) - len(line.lstrip()), line.strip()])
    if not lines:
        return None

    def is_item(content: str) -> bool:
        return content == "-" or content.startswith("- ")

    def block(i: int, indent: int):
        """The collection whose lines start at ``lines[i]`` with this indent -> (value, next i)."""
        items: list | dict = [] if is_item(lines[i][1]) else {}
        while i < len(lines) and lines[i][0] == indent:
            content = lines[i][1]
            if isinstance(items, list):
                if not is_item(content):
                    break
                rest = content[1:].lstrip()
                if not rest:  # the item is the indented block below
                    if i + 1 < len(lines) and lines[i + 1][0] > indent:
                        value, i = block(i + 1, lines[i + 1][0])
                    else:
                        value, i = None, i + 1
                elif rest[:1] not in "'\"[{" and re.match(r"[^:]*?:(\s|$)", rest):  # "- key: value" opens a mapping
                    lines[i] = [indent + len(content) - len(rest), rest]
                    value, i = block(i, lines[i][0])
                else:
                    value, i = _scalar(rest), i + 1
                items.append(value)
                continue
            if is_item(content):
                raise ValueError(f"a sequence item where a mapping key was expected: {content!r}")
            key, text = _key_value(content)
            value, i = (None if text is None else _scalar(text)), i + 1
            if text is None and i < len(lines) and (
                    lines[i][0] > indent or (lines[i][0] == indent and is_item(lines[i][1]))):
                value, i = block(i, lines[i][0])  # nested block (a sequence may sit at the key's indent)
            items[key] = value
        if i < len(lines) and lines[i][0] > indent:
            raise ValueError(f"unexpected indentation at {lines[i][1]!r}")
        return items, i

    if len(lines) == 1 and not is_item(lines[0][1]) and not re.match(r"[^:]*?:(\s|$)", lines[0][1]):
        return _scalar(lines[0][1])
    value, end = block(0, lines[0][0])
    if end != len(lines):
        raise ValueError(f"unexpected line {lines[end][1]!r}")
    return value
