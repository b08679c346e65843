"""One record type per concept: no two classes in different modules of onnxpipe describe the same thing.

Read from the source with ``ast``.  A class's fields are its annotated class attributes (a dataclass's
fields, a NamedTuple's, a typed attribute's); two classes in different modules are twins when they share
:data:`SHARED` or more field names making up :data:`SHARE` of the smaller one's fields.  A twin is a
concept written twice, whose fields drift apart (``kv_cache_bytes`` was once spelled in five places):
one of the two should hold the other, or be it.
"""

from __future__ import annotations

import ast
from itertools import combinations

from paths import REPO_ROOT

PACKAGE = REPO_ROOT / "onnxpipe"
SHARED = 6
SHARE = 0.6


def _pair(a: str, b: str) -> frozenset[str]:
    return frozenset((f"onnxpipe.{a}", f"onnxpipe.{b}"))


KNOWN: dict[frozenset[str], str] = {}
"""Twin pairs still to merge, ``{"module.Class", "module.Class"}`` -> why they are two for now; a pair
that is no longer a twin must leave this list (the test says so), so that it only shrinks."""


def class_fields(tree: ast.Module) -> dict[str, set[str]]:
    """Each top-level class of a module and the names of its annotated class attributes."""
    found: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found[node.name] = {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and not s.target.id.startswith("_")
            }
    return found


def all_classes() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        for name, fields in class_fields(ast.parse(path.read_text(encoding="utf-8"))).items():
            out[f"{module}.{name}"] = fields
    return out


def twins(classes: dict[str, set[str]]) -> dict[frozenset[str], set[str]]:
    """Pairs of classes of different modules sharing :data:`SHARED` or more fields, :data:`SHARE` of the
    smaller one's, and the fields they share."""
    found: dict[frozenset[str], set[str]] = {}
    for (a, fa), (b, fb) in combinations(classes.items(), 2):
        if a.rsplit(".", 1)[0] == b.rsplit(".", 1)[0]:
            continue
        shared = fa & fb
        if len(shared) >= SHARED and len(shared) >= SHARE * min(len(fa), len(fb)):
            found[frozenset((a, b))] = shared
    return found


def test_the_scan_finds_a_twin_it_is_shown() -> None:
    """The scan itself: two classes written in two modules with the same six fields are twins; a
    seventh field in one of them still leaves 6 of 7 shared; other fields are not."""
    one = class_fields(ast.parse("class A:\n a: int\n b: int\n c: int\n d: int\n e: int\n f: int\n"))["A"]
    two = one | {"g"}
    other = {"x", "y", "a", "b", "c", "d", "e"} | {f"z{i}" for i in range(6)}
    found = twins({"m1.A": one, "m2.B": two, "m3.C": other, "m1.D": two})
    assert found == {frozenset(("m1.A", "m2.B")): one, frozenset(("m2.B", "m1.D")): two}


def test_no_two_classes_in_different_modules_are_twins() -> None:
    found = twins(all_classes())
    new = {pair: shared for pair, shared in found.items() if pair not in KNOWN}
    assert not new, "twin records (merge them, one holding the other): " + "; ".join(
        f"{' ~ '.join(sorted(pair))} share {', '.join(sorted(shared))}" for pair, shared in new.items()
    )
    gone = [" ~ ".join(sorted(pair)) for pair in KNOWN if pair not in found]
    assert not gone, f"no longer twins, take them out of KNOWN: {gone}"
