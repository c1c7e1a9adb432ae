#!/usr/bin/env python3
"""Import cycles between the workspace's source files.

For every crate under the repository root (a folder with a Cargo.toml and a src/ tree), reads each
.rs file of src/, finds the paths it names (`use` declarations and paths written in code:
`crate::…`, `$crate::…`, `super::…`, `self::…`, and paths through the file's own child modules),
resolves each to the file that defines the item (following `use` and `pub use` re-exports, so that
`crate::Comm` is the file defining `Comm`, not lib.rs), and draws an arrow from the file to that
file. Then it prints every cycle of files (strongly connected components of more than one file),
with the names that tie each arrow of it, and exits 1 when there is one.

    tools/import-cycles.py            # cycles only; exit 0 when none
    tools/import-cycles.py --graph    # also every arrow, file -> file: names

Only the standard library; no build needed. Arrows made by the expansion of another crate's macros,
and names reached only through a glob import, are not seen.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = {"target", ".git", ".deps", "bundle", "node_modules"}

ITEM = re.compile(
    r"\b(?:pub(?:\([^)]*\))?\s+)?(?:unsafe\s+|async\s+|const\s+|extern\s+\"C\"\s+)*"
    r"(?:fn|struct|enum|trait|type|const|static|union|mod)\s+([A-Za-z_]\w*)"
)
MACRO = re.compile(r"macro_rules!\s*([A-Za-z_]\w*)")
PATH = re.compile(r"(?<![\w:])(\$crate|crate|super|self)((?:\s*::\s*(?:super|[A-Za-z_]\w*))+)")


def strip(text):
    """The text with comments, string and char literals blanked (lengths kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = len(re.match(r"r(#*)", text[i:]).group(1))
            end = '"' + "#" * hashes
            j = text.find(end, i + 2 + hashes)
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i : i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\x..|\\.|[^\\'])'", text[i:])
            j = i + (len(m.group(0)) if m else 1)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Module:
    def __init__(self, path, file):
        self.path = path  # tuple of segments below the crate root
        self.file = file
        self.children = {}  # name -> Module (only those with files of their own)
        self.items = set()
        self.imports = {}  # name -> (module, segments) of a `use` that brings it in
        self.text = ""


def module_files(src):
    """(segments, file) for each .rs file under src/."""
    for dirpath, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in SKIP]
        for f in files:
            if not f.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
                parts = parts[:-1]
            yield tuple(parts), os.path.join(dirpath, f)


def expand_use(tree):
    """`a::{b, c::{d, e as f}, self}` -> [(["a","b"], "b"), (["a","c","d"], "d"), (["a","c","e"], "f"), (["a"], "a")]."""
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if "{" in s and s.endswith("}"):
            head, inner = s.split("{", 1)
            head = [p for p in head.split("::") if p]
            for part in split_top(inner[:-1]):
                yield from walk(prefix + head, part)
            return
        alias = None
        if "as" in s and re.search(r"[\w*]as[A-Za-z_]", s):
            s, alias = re.split(r"(?<=[\w*])as(?=[A-Za-z_])", s, maxsplit=1)
        segs = [p for p in s.split("::") if p]
        if segs == ["self"]:
            segs = []
        full = prefix + segs
        if not full:
            return
        yield full, alias or full[-1]

    return list(walk([], tree))


def inline_depths(text):
    """For each offset, how many inline `mod x { … }` blocks enclose it (as a sorted list of spans)."""
    spans, stack = [], []
    for m in re.finditer(r"\bmod\s+[A-Za-z_]\w*\s*\{|[{}]", text):
        tok = m.group(0)
        if tok.startswith("mod"):
            stack.append(("mod", m.end()))
        elif tok == "{":
            stack.append(("brace", m.end()))
        elif stack:
            kind, start = stack.pop()
            if kind == "mod":
                spans.append((start, m.start()))
    return spans


def depth_at(spans, pos):
    return sum(1 for s, e in spans if s <= pos < e)


class Crate:
    def __init__(self, name, src):
        self.name = name
        self.modules = {}
        for segs, file in module_files(src):
            self.modules[segs] = Module(segs, file)
        for segs, mod in self.modules.items():
            if segs:
                parent = self.modules.get(segs[:-1])
                if parent:
                    parent.children[segs[-1]] = mod
        # `#[macro_export]` macros live at the crate root, wherever they are defined.
        self.exported = {}
        for mod in self.modules.values():
            with open(mod.file, encoding="utf-8") as f:
                mod.text = strip(f.read())
            mod.items = set(ITEM.findall(mod.text)) | set(MACRO.findall(mod.text))
            for name in re.findall(r"#\[macro_export\]\s*macro_rules!\s*([A-Za-z_]\w*)", mod.text):
                self.exported[name] = mod.file
            mod.spans = inline_depths(mod.text)
            mod.uses = []  # (offset, segments, alias, re-exported)
            body = re.sub(r"\buse\s+[^;]+;", " ", mod.text)
            for m in re.finditer(r"(\bpub(?:\([^)]*\))?\s+)?\buse\s+([^;]+);", mod.text):
                for full, alias in expand_use(m.group(2)):
                    # A re-export only hands the name on (the module's face): it is an arrow only
                    # where the file also uses the name itself.
                    used = not m.group(1) or re.search(rf"(?<![\w:]){re.escape(alias)}\b", body)
                    if used:
                        mod.uses.append((m.start(), full, alias))
                    if depth_at(mod.spans, m.start()) == 0 and full[-1] != "*":
                        mod.imports[alias] = full

    def start(self, mod, first, inline):
        """The module a path's first segment names, and how many segments it consumed."""
        if first in ("crate", "$crate"):
            return self.modules[()], 1
        if first == "self":
            return mod, 1
        if first == "super":
            return None, 0
        return None, 0

    def resolve(self, mod, segs, inline, seen=None):
        """The file that defines what `segs` names, seen from `mod` (inside `inline` inline mods)."""
        seen = seen or set()
        key = (mod.path, tuple(segs), inline)
        if key in seen:
            return mod.file
        seen.add(key)
        i, cur = 0, mod
        if segs[0] in ("crate", "$crate"):
            cur, i = self.modules[()], 1
        elif segs[0] == "self":
            i = 1
        elif segs[0] == "super":
            while i < len(segs) and segs[i] == "super":
                if inline:
                    inline -= 1
                else:
                    cur = self.modules.get(cur.path[:-1], cur) if cur.path else cur
                i += 1
        elif segs[0] in mod.children and not inline:
            pass
        elif segs[0] in mod.imports and not inline:
            target = mod.imports[segs[0]]
            if target[0] in ("crate", "$crate", "super", "self") or target[0] in mod.children:
                return self.resolve(mod, list(target) + list(segs[1:]), 0, seen)
            return None  # another crate
        else:
            return None  # another crate, std, or a local name
        rest = segs[i:]
        while rest:
            name = rest[0]
            if name in cur.children:
                cur, rest = cur.children[name], rest[1:]
                continue
            if not cur.path and name in self.exported:
                return self.exported[name]
            if name in cur.items or name == "*":
                return cur.file
            if name in cur.imports:
                target = cur.imports[name]
                if target[0] in ("crate", "$crate", "super", "self") or target[0] in cur.children:
                    return self.resolve(cur, list(target) + list(rest[1:]), 0, seen)
                return None
            return cur.file
        return cur.file

    def arrows(self):
        """{(from file, to file): {names}}."""
        out = defaultdict(set)
        for mod in self.modules.values():
            refs = []
            for off, full, _alias in mod.uses:
                refs.append((off, full))
            for m in PATH.finditer(mod.text):
                segs = [m.group(1)] + [s for s in re.split(r"\s*::\s*", m.group(2)) if s]
                refs.append((m.start(), segs))
            for off, segs in refs:
                inline = depth_at(mod.spans, off)
                first = segs[0]
                if first not in ("crate", "$crate", "super", "self"):
                    if inline or (first not in mod.children and first not in mod.imports):
                        continue
                target = self.resolve(mod, segs, inline)
                if target and target != mod.file:
                    out[(mod.file, target)].add(segs[-1])
        return out


def crates(root):
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.startswith("."))
        if "Cargo.toml" in files and os.path.isdir(os.path.join(dirpath, "src")):
            yield os.path.relpath(dirpath, root), os.path.join(dirpath, "src")


def cycles(nodes, edges):
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return sorted(out)


def main():
    show_graph = "--graph" in sys.argv[1:]
    rel = lambda p: os.path.relpath(p, ROOT)
    found = 0
    files = arrows_total = 0
    for name, src in crates(ROOT):
        crate = Crate(name, src)
        arrows = crate.arrows()
        nodes = {m.file for m in crate.modules.values()}
        files += len(nodes)
        arrows_total += len(arrows)
        if show_graph:
            for (a, b), names in sorted(arrows.items()):
                print(f"{rel(a)} -> {rel(b)}: {', '.join(sorted(names))}")
        for comp in cycles(nodes, arrows):
            found += 1
            print(f"cycle of {len(comp)} files in {name}/:")
            members = set(comp)
            for (a, b), names in sorted(arrows.items()):
                if a in members and b in members:
                    print(f"  {rel(a)} -> {rel(b)}: {', '.join(sorted(names))}")
    print(f"{files} files, {arrows_total} arrows, {found} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
