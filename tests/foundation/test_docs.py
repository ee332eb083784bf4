"""The documents the repository cites exist, and what docs/ names is in the tree.

Checked by reading files only (no imports of our packages or vLLM):
- every relative Markdown link of a Markdown file points at a file or folder of the repository;
- every `docs/...` path and every `*.md` name cited in a Markdown file, a Python docstring or comment, or a comment
  of a TOML file, shell script or workflow resolves: a path against the citing file's folder or the repository
  root, a bare file name against the citing file's folder, any folder above it, or docs/;
- the repository paths (`packages/...`, `tests/...`, `ascend_core/kv/...`) and dotted module names
  (`ascend_core.kv.planes.planes_of`) a docs/ page names exist, so a page does not outlive a moved module;
- every docs/ page is linked from docs/ARCHITECTURE.md, the page the rest of the tree cites.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Folders that hold no documents of ours: environments, caches, build output, version control.
_SKIP_DIRS = {"__pycache__", "node_modules", "build", "dist"}
_KEEP_DOT_DIRS = {".ci", ".github"}
_COMMENTED = {".toml", ".sh", ".yml", ".yaml", ".cfg", ".ini"}
_SCRIPT_DIRS = {"scripts", ".ci"}  # extensionless shell scripts live here

_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_MD_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_DOCS_PATH = re.compile(r"(?<![\w./-])((?:\.\./)*docs/[\w./-]*[\w/])")
_MD_NAME = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]*\w\.md)(?![\w-])")
# What a docs/ page names: paths (a run holding a slash) and dotted module names of ours.
_PATH_TOKEN = re.compile(r"(?<![\w./<~$*-])((?:[\w.-]+/)+[\w.-]*)")
_FILE_SUFFIXES = (".py", ".toml", ".md", ".cpp", ".yml", ".json")
_FOREIGN = frozenset({"vllm", "torch", "torch_npu", "triton", "op_plugin"})  # upstream paths, not ours
_TOP_FOLDERS = ("packages", "tests", "scripts", "benchmarks", "src", "docs", ".ci", ".github")
_DOTTED = re.compile(r"(?<![\w./-])ascend_[a-z_]+(?:\.[A-Za-z_]\w*)+")


def _walk(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.iterdir()):
        if path.is_dir():
            if path.name in _SKIP_DIRS or path.name.endswith(".egg-info") or \
                    (path.name.startswith(".") and path.name not in _KEEP_DOT_DIRS):
                continue
            yield from _walk(path)
        elif path.is_file():
            yield path


def _files() -> list[Path]:
    return list(_walk(ROOT))


def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file."""
    out: list[tuple[int, str]] = []
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                out.append((token.start[0], token.string))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of `#` comments of a TOML file, shell script or workflow (whole-line or after ` #`)."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#"):
            out.append((number, stripped))
        elif " #" in line:
            out.append((number, line[line.index(" #"):]))
    return out


def _prose(path: Path) -> list[tuple[int, str]]:
    """The parts of `path` that are written for readers, as (first line, text)."""
    suffix = path.suffix
    if suffix not in (".md", ".py", *_COMMENTED) and not (suffix == "" and path.parent.name in _SCRIPT_DIRS):
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return []
    if ".md" not in text and "docs/" not in text and "](" not in text:
        return []  # cites nothing (most files): skip parsing it
    if suffix == ".md":
        return [(1, text)]
    if suffix == ".py":
        return _python_prose(text)
    return _comments(text)


def _inside(path: Path) -> bool:
    try:
        path.resolve().relative_to(ROOT)
    except ValueError:
        return False
    return path.exists()


def _resolves(cited: str, citing: Path) -> bool:
    cited = cited.split("#", 1)[0].split("?", 1)[0].rstrip("/.")
    if not cited:
        return True
    if cited.startswith("/"):
        return _inside(ROOT / cited.lstrip("/"))
    if "/" in cited:
        return _inside(citing.parent / cited) or _inside(ROOT / cited)
    folders = [citing.parent, *[p for p in citing.parent.parents if p == ROOT or ROOT in p.parents], DOCS]
    return any(_inside(folder / cited) for folder in folders)


def _line(text: str, offset: int, first: int) -> int:
    return first + text.count("\n", 0, offset)


def _citations(path: Path) -> Iterator[tuple[int, str]]:
    for first, text in _prose(path):
        text = _URL.sub(lambda m: " " * len(m.group()), text)
        if path.suffix == ".md":
            for m in _MD_LINK.finditer(text):
                target = m.group(1)
                if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("#"):
                    yield _line(text, m.start(), first), target
        for pattern in (_DOCS_PATH, _MD_NAME):
            for m in pattern.finditer(text):
                yield _line(text, m.start(), first), m.group(1)


def dangling_citations() -> list[str]:
    """`file:line: cited` for every cited document that does not exist."""
    out = []
    for path in _files():
        for line, cited in _citations(path):
            if not _resolves(cited, path):
                out.append(f"{path.relative_to(ROOT)}:{line}: {cited}")
    return sorted(set(out))


def _source_roots() -> list[Path]:
    return [*sorted(ROOT.glob("packages/*/src")), ROOT / "src"]


def _path_bases() -> list[Path]:
    """Where a path a docs/ page names may start: the root, packages/, each src/ and each import package in one."""
    roots = _source_roots()
    packages = [p for root in roots for p in sorted(root.iterdir()) if (p / "__init__.py").is_file()]
    return [ROOT, ROOT / "packages", *roots, *packages]


