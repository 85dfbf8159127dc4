"""The applications use the libraries' public names only (issue 35): no module of
msgq/apps, visionipc/apps or visionipc/bench imports a private module of msgq or
visionipc (``msgq._printable``, ``visionipc._streams``, ...); what they need is public
(``msgq.tooling``, ``visionipc.streams``, ``visionipc.optional``)."""

import ast

from repo import ROOT

APPS = ("msgq/apps", "visionipc/apps", "visionipc/bench")


def _private_imports(path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(tuple(f"{folder.replace('/', '.')}." for folder in APPS)):
                continue  # the applications' own modules (visionipc.apps._cli, ...)
            parts = name.split(".")
            if parts[0] in ("msgq", "visionipc") and any(p.startswith("_") and p != "__version__" for p in parts[1:]):
                yield node.lineno, name


def test_no_application_imports_a_private_module_of_the_libraries():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for folder in APPS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line, name in _private_imports(path)
    ]
    assert found == []


def test_the_check_sees_a_private_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from msgq._printable import printable\nfrom msgq import _msgq\nimport visionipc._streams\n")
    assert [name for _, name in _private_imports(sample)] == ["msgq._printable", "msgq._printable.printable",
                                                              "msgq._msgq", "visionipc._streams"]  # fmt: skip


EXTENSIONS = {"msgq._msgq", "msgq._queues", "visionipc._visionipc"}


def _module_graph(lazy=False):
    """module -> the project's modules it imports at module level (``from pkg import sub``
    counts as importing ``pkg.sub``; imports inside functions are lazy by design), and
    with ``lazy`` those inside functions too."""
    mods = {}
    for top in ("msgq", "visionipc"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in mods.items():
        deps = set()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree) if lazy else tree.body:
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                if all(s in mods or s in EXTENSIONS for s in subs):
                    deps.update(s for s in subs if s in mods)
                elif node.module in mods:
                    deps.add(node.module)
        graph[name] = deps - {name}
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_the_python_modules():
    graph = _module_graph()
    assert len(graph) > 100 and "visionipc.apps.record.codecs" in graph
    assert _cycles(graph) == []


# An import inside a function hides a cycle from the interpreter, not from a reader: within the
# recorder's modules those count too (PyAV's frames in av_frames.py, used by the Matroska and MCAP
# containers alike; a stream's storage chosen in storage.py, above codecs.py).
RECORD = "visionipc.apps.record."


def test_the_recorders_modules_form_no_cycle_even_through_lazy_imports():
    graph = {m: {d for d in deps if d.startswith(RECORD)} for m, deps in _module_graph(lazy=True).items()}
    assert RECORD + "replay" in graph and RECORD + "ros2bag" in graph
    assert _cycles({m: deps for m, deps in graph.items() if m.startswith(RECORD)}) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Facts written once (issue 35): a recording's file names are visionipc.apps.record.layout's, and
# the Python branches on the format table's descriptors (visionipc.formats: yuv420, planes,
# channels, sample_bytes, the OpenCV/FFmpeg names), never on a pixel format's name.
LAYOUT = "visionipc/apps/record/layout.py"
# (module, name): why it is compared. None now: av_frames.py names FFmpeg's pixel formats
# through the table's av_format (av_frames.NV12, ...).
FORMAT_NAME_ALLOWED: dict = {}


def _python_files():
    for top in ("msgq", "visionipc", "tools"):
        yield from sorted((ROOT / top).rglob("*.py"))


def _str_constants(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for item in node.elts:
            yield from _str_constants(item)


def _manifest_names(tree):
    """Lines that name recording.json as a file (the name, or a path ending in it)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value == "recording.json" or node.value.endswith("/recording.json"):
                yield node.lineno


def _format_name_comparisons(tree, names):
    """(line, name) of every comparison (==, !=, in, not in) with a pixel format's name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                for value in _str_constants(side):
                    if value in names:
                        yield node.lineno, value


def test_recording_json_is_named_by_the_layout_module_only():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _python_files()
        if str(path.relative_to(ROOT)) != LAYOUT
        for line in _manifest_names(ast.parse(path.read_text()))
    ]
    assert found == []


def test_no_module_compares_pixel_format_names():
    from visionipc.formats import FORMAT_TABLE

    names = {f.name for f in FORMAT_TABLE}
    found = []
    for path in _python_files():
        rel = str(path.relative_to(ROOT))
        if rel == "visionipc/formats.py":  # the table's own module
            continue
        for line, name in _format_name_comparisons(ast.parse(path.read_text()), names):
            if (rel, name) not in FORMAT_NAME_ALLOWED:
                found.append(f"{rel}:{line}: {name!r}")
    assert found == []


def test_the_checks_see_a_name():
    tree = ast.parse(
        'if fmt in ("nv12", "i420"): pass\nif fmt != "raw16": pass\nfmt = "nv12"\n'
        'p = os.path.join(d, "recording.json")\nq = "rec/recording.json"\nmsg = "no recording.json here"\n'
    )
    assert list(_format_name_comparisons(tree, {"nv12", "i420", "raw16"})) == [(1, "nv12"), (1, "i420"), (2, "raw16")]
    assert sorted(_manifest_names(tree)) == [4, 5]


# Other programs' names of what the recorder stores (FFmpeg's encoders and decoders, Foxglove's
# video formats, ROS image encodings) are visionipc/apps/record/vocabulary.py's, FFmpeg's pixel
# formats the format table's (av_format); names that are also a codec's or a pixel format's
# (h264, rgb8...) are those and may be written where they are meant.
VOCABULARY = "visionipc/apps/record/vocabulary.py"


def _foreign_names():
    from visionipc.apps.record.vocabulary import CODECS, ROS_ENCODING, ROS_ENCODING_ALIASES
    from visionipc.formats import FORMAT_TABLE

    names = {spec.encoder for spec in CODECS.values()} | {f.av_format for f in FORMAT_TABLE}
    names |= {name for spec in CODECS.values() for name in (spec.foxglove, spec.mcap_decoder) if name}
    names |= set(ROS_ENCODING.values()) | set(ROS_ENCODING_ALIASES)
    ours = set(CODECS) | {f.name for f in FORMAT_TABLE} | {a for f in FORMAT_TABLE for a in f.aliases}
    return names - ours - {"gray"}  # gray: FFmpeg's and pixels.GRAY, the stored kind


def test_codec_and_encoding_names_are_written_in_the_vocabulary_only():
    names = _foreign_names()
    assert {"libx264", "h265", "libdav1d", "mono8", "8UC1", "yuv420p", "gray16le"} <= names
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for top in ("msgq", "visionipc")
        for path in sorted((ROOT / top).rglob("*.py"))
        if str(path.relative_to(ROOT)) != VOCABULARY
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]
    assert found == []
