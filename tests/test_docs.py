"""The documentation stays true to the tree: every relative link in README.md, BENCHMARKS.md and
docs/ resolves (file and anchor), every path of the repository they name exists, the
environment-variable table is what rdmadev/config.py says, and README and BENCHMARKS.md give the
same headline rows. Pure text: no TensorFlow, no network, well under a second.

`mkdocs build --strict` (the `docs` extra) checks the site's links again as mkdocs renders them.
"""
import collections
import glob
import importlib.util
import os
import re
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

#: The top-level folders whose paths the docs name (`rdmadev/cluster/liveness.py`,
#: `tests/test_tf_ops.py::test_x`, `python benchmarks/cnn.py --profile`, ...).
TREE_DIRS = ("rdmadev", "graph_pass", "_native", "tests", "benchmarks", "examples", "docs", ".ci")

#: Paths the benchmark history names that are not in the tree, by design: each with why. The
#: test checks they are still absent, so an entry cannot outlive its reason.
NOT_IN_TREE = {
    "benchmarks/cond_step.py": "the conditional benchmark's name until it became control_flow.py",
    "examples/train_ps.py": "the in-graph example's name until it became train_in_graph.py",
    "benchmarks/scripts/tf_cnn_benchmarks": "tensorflow/benchmarks, cloned separately (not shipped)",
}

_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_PATH = re.compile(r"(?<![\w./~-])((?:%s)/[\w./{},*<>+-]*)" % "|".join(re.escape(d) for d in TREE_DIRS))
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def markdown_files():
    """README.md, BENCHMARKS.md and every page under docs/, relative to the repository."""
    pages = sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    return ["README.md", "BENCHMARKS.md"] + [os.path.relpath(p, ROOT) for p in pages]


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _prose(text):
    """The text without fenced code blocks and inline code: where links are links."""
    text = _FENCE.sub("", text)
    return _INLINE_CODE.sub("", text)


def _heading_text(raw):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # a link's text
    return text.replace("`", "").replace("*", "")


def _slug_mkdocs(text):
    """Python-Markdown's toc slugify, which mkdocs uses."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _slug_github(text):
    """GitHub's anchor for a heading (README.md and BENCHMARKS.md are read there)."""
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(rel):
    """Every anchor a heading of `rel` gets, under mkdocs' and GitHub's rules, repeats numbered."""
    found, seen = set(), collections.Counter()
    for _, raw in _HEADING.findall(_FENCE.sub("", _read(rel))):
        text = _heading_text(raw)
        for slug, sep in ((_slug_mkdocs(text), "_"), (_slug_github(text), "-")):
            n = seen[(slug, sep)]
            found.add(slug if n == 0 else f"{slug}{sep}{n}")
            seen[(slug, sep)] += 1
    return found


def broken_links(rel):
    """(link, why) for each relative link of `rel` that does not resolve."""
    problems = []
    base = os.path.dirname(os.path.join(ROOT, rel))
    for target in _LINK.findall(_prose(_read(rel))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, rel)
        if os.path.relpath(full, ROOT).split(os.sep)[0] == "..":
            problems.append((target, "points outside the repository"))
        elif not os.path.exists(full):
            problems.append((target, "no such file"))
        elif anchor and full.endswith(".md") and anchor not in anchors(os.path.relpath(full, ROOT)):
            problems.append((target, f"no heading gives the anchor #{anchor}"))
    return problems


def _expand(path):
    """`a/{b,c}.md` -> ['a/b.md', 'a/c.md'] (one brace group, as the docs write them)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [path[:m.start()] + alt + path[m.end():] for alt in m.group(1).split(",")]


def _code(text):
    """The text of `text`'s code: fenced blocks and inline code spans."""
    blocks = [m.group(0) for m in _FENCE.finditer(text)]
    spans = [m.group(2) for m in _INLINE_CODE.finditer(_FENCE.sub("", text))]
    return "\n".join(blocks + spans)


def code_references(rel):
    """The repository paths `rel` names: in code (inline or blocks) any path under TREE_DIRS, in
    prose a path with a file extension (prose says "examples/sec" and "rdmadev/gRPC" too).
    Patterns (`cnn_<model>_w2.png`, `results/*.tmp`) and build products (`*.so`) are left out."""
    text = _read(rel)
    tokens = _PATH.findall(_code(text))
    tokens += [t for t in _PATH.findall(_prose(text)) if re.search(r"\.\w+$", t.rstrip(".,;:)"))]
    refs = set()
    for token in tokens:
        token = token.rstrip(".,;:)")
        if any(c in token for c in "*<>"):
            continue
        for path in _expand(token):
            path = path.rstrip("/")
            if path.endswith(".so") or not path:
                continue
            refs.add(path)
    return refs


