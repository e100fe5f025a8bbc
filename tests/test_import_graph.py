"""maskc's modules import one another without a cycle, counting the imports inside functions too (a lazy import
hides a cycle from Python, not from whoever must change the modules): issue 20. Read from the source with ast."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "maskc"


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The maskc modules ``path`` imports anywhere but under ``if TYPE_CHECKING:`` (``from maskc.x import y``
    counts as importing maskc.x.y where that is a module, else maskc.x; the package maskc itself not)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for stmt in node.body for n in ast.walk(stmt)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "maskc":
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules.keys()
            found |= subs if len(subs) == len(node.names) else subs | {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & modules.keys()
    return found - {"maskc"}


def test_no_import_cycle():
    modules = module_names()
    graph = {name: imports(path, modules) - {name} for name, path in modules.items()}
    state: dict[str, int] = {}              # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path[path.index(dep):] + [name, dep])
            if dep not in state:
                visit(dep, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_the_finder_sees_a_cycle(tmp_path):
    """The test above can fail: a lazy import back into a module's importer is a cycle here."""
    modules = {"maskc.a": tmp_path / "a.py", "maskc.b": tmp_path / "b.py"}
    modules["maskc.a"].write_text("from maskc.b import f\n")
    modules["maskc.b"].write_text("def f():\n    from maskc.a import g\n")
    assert imports(modules["maskc.a"], modules) == {"maskc.b"} and imports(modules["maskc.b"], modules) == {"maskc.a"}


def _constant_ints(node: ast.AST):
    """Every value of a sub-expression of ``node`` built of integer literals and arithmetic alone (``2 ** 31 - 1``)."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.BinOp, ast.UnaryOp)) and all(
                isinstance(n, (ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
                or (isinstance(n, ast.Constant) and type(n.value) is int) for n in ast.walk(sub)):
            yield eval(compile(ast.Expression(sub), "<constant>", "eval"))      # literals and operators only


def int32_copies(path: Path) -> list[str]:
    """The module-level names ``path`` assigns the int32 range's ends (2**31 - 1, -2**31) to, spelled out."""
    ends = {2 ** 31 - 1, -2 ** 31}
    return [ast.unparse(stmt) for stmt in ast.parse(path.read_text()).body
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
            and ends & set(_constant_ints(stmt.value))]


def test_the_int32_range_is_written_once():
    """maskc.analysis.values holds INT32 and INT32_MIN; every other module imports them (a second copy can drift)."""
    copies = {name: found for name, path in module_names().items()
              if name != "maskc.analysis.values" and (found := int32_copies(path))}
    assert not copies, copies


def test_the_int32_finder_sees_a_copy(tmp_path):
    (tmp_path / "m.py").write_text("A, B = -2 ** 31, 2**31 - 1\nC = 2 ** 31 - 2\n\ndef f():\n    D = 2 ** 31 - 1\n")
    assert int32_copies(tmp_path / "m.py") == ["A, B = (-2 ** 31, 2 ** 31 - 1)"]
