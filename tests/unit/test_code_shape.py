"""The architecture's checks that import-linter's layer contracts do not make: no import cycle between
glue's modules, counting the imports inside functions too (grimp, import-linter's own graph, reads
every import statement); no product module over 400 lines; and no function over 60 lines or 8
positional parameters (keyword-only options after `*` are a public API's settings, and a click
command's callback takes one parameter per CLI option, so neither counts)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

GLUE = Path(__file__).resolve().parents[2] / "glue"
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PARAMS = 8


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_lazy_imports_included() -> None:
    graph = grimp.build_graph("glue")
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _cycles(edges) == []


def test_no_product_module_over_400_lines() -> None:
    long = {str(p.relative_to(GLUE.parent)): n for p in GLUE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}, f"split these by responsibility: {long}"


def _is_click_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated @click.command/@click.group or @<group>.command(...)/@<group>.group(...)."""
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Attribute) and target.attr in ("command", "group"):
            return True
    return False


def _positional_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)


def _oversized(source: str, path: str) -> list[str]:
    found = []
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for node in sorted(functions, key=lambda n: n.lineno):
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        params = _positional_params(node)
        if lines > MAX_FUNCTION_LINES or (params > MAX_PARAMS and not _is_click_command(node)):
            found.append(f"{path}:{node.lineno} {node.name} ({lines} lines, {params} params)")
    return found


def test_the_shape_check_finds_long_and_wide_functions() -> None:
    wide = "def f(self, a, b, c, d, e, f, g, h, i, *, j=1):\n    pass\n"
    long = "def g():\n" + "    x = 1\n" * 60
    cli = "@app.command('x')\ndef h(a, b, c, d, e, f, g, h, i):\n    pass\n"
    group = "@click.group()\ndef m(a, b, c, d, e, f, g, h, i):\n    pass\n"
    options = "def k(a, b, c, d, e, f, g, h, *, i=1, j=2):\n    pass\n"
    other = "@functools.cache\ndef n(a, b, c, d, e, f, g, h, i):\n    pass\n"
    assert _oversized(wide + long + cli + group + options + other, "m.py") == [
        "m.py:1 f (2 lines, 9 params)", "m.py:3 g (61 lines, 0 params)", "m.py:73 n (2 lines, 9 params)"]


def test_no_function_over_60_lines_or_8_params() -> None:
    found = [v for p in sorted(GLUE.rglob("*.py"))
             for v in _oversized(p.read_text(encoding="utf-8"), str(p.relative_to(GLUE.parent)))]
    assert found == [], "split these into named steps:\n" + "\n".join(found)