def _exists(path):
    """A file or folder of the tree; a name ending in _ or - (a --prefix) must begin some."""
    full = os.path.join(ROOT, path)
    return os.path.exists(full) or (path[-1] in "_-" and bool(glob.glob(glob.escape(full) + "*")))


def _env_table():
    spec = importlib.util.spec_from_file_location("env_table", os.path.join(DOCS, "tools", "env_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table_rows(text, heading):
    """The rows of the first table after `heading`, as lists of stripped cells."""
    section = text.split(heading, 1)[1]
    rows = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]


def test_every_relative_link_resolves():
    problems = {rel: broken_links(rel) for rel in markdown_files()}
    assert not {k: v for k, v in problems.items() if v}


def test_every_path_named_exists():
    missing = {}
    for rel in markdown_files():
        gone = sorted(p for p in code_references(rel)
                      if p not in NOT_IN_TREE and not _exists(p))
        if gone:
            missing[rel] = gone
    assert not missing, (
        "paths named in the docs that are not in the tree (a file moved? update the docs, or, "
        f"for a historical name, NOT_IN_TREE with the reason): {missing}")


def test_historical_names_are_still_absent():
    present = [p for p in NOT_IN_TREE if os.path.exists(os.path.join(ROOT, p))]
    assert not present, f"these exist again: drop them from NOT_IN_TREE: {present}"


def test_environment_variable_table_is_generated_from_config():
    env_table = _env_table()
    rows = env_table.variables()
    page = _read(os.path.relpath(env_table.PAGE, ROOT))
    assert env_table.render(page, rows) == page, \
        "docs/operating/configuration.md is stale: run python docs/tools/env_table.py"
    names = re.findall(r"^\| `(RDMADEV_\w+)` \|", page, re.M)
    assert names == [name for name, _, _ in rows] and len(set(names)) == len(names)


def test_no_other_page_keeps_a_table_of_environment_variables():
    # One table: any other page's row of an RDMADEV_ variable with a default is a second copy.
    for rel in markdown_files():
        if rel != "docs/operating/configuration.md":
            assert not re.search(r"^\| `RDMADEV_\w+` \| `", _read(rel), re.M), rel


def test_readme_is_short_and_its_headline_rows_are_benchmarks_md_s():
    readme, bench = _read("README.md"), _read("BENCHMARKS.md")
    assert len(readme.splitlines()) < 250
    assert "docs/img/data_path.png" in readme
    unlink = lambda cell: re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell)  # noqa: E731
    footless = lambda cell: re.sub(r"\s*\[\d\]$", "", cell)  # noqa: E731
    readme_rows = _table_rows(readme, "## Results")
    # BENCHMARKS.md: workload, gRPC, rdmadev, no network, ratio, fraction, spread, date, commit
    bench_rows = [[unlink(r[0]), *r[1:6], r[8]] for r in _table_rows(bench, "## Headline")]
    assert 0 < len(readme_rows) <= 8
    assert [[footless(c) for c in r] for r in readme_rows] == \
        [[footless(c) for c in r] for r in bench_rows]


def test_every_docs_page_is_in_the_site_navigation():
    nav = set(re.findall(r":\s*(\S+\.md)\s*$", _read("mkdocs.yml"), re.M))
    pages = {os.path.relpath(p, DOCS) for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True)}
    assert pages == nav


def test_the_checker_finds_what_it_should():
    # The link and path checkers themselves, on text known to be broken.
    assert _slug_mkdocs("Keras `fit` with steps_per_execution (2026-11-27)".replace("`", "")) == \
        "keras-fit-with-steps_per_execution-2026-11-27"
    assert _slug_github("TF's plugin: cost") == "tfs-plugin-cost"
    assert _PATH.findall("see `tests/test_x.py::test_y`, python benchmarks/cnn.py --profile") == \
        ["tests/test_x.py", "benchmarks/cnn.py"]
    assert _expand("benchmarks/results/cnn_results.{csv,json}") == \
        ["benchmarks/results/cnn_results.csv", "benchmarks/results/cnn_results.json"]
    assert _LINK.findall("a [b](c.md#d) and ![e](f.png) and [g](https://h)") == ["c.md#d", "f.png", "https://h"]
