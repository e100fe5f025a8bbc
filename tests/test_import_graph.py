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
