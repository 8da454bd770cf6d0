"""The one way input files are read: bounded, strict YAML.

Profiles, cluster definitions, driver configs and vendor files all come from users, so reading one
must never hang, eat memory or print a traceback, whatever it contains:

- only regular files, at most MAX_BYTES (a symlink to /dev/zero, a FIFO or a directory is refused
  before anything is read, and no more than MAX_BYTES + 1 bytes are ever read);
- UTF-8 text;
- at most MAX_NODES YAML nodes, counting every node an alias repeats (a "billion laughs" document
  is refused after MAX_NODES, instead of being expanded by whoever walks it later);
- at most MAX_DEPTH levels of nesting (the composer recurses per level);
- no duplicate keys in a mapping (YAML says they are an error; PyYAML silently keeps the last one);
- values the safe constructor cannot build (a date like 2024-13-45, an integer of 5000 digits) are
  located errors, not exceptions.

Every refusal is an InvalidInput naming the file, the line when there is one, and the limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from fake_devices.errors import InvalidInput, Problem

MAX_BYTES = 1024 * 1024  # the largest shipped input is a few KiB
MAX_NODES = 100_000  # scalars + collections, alias repeats included
MAX_DEPTH = 64


class _Refused(yaml.YAMLError):
    """A limit of this loader, raised from inside the composer/constructor with a position."""

    def __init__(self, mark, problem: str, allowed: str | None = None):
        super().__init__(problem)
        self.mark, self.problem, self.allowed = mark, problem, allowed


try:  # libyaml's events: the pure-Python scanner takes a second on a line of 1000 `[`
    from yaml._yaml import CParser as _Events
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    class _Events(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):  # type: ignore[no-redef]
        def __init__(self, stream):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)


class _BoundedLoader(yaml.composer.Composer, _Events, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """A safe loader (libyaml events, PyYAML's composer and safe constructor) that counts composed
    nodes (an alias counts its whole subtree) and nesting depth."""

    def __init__(self, stream):
        _Events.__init__(self, stream)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._produced = 0
        self._depth = 0
        self._sizes: dict[str, int] = {}  # anchor -> nodes its subtree counts

    def _count(self, n: int, mark) -> None:
        self._produced += n
        if self._produced > MAX_NODES:
            raise _Refused(mark, f"more than {MAX_NODES} YAML nodes (aliases count every node they repeat)",
                           f"at most {MAX_NODES} nodes; use fewer aliases")

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(event.anchor, 1), event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels", f"at most {MAX_DEPTH} levels")
        before = self._produced
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if getattr(event, "anchor", None):
            self._sizes[event.anchor] = self._produced - before
        return node

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as err:  # e.g. a date 2024-13-45, an int of 5000 digits
            value = node.value if isinstance(node.value, str) else node.tag
            raise _Refused(node.start_mark, f"cannot read {value[:40]!r}: {err}",
                           "a value YAML can build (quote it to make it a string)") from None

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` may be overridden by explicit keys: that is what merging means
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue  # unhashable: the base constructor reports it
                if first is not key_node.start_mark:
                    raise _Refused(key_node.start_mark, f"duplicate key {key!r} (first at line {first.line + 1})",
                                   "each key once per mapping")
        return super().construct_mapping(node, deep=deep)


def _where(mark) -> str:
    return f"line {mark.line + 1}" if mark is not None else "(document)"


def read_text(path: Path, source: str) -> str:
    """The file's text, refusing anything but a regular UTF-8 file of at most MAX_BYTES."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidInput([Problem(source, "(file)", "no such file", "a path to an existing file")]) from None
    except OSError as err:
        raise InvalidInput([Problem(source, "(file)", f"cannot open: {err.strerror or err}",
                                    "a readable regular file")]) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a character device" if stat.S_ISCHR(info.st_mode)
                    else "a block device" if stat.S_ISBLK(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise InvalidInput([Problem(source, "(file)", f"is {kind}", "a regular file")])
        if info.st_size > MAX_BYTES:
            raise InvalidInput([Problem(source, "(file)", f"is {info.st_size} bytes", f"at most {MAX_BYTES} bytes")])
        data = b""
        while len(data) <= MAX_BYTES:  # st_size can lie (files in /proc say 0): read with a bound anyway
            chunk = os.read(fd, MAX_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as err:
        raise InvalidInput([Problem(source, "(file)", f"cannot read: {err.strerror or err}",
                                    "a readable regular file")]) from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise InvalidInput([Problem(source, "(file)", f"is more than {MAX_BYTES} bytes", f"at most {MAX_BYTES} bytes")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise InvalidInput([Problem(source, f"line {line}", f"not UTF-8 text (byte {err.start}: {err.reason})",
                                    "a UTF-8 text file")]) from None


def parse(text: str, source: str) -> Any:
    """One YAML document from text, within the limits above; InvalidInput on anything wrong."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as err:
        raise InvalidInput([Problem(source, _where(err.mark), err.problem, err.allowed)]) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        context = f"{err.context} at line {err.context_mark.line + 1}" if err.context and err.context_mark else err.context
        what = ": ".join(str(part) for part in (context, err.problem) if part)
        if "expected a single document" in what:
            raise InvalidInput([Problem(source, _where(mark), "holds more than one YAML document",
                                        "one document (no second `---`)")]) from None
        raise InvalidInput([Problem(source, _where(mark), f"not valid YAML: {what}",
                                    "YAML syntax with standard tags only")]) from None
    except yaml.reader.ReaderError as err:
        line = text[:err.position].count("\n") + 1
        raise InvalidInput([Problem(source, f"line {line}", f"not valid YAML: character {err.character!r}: {err.reason}",
                                    "printable characters")]) from None
    except yaml.YAMLError as err:
        raise InvalidInput([Problem(source, "(document)", f"not valid YAML: {err}",
                                    "YAML syntax with standard tags only")]) from None
    finally:
        getattr(loader, "dispose", lambda: None)()


def load(path: str | Path, source: str | None = None) -> Any:
    """Read and parse one YAML input file; `source` is how problems name it (default: the path)."""
    source = str(path) if source is None else source
    return parse(read_text(Path(path), source), source)