def _named_path(token: str) -> str | None:
    """The repository path a token of a docs/ page names, or None when it names none (`top-k/top-p`, vLLM's paths).

    `dir/`, `dir/file.py` and `dir/module.Name.attr` (-> `dir/module.py`) are paths anywhere; a token without a file
    suffix or trailing slash is one only when it starts at a folder of ours (`src/ascend_vllm/router`)."""
    token = token.rstrip(".,:;")
    first, last = token.split("/", 1)[0], token.rsplit("/", 1)[1]
    if first in _FOREIGN or first in (".", ".."):  # relative links are the link check's
        return None
    if not last or last.endswith(_FILE_SUFFIXES):
        return token
    head, dot, tail = last.partition(".")
    if dot and head.isidentifier() and all(part.isidentifier() for part in tail.split(".")):
        return f"{token.rsplit('/', 1)[0]}/{head}.py"
    if first in _TOP_FOLDERS or first.startswith("ascend_"):
        return token
    return None


def _repo_path_exists(path: str) -> bool:
    return any((base / path.rstrip("/")).exists() for base in _path_bases())


def _module_prefix_exists(dotted: str) -> bool:
    """`ascend_x.mod[.Attr[.attr]]`: the module part exists; at most two trailing names are attributes, one when the
    module part is the top-level package (`ascend_kernels.set_backend`)."""
    parts = dotted.split(".")
    for cut in range(len(parts), max(len(parts) - 3, 0), -1):
        if cut == 1 and len(parts) > 2:
            continue
        relative = Path(*parts[:cut])
        for base in _source_roots():
            if (base / relative).with_suffix(".py").is_file() or (base / relative / "__init__.py").is_file():
                return True
    return False


def missing_repository_names(page: Path, relative_to: Path = ROOT) -> list[str]:
    """`page:line: name` for each repository path or dotted module name `page` names (in prose, code spans and
    diagrams alike) that the tree does not have."""
    text = _URL.sub(lambda m: " " * len(m.group()), page.read_text(encoding="utf-8"))
    where = page.relative_to(relative_to)
    out = []
    for m in _PATH_TOKEN.finditer(text):
        path = _named_path(m.group(1))
        if path is not None and not _repo_path_exists(path):
            out.append(f"{where}:{_line(text, m.start(), 1)}: {m.group(1).rstrip('.,:;')}")
    for m in _DOTTED.finditer(text):
        if not _module_prefix_exists(m.group()):
            out.append(f"{where}:{_line(text, m.start(), 1)}: {m.group()}")
    return out


def test_every_cited_document_exists():
    dangling = dangling_citations()
    assert not dangling, "cited documents that do not exist (fix the citation or write the page under docs/):\n" \
        + "\n".join(dangling)


def test_the_docs_pages_name_only_what_is_in_the_tree():
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ holds no page"
    missing = [entry for page in pages for entry in missing_repository_names(page)]
    assert not missing, "docs/ names paths or modules the tree does not have:\n" + "\n".join(missing)


def test_the_architecture_page_links_every_docs_page():
    architecture = DOCS / "ARCHITECTURE.md"
    assert architecture.is_file()
    links = {m.group(1).split("#", 1)[0] for m in _MD_LINK.finditer(architecture.read_text(encoding="utf-8"))}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p != architecture and p.name not in links]
    assert not unlinked, f"docs/ pages docs/ARCHITECTURE.md does not link: {unlinked}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The patterns find a broken link, a cited docs/ path, a bare .md name and a stale module, and pass real ones."""
    citing = ROOT / "packages" / "ascend-core" / "README.md"
    assert not _resolves("docs/no-such-page.md", citing)
    assert not _resolves("NO-SUCH-PAGE.md", citing)
    assert not _resolves("../../../shared/reference/upstream-vllm-contracts.md", citing)  # outside the tree
    assert _resolves("README.md", ROOT / "packages" / "ascend-specdecode" / "src" / "ascend_specdecode" / "x.py")
    assert _resolves("../ascend-kernels", citing)
    sample = tmp_path / "sample.md"
    sample.write_text("[a](missing.md) [b](https://example.com/docs/x.md) see docs/gone.md and `docs/`\n")
    # the link, then the docs/ path, then the .md names; a URL and the bare folder `docs/` cite nothing
    assert [c for _, c in _citations(sample)] == ["missing.md", "docs/gone.md", "missing.md", "docs/gone.md"]
    assert not _module_prefix_exists("ascend_core.no_such_module.thing")
    assert _module_prefix_exists("ascend_core.kv.planes.planes_of")
    page = tmp_path / "page.md"
    page.write_text("p2p/agent.MooncakeAgent, worker/no_such.py, top-k/top-p, vllm/v1/worker/gpu/, "
                    "src/ascend_vllm/no_router and ascend_core.kv_gone.allocator.allocate\n")
    assert [e.split(": ", 1)[1] for e in missing_repository_names(page, relative_to=tmp_path)] == [
        "worker/no_such.py", "src/ascend_vllm/no_router", "ascend_core.kv_gone.allocator.allocate"]


def test_the_kv_transfer_docstring_names_every_registered_connector():
    """`ascend_kv_transfer`'s docstring lists what `registration.CONNECTORS` registers (read with ast, no import)."""
    package = ROOT / "packages" / "ascend-kv-transfer" / "src" / "ascend_kv_transfer"
    tree = ast.parse((package / "registration.py").read_text(encoding="utf-8"))
    table = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign | ast.Assign)
                 and "CONNECTORS" in {t.id for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                                      if isinstance(t, ast.Name)})
    registered = {key.value for key in table.keys}
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    named = set(re.findall(r"`(Ascend\w+Connector)`", docstring))
    assert registered and named == registered, f"registered {sorted(registered)}, the docstring names {sorted(named)}"
